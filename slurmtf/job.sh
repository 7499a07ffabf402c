# slurmtf/job.sh: kept for batch scripts of your own that source it. It decides nothing:
# slurmtf_job_srun hands the job to slurmtf's supervisor (`slurmtf job`,
# slurmtf/runtime/job/supervisor.py), which runs the steps, restarts them in place, requeues
# and returns the job's status; slurmtf_job_end exits with it. New scripts hand over in
# one line, as jobs/*.sbatch do:  exec python3 -m slurmtf job command -- COMMAND...
# (docs/ARCHITECTURE.md, "From job.sh to the supervisor").
#
#   slurmtf_job_setup NAME       REPO, RUN, MODEL_DIR, LOG_DIR, PYTHON (exported)
#   slurmtf_find_model NAME      MODEL: models.NAME in a checkout, else slurmtf_models.NAME
#   slurmtf_stage_data DIR ...   STAGE_DATA=1: stage DIR (or the command's --data_dir)
#   slurmtf_check_first          CHECK_FIRST=1: slurmtf check before training
#   slurmtf_job_srun COMMAND...  the supervisor runs COMMAND on every rank; sets slurmtf_rc
#   slurmtf_ps_srun COMMAND...   the same for a parameter-server step (servers)
#   slurmtf_job_end              exits with the job's status
#   slurmtf_submitit_setup DIR N (the jobs older `slurmtf submit` wrote) srun -> supervisor

slurmtf_job_setup() {
    REPO="${SLURMTF_REPO:-${SLURM_SUBMIT_DIR:-$PWD}}"
    RUN="${SLURM_JOB_NAME:-$1}-${SLURM_JOB_ID:-local}"
    MODEL_DIR="${MODEL_DIR:-$REPO/runs/$RUN}"
    LOG_DIR="${LOG_DIR:-$REPO/logs/$RUN}"
    PYTHON="${PYTHON:-python3}"
    export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" MODEL_DIR LOG_DIR PYTHON
    mkdir -p "$MODEL_DIR" "$LOG_DIR"
}

slurmtf_find_model() {
    MODEL="slurmtf_models.$1"
    if [ -f "$REPO/slurmtf/__init__.py" ] && [ -f "$REPO/models/$1.py" ]; then
        MODEL="models.$1"
    fi
}

slurmtf_stage_data() {
    if [ -n "${1:-}" ]; then export DATA_DIR="${DATA_DIR:-$1}"; fi
}

slurmtf_check_first() { export CHECK_FIRST="${CHECK_FIRST:-0}"; }

# The supervisor runs with SLURMTF_PYTHON, else PYTHON. `scontrol requeue` ends this script
# with SIGTERM: the trap lets the supervisor finish first.
slurmtf_supervise() {
    trap : TERM
    ${SLURMTF_PYTHON:-${PYTHON:-python3}} -m slurmtf job command "$@"
    slurmtf_rc=$?
}

slurmtf_job_srun() { slurmtf_supervise -- "$@"; }

slurmtf_ps_srun() { slurmtf_supervise --servers -- "$@"; }

slurmtf_job_end() { exit "${slurmtf_rc:-1}"; }

slurmtf_unstage() { :; }  # the supervisor removes the staged copies itself

slurmtf_submitit_setup() {
    slurmtf_submitit=("${3:-${PYTHON:-python3}}" -m slurmtf job submitit --log_dir="$1"
                      --max_restarts="$2" --)
    srun() { exec "${slurmtf_submitit[@]}" "$@"; }
}
