# Shared part of slurmtf's batch scripts (jobs/*.sbatch, and the jobs `slurmtf submit`
# writes): sourced, never run. It sets up the run folders, binds GPUs, starts the tasks
# with srun and decides what happens when they end:
#
#   all tasks exit 0                    -> the job ends COMPLETED
#   preempted (exit 75 after a save)    -> requeue (same job id), resume from the checkpoint
#   a rank died, a peer was lost, a     -> restart in place: a new srun step in the same
#   stall was detected, a node is gone     allocation resumes from the last complete
#                                          checkpoint; a node that stopped answering is
#                                          left out (srun --exclude), its place taken by a
#                                          spare (SPARE_NODES=K: the first N of N+K nodes
#                                          train) or the job goes on with the nodes left
#                                          (MIN_NODES, a --nodes=MIN-MAX range); with
#                                          fewer the job is requeued without it
#   a rank's port held by another       -> restart in place: every attempt listens on
#   process (a port_in_use event)          other ports (the job's base moves by attempt;
#                                          Slurm's reserved ports, below, are new per step)
#   bad flags (exit 2), a model error   -> no retry; the last line says why
#
# The job scripts ask --no-kill, so a node that hangs does not end the allocation. While
# the step runs, the ranks' peer_lost events name the nodes to probe; one that does not
# answer ends the step at once (its srun would wait for it until Slurm's SlurmdTimeout)
# and every later step and probe runs with srun --overlap (Slurm keeps the old step on
# its books while the node hangs). SLURMTF_RESTART_IN_PLACE=0 requeues instead of every
# restart in place (to compare the two).
#
# The decision is Python's (`slurmtf recovery`, slurmtf/runtime/recovery.py). Restarts in
# place and requeues count against one budget: MAX_RESTARTS (default 3; MAX_REQUEUES, its
# former name, is read when MAX_RESTARTS is unset), kept in $LOG_DIR/recovery-<job>.jsonl
# with Slurm's SLURM_RESTART_COUNT, so the budget holds across requeues.
#
# Functions (the batch script calls them in this order):
#   slurmtf_job_setup NAME              REPO, RUN, MODEL_DIR, LOG_DIR, PYTHON, srun_tasks,
#                                       gpu_bind, slurmtf_resv_span (reserved ports)
#   slurmtf_find_model NAME             MODEL: models.NAME in a checkout, else slurmtf_models.NAME
#   slurmtf_job_srun COMMAND...         srun with per-rank logs; sets slurmtf_rc
#   slurmtf_ps_srun COMMAND...          the same for a parameter-server job (below)
#   slurmtf_job_end                     exits with the job's final status (or requeues)

slurmtf_log() { echo "$(date -Is) slurmtf: $*"; }

# How rank R's files are named: $LOG_DIR/${slurmtf_rank_prefix}R.out|.err (the job
# scripts), or submitit's $LOG_DIR/<job>_R_log.out|.err (slurmtf_submitit_setup).
slurmtf_rank_prefix=rank
slurmtf_rank_suffix=""
slurmtf_logs_pattern="rank{rank}.{kind}"
slurmtf_rank_file() { printf '%s' "$LOG_DIR/$slurmtf_rank_prefix$1$slurmtf_rank_suffix.$2"; }

slurmtf_job_setup() {
    local name="$1"
    REPO="${SLURMTF_REPO:-${SLURM_SUBMIT_DIR:-$PWD}}"
    RUN="${SLURM_JOB_NAME:-$name}-${SLURM_JOB_ID:-local}"
    MODEL_DIR="${MODEL_DIR:-$REPO/runs/$RUN}"
    LOG_DIR="${LOG_DIR:-$REPO/logs/$RUN}"
    PYTHON="${PYTHON:-python3}"
    export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
    mkdir -p "$MODEL_DIR" "$LOG_DIR"
    slurmtf_restarts="${SLURM_RESTART_COUNT:-0}"  # Slurm's requeues
    slurmtf_budget="${MAX_RESTARTS:-${MAX_REQUEUES:-3}}"
    slurmtf_job_record
    slurmtf_srun_err="$LOG_DIR/srun.err"
    slurmtf_start_attempt
    slurmtf_step_tasks
    slurmtf_resv_setup
    slurmtf_gpu_bind "${slurmtf_tasks_per_node:-${SLURM_NTASKS_PER_NODE:-1}}"
    echo "$(date -Is) job ${SLURM_JOB_ID:-local} restart $slurmtf_attempt of" \
         "$slurmtf_budget: ${SLURM_JOB_NUM_NODES:-1} node(s) ${SLURM_JOB_NODELIST:-}" \
         "x ${slurmtf_tasks_per_node:-${SLURM_NTASKS_PER_NODE:-?}} task(s)," \
         "model_dir $MODEL_DIR, per-rank logs $LOG_DIR"
}

# gpu_bind: Slurm binds each task to its own GPUs (--gpu-bind=per_task:K, Slurm 21.08+)
# unless the job chose a binding itself (--gpus-per-task, --gpu-bind: SLURM_TRES_BIND /
# SLURM_TRES_PER_TASK from Slurm 23.11, SLURM_GPU_BIND / SLURM_GPUS_PER_TASK before);
# the model checks it. Decided in Python (slurmtf.cluster.step_flags).
slurmtf_gpu_bind() {
    gpu_bind=()
    local flags
    if ! flags=$("${PYTHON:-python3}" -m slurmtf.cli step-flags gpu-bind --tasks_per_node="$1"); then
        slurmtf_log "could not decide the step's GPU binding; srun binds none" >&2
        return 0
    fi
    [ -z "$flags" ] || mapfile -t gpu_bind <<<"$flags"
}

# The step's task count. A job submitted with a task count (--ntasks-per-node, -n,
# --ntasks-per-gpu) gets it, as Slurm gave it. A job without one (the job scripts ask
# none, so that a --nodes=MIN-MAX range gets every node Slurm can give: a task count
# fixed at submission caps the nodes at MIN) runs TASKS_PER_NODE tasks on each node it
# got, by default one per GPU (one without GPUs): srun_tasks holds srun's flags.
slurmtf_step_tasks() {
    srun_tasks=()
    slurmtf_tasks_per_node=""
    if [ -n "${SLURM_NTASKS:-}" ]; then
        [ "${slurmtf_train_nodes:-${SLURM_JOB_NUM_NODES:-1}}" != "${SLURM_JOB_NUM_NODES:-1}" ] || return 0
        # A task count and fewer nodes than the job's (spares, a node left out): the same
        # count per node on the nodes the step trains on.
        local fixed="${SLURM_NTASKS_PER_NODE:-$((SLURM_NTASKS / ${SLURM_JOB_NUM_NODES:-1}))}"
        fixed="${fixed%%[(,]*}"  # 2(x3): 2
        slurmtf_tasks_per_node="$fixed"
        srun_tasks=(--nodes="$slurmtf_train_nodes" --ntasks-per-node="$fixed"
                    --ntasks="$((slurmtf_train_nodes * fixed))")
        return 0
    fi
    local gpus="${SLURM_GPUS_ON_NODE:-0}" nodes="${slurmtf_train_nodes:-${SLURM_JOB_NUM_NODES:-1}}"
    [[ "$gpus" =~ ^[0-9]+$ ]] && [ "$gpus" -gt 0 ] || gpus=1
    local per_node="${TASKS_PER_NODE:-$gpus}"
    if ! [[ "$per_node" =~ ^[1-9][0-9]*$ ]]; then
        slurmtf_log "TASKS_PER_NODE='$per_node': not a task count. HINT: TASKS_PER_NODE=1" \
            "(one worker with all the node's GPUs) or leave it unset (one per GPU)" >&2
        exit 2
    fi
    # Slurm gives a job without a task count one CPU per node unless asked for more.
    local cpus="${SLURM_JOB_CPUS_PER_NODE:-}" least need
    least=$(tr ',' '\n' <<<"$cpus" | sed 's/(.*//' | sort -n | head -n 1)
    need=$((per_node * ${SLURM_CPUS_PER_TASK:-1}))
    if [[ "$least" =~ ^[0-9]+$ ]] && [ "$least" -lt "$need" ]; then
        slurmtf_log "$per_node task(s) per node need $need CPUs per node; the job has" \
            "$cpus. HINT: sbatch --mincpus=$need (or --cpus-per-gpu=N), or" \
            "TASKS_PER_NODE=1 for one worker with all the node's GPUs" >&2
        exit 2
    fi
    slurmtf_tasks_per_node="$per_node"
    srun_tasks=(--nodes="$nodes" --ntasks-per-node="$per_node" --ntasks="$((nodes * per_node))")
}

# What a pip user types when $PYTHON lacks slurmtf, its models or TensorFlow.
slurmtf_install_line='pip install "slurmtf[gpu]" (or [cpu]; README, "Install on a cluster")'

# MODEL, the bundled model NAME as a module for `$PYTHON -m`: models.NAME when REPO is a
# checkout (it has slurmtf/job.sh and models/NAME.py; slurmtf_job_setup put it first on
# PYTHONPATH), else the installed slurmtf_models.NAME. Checked here, once, before srun.
slurmtf_find_model() {
    if [ -f "$REPO/slurmtf/job.sh" ] && [ -f "$REPO/models/$1.py" ]; then
        MODEL="models.$1"
    else
        MODEL="slurmtf_models.$1"
    fi
    local found
    if ! found=$("$PYTHON" - "$MODEL" 2>&1 <<'EOF_PY'
import importlib.util
import sys


def origin(name):
    try:
        spec = importlib.util.find_spec(name)
    except ImportError:  # its package is missing
        spec = None
    return spec.origin if spec else None


model = origin(sys.argv[1])
if model is None:
    sys.exit(f"cannot import {sys.argv[1]}")
if origin("tensorflow") is None:
    sys.exit("has no TensorFlow")
print(model)
EOF_PY
    ); then
        slurmtf_log "$PYTHON $found. HINT: $PYTHON -m $slurmtf_install_line," \
            "or SLURMTF_REPO=<a checkout of slurmtf>" >&2
        exit 2
    fi
    echo "$(date -Is) model $MODEL from $found"
}

# slurmtf_attempt: this attempt's number, restarts in place + requeues so far (the job's
# record in LOG_DIR and Slurm's SLURM_RESTART_COUNT); Slurm's count when it cannot be read.
slurmtf_start_attempt() {
    slurmtf_attempt="${slurmtf_restarts:-0}"
    slurmtf_exclude_args=()
    slurmtf_nodes=""
    if [ -n "${SLURMTF_MIN_NODES:-}" ]; then
        slurmtf_log "SLURMTF_MIN_NODES='$SLURMTF_MIN_NODES' is not read. HINT: name the" \
            "fewest nodes to go on with MIN_NODES=$SLURMTF_MIN_NODES" >&2
        exit 2
    fi
    local out rc=0 err="$LOG_DIR/.recovery-start.err"
    out=$("${PYTHON:-python3}" -m slurmtf.cli recovery start --log_dir="$LOG_DIR" \
        --job_id="${SLURM_JOB_ID:-local}" --requeues="${slurmtf_restarts:-0}" \
        --nodes="${SLURM_JOB_NODELIST:-}" --spare_nodes="${SPARE_NODES:-}" \
        --minimum="${MIN_NODES:-}" 2>"$err") || rc=$?
    if [ "$rc" -eq 2 ] && grep -q "HINT" "$err"; then  # SPARE_NODES or MIN_NODES
        sed 's/^slurmtf recovery: //' "$err" >&2
        rm -f "$err"
        exit 2
    fi
    rm -f "$err"
    eval "$out"
    # SPARE_NODES=K: the first step trains on the first N of the N+K nodes, the K idle.
    slurmtf_train_nodes="${SLURM_JOB_NUM_NODES:-1}"
    slurmtf_first_nodes="$slurmtf_nodes"
    if [ -n "$slurmtf_first_nodes" ]; then
        slurmtf_train_nodes=$(tr ',' '\n' <<<"$slurmtf_first_nodes" | grep -c .)
        slurmtf_exclude_args=(--nodelist="$slurmtf_first_nodes")
    fi
}

# Where this attempt's output starts in each log (they are appended to).
slurmtf_snapshot() {
    declare -gA slurmtf_offsets=()
    local f
    for f in "$LOG_DIR/$slurmtf_rank_prefix"* "${slurmtf_srun_err:-$LOG_DIR/srun.err}"; do
        [ -e "$f" ] && slurmtf_offsets["$f"]=$(stat -c %s "$f")
    done
    return 0
}

# One line per job in the user's record ($XDG_STATE_HOME/slurmtf/jobs.jsonl), so that
# `slurmtf status|logs JOB` find the logs from any directory once Slurm forgot the job.
slurmtf_job_record() {
    [ -n "${SLURM_JOB_ID:-}" ] || return 0
    [ "$slurmtf_restarts" = "0" ] || return 0
    local dir="${XDG_STATE_HOME:-$HOME/.local/state}/slurmtf"
    mkdir -p "$dir" 2>/dev/null || return 0
    local line
    line=$(printf '{"job_id": "%s", "log_dir": "%s", "logs": "%s", "name": "%s", "time": %s}' \
        "$SLURM_JOB_ID" "$(slurmtf_json_escape "$LOG_DIR")" "$slurmtf_logs_pattern" \
        "$(slurmtf_json_escape "${SLURM_JOB_NAME:-}")" "$(date +%s)")
    # One write of one short line to a file opened for appending is atomic.
    printf '%s\n' "$line" >> "$dir/jobs.jsonl" 2>/dev/null || true
    # Bounded like slurmtf.monitor.records: past 1 MiB keep the newest half (atomic rename).
    if [ "$(stat -c %s "$dir/jobs.jsonl" 2>/dev/null || echo 0)" -gt 1048576 ]; then
        tail -c 524288 "$dir/jobs.jsonl" | tail -n +2 > "$dir/.jobs.jsonl.$$" \
            && mv "$dir/.jobs.jsonl.$$" "$dir/jobs.jsonl"
    fi
    if [ "$slurmtf_rank_prefix" = rank ]; then
        scontrol update JobId="$SLURM_JOB_ID" Comment="slurmtf:$LOG_DIR" >/dev/null 2>&1 || true
    fi
}

slurmtf_json_escape() {
    local s="${1//\\/\\\\}"
    s="${s//\"/\\\"}"
    printf '%s' "${s//$'\n'/\\n}"
}

# The training step, kept in slurmtf_step to be run again in the same allocation.
slurmtf_job_srun() {
    slurmtf_step=(slurmtf_srun_ranks "$@")
    slurmtf_run_step
}

slurmtf_srun_ranks() {
    slurmtf_resv_args "${srun_tasks[@]}" "${slurmtf_exclude_args[@]}"
    command srun --kill-on-bad-exit="${slurmtf_kill_on_bad_exit:-1}" --open-mode=append \
        "${srun_tasks[@]}" "${slurmtf_exclude_args[@]}" "${gpu_bind[@]}" "${slurmtf_resv[@]}" \
         --output="$LOG_DIR/rank%t.out" --error="$LOG_DIR/rank%t.err" \
         "$@" 2> >(tee -a "${slurmtf_srun_err:-$LOG_DIR/srun.err}" >&2)
    local rc=$?
    wait  # for tee
    return "$rc"
}

# One attempt of the step: the ranks see its number as SLURM_RESTART_COUNT (restarts in
# place + requeues), so their events and checkpoints name it. The step runs in the
# background while slurmtf_watch looks for a node that stopped answering. Sets slurmtf_rc,
# and slurmtf_lost: the silent nodes for which the watch ended the step.
slurmtf_run_step() {
    [ "${slurmtf_attempt:-0}" -eq 0 ] || export SLURM_RESTART_COUNT="$slurmtf_attempt"
    slurmtf_snapshot
    slurmtf_lost=""
    ( trap - EXIT; "${slurmtf_step[@]}" ) &
    local pid=$!
    slurmtf_watch "$pid"
    wait "$pid"
    slurmtf_rc=$?
    echo "$(date -Is) srun exited $slurmtf_rc"
}

# While the step (subshell PID $1) runs: when a rank's new output has a `peer_lost` event,
# `slurmtf recovery watch` probes the nodes the ranks say they lost (srun --overlap, at
# most SLURMTF_NODE_PROBE_S s) and names those that do not answer (slurmtf_lost). The step
# then ends at once: under --no-kill its srun would wait for a hung node until Slurm's
# SlurmdTimeout. SLURMTF_NODE_WATCH=0 turns the watch off.
slurmtf_watch() {
    local pid="$1" f size
    slurmtf_alive=""
    [ "${SLURMTF_NODE_WATCH:-1}" = "1" ] && [ -n "${SLURM_JOB_ID:-}" ] || return 0
    declare -A seen=()
    for f in "${!slurmtf_offsets[@]}"; do seen["$f"]="${slurmtf_offsets[$f]}"; done
    while kill -0 "$pid" 2>/dev/null; do
        sleep "${SLURMTF_NODE_WATCH_S:-1}"
        local news=0
        for f in "$LOG_DIR/$slurmtf_rank_prefix"*"$slurmtf_rank_suffix.out"; do
            [ -e "$f" ] || continue
            size=$(stat -c %s "$f")
            [ "$size" = "${seen[$f]:-0}" ] && continue
            tail -c +"$(( ${seen[$f]:-0} + 1 ))" "$f" | grep -q '"event": "peer_lost"' && news=1
            seen["$f"]="$size"
        done
        [ "$news" -eq 1 ] || continue
        slurmtf_recovery watch --probed="$slurmtf_alive" || continue
        slurmtf_alive="$slurmtf_probed"
        [ -n "$slurmtf_lost" ] || continue
        slurmtf_log "node(s) $slurmtf_lost stopped answering: ending the step without" \
            "waiting for Slurm (SlurmdTimeout)" >&2
        slurmtf_end_step "$pid"
        return 0
    done
}

# Ends the step of subshell PID $1: `scancel` of the job's steps (batch and extern aside)
# kills the tasks on the healthy nodes; the step's srun gets SIGKILL, as it would wait
# for the silent node's step daemon.
slurmtf_end_step() {
    local steps
    steps=$(squeue -h -s -j "$SLURM_JOB_ID" -o %i 2>/dev/null | grep -v -e '\.batch$' -e '\.extern$')
    # shellcheck disable=SC2086  # one word per step
    [ -z "$steps" ] || { scancel $steps >/dev/null 2>&1 & }
    pkill -KILL -P "$1" -x srun 2>/dev/null || kill -KILL "$1" 2>/dev/null
    return 0
}

# A ParameterServerStrategy job (jobs/parameter_server.sbatch): the chief's script
# decides. A task that fails does not stop the others (--kill-on-bad-exit=0): a worker
# killed by a signal is tolerated, as TensorFlow's ClusterCoordinator runs its functions
# on the other workers (their `serving` events say they are workers); when the chief's
# script ends, however it ends, the servers stop by themselves (slurmtf serve). A ps or
# chief killed or crashed restarts the step in place, as for any rank.
# In a heterogeneous job the step spans every component (srun --het-group=0-N).
slurmtf_ps_srun() {
    local het=()
    if [[ "${SLURM_HET_SIZE:-}" =~ ^[0-9]+$ ]] && [ "$SLURM_HET_SIZE" -gt 1 ]; then
        het=(--het-group="0-$((SLURM_HET_SIZE - 1))")
        # Each component's own task count (Slurm 26.05's srun would give a component
        # without one component 0's): slurmtf.cluster.step_flags.het_task_counts.
        local count
        while IFS= read -r count; do
            [ -z "$count" ] || export "${count?}"
        done < <("${PYTHON:-python3}" -m slurmtf.cli step-flags het-tasks)
    fi
    slurmtf_kill_on_bad_exit=0
    slurmtf_job_srun "${het[@]}" "$@"
}

# What follows a step is decided in Python (`slurmtf recovery decide`, slurmtf.runtime.
# recovery) from srun's status and messages and the ranks' event lines of this attempt;
# it prints shell assignments: slurmtf_action (done|restart|requeue|stop), slurmtf_line
# (the job log's line), slurmtf_status, slurmtf_exclude, slurmtf_next_restart, slurmtf_note.
slurmtf_decide() {
    slurmtf_recovery decide --status="${slurmtf_rc:-0}" --max_restarts="${slurmtf_budget:-0}" \
        --dead="${slurmtf_lost:-}" --probed="${slurmtf_alive:-}" --python="${PYTHON:-python3}" \
        --in_place="${SLURMTF_RESTART_IN_PLACE:-1}" "$@"
}

# `slurmtf recovery COMMAND` on this attempt's logs (from the offsets slurmtf_snapshot
# noted) and the job's nodes; evals the shell assignments it prints.
slurmtf_recovery() {
    local args=() f out
    for f in "${!slurmtf_offsets[@]}"; do args+=(--offset="$f=${slurmtf_offsets[$f]}"); done
    out=$("${PYTHON:-python3}" -m slurmtf.cli recovery "$1" --log_dir="$LOG_DIR" \
        --job_id="${SLURM_JOB_ID:-local}" --requeues="${slurmtf_restarts:-0}" \
        --prefix="$slurmtf_rank_prefix" --suffix="$slurmtf_rank_suffix" \
        --srun_err="${slurmtf_srun_err:-$LOG_DIR/srun.err}" --nodes="${SLURM_JOB_NODELIST:-}" \
        --spare_nodes="${SPARE_NODES:-}" --minimum="${MIN_NODES:-}" \
        --excluded="${slurmtf_exclude:-}" --probe_timeout="${SLURMTF_NODE_PROBE_S:-10}" \
        "${args[@]}" "${@:2}") || return 1
    eval "$out"
}

# The next step's nodes: the allocation without slurmtf_exclude (srun --exclude), pinned
# to the nodes Python chose (slurmtf_nodes: a spare in a lost node's place, or the nodes
# left), with --overlap: a step on a hung node stays on Slurm's books, holding the CPUs
# of every node it ran on, until that node answers again.
slurmtf_place() {
    slurmtf_exclude_args=()
    if [ -z "${slurmtf_exclude:-}" ]; then  # the same nodes: the first N with spares
        [ -z "${slurmtf_first_nodes:-}" ] || slurmtf_exclude_args=(--nodelist="$slurmtf_first_nodes")
        return 0
    fi
    local width="${SLURM_JOB_NUM_NODES:-1}"
    [ -z "${slurmtf_nodes:-}" ] || width=$(tr ',' '\n' <<<"$slurmtf_nodes" | grep -c .)
    slurmtf_train_nodes="$width"
    slurmtf_exclude_args=(--overlap --exclude="$slurmtf_exclude")
    [ -z "${slurmtf_nodes:-}" ] || slurmtf_exclude_args+=(--nodelist="$slurmtf_nodes")
    if [ "${#srun_tasks[@]}" -gt 0 ]; then
        slurmtf_step_tasks
        return 0
    fi
    slurmtf_exclude_args+=(--nodes="$width")
    if [ -n "${SLURM_NTASKS:-}" ]; then  # submitit's job: the job's count per node
        local per="${SLURM_NTASKS_PER_NODE:-$((SLURM_NTASKS / ${SLURM_JOB_NUM_NODES:-1}))}"
        per="${per%%[(,]*}"  # 2(x3): 2
        slurmtf_exclude_args+=(--ntasks="$((width * per))")
    fi
}

# Before requeueing without a node that hangs: wait until Slurm has taken it out of the
# job (at SlurmdTimeout, under --no-kill). Slurm 22.05 gives a job requeued while a hung
# node still holds its old step no generic resources: every srun of it then fails with
# "Invalid generic resource (gres) specification" (measured on the sandbox). Bounded by
# SlurmdTimeout + 60 s.
slurmtf_wait_node_gone() {
    [ -n "${slurmtf_lost:-}" ] || return 0
    local timeout bound start=$SECONDS
    timeout=$(scontrol show config 2>/dev/null | awk '$1 == "SlurmdTimeout" {print $3}')
    [[ "$timeout" =~ ^[0-9]+$ ]] || timeout=300
    bound=$((timeout + 60))
    slurmtf_log "waiting for Slurm to take node(s) $slurmtf_lost out of the job (SlurmdTimeout" \
        "$timeout s) before requeueing"
    while [ $((SECONDS - start)) -lt "$bound" ]; do
        local nodes
        nodes=$(scontrol show hostnames "$(scontrol show job "$SLURM_JOB_ID" \
            | grep -o ' NodeList=[^ ]*' | cut -d= -f2)" 2>/dev/null)
        grep -qxF -f <(tr ',' '\n' <<<"$slurmtf_lost") <<<"$nodes" || return 0
        sleep 2
    done
}

slurmtf_requeue() {
    slurmtf_wait_node_gone
    # `scontrol requeue` ends this script with SIGTERM: finish the update first.
    trap '' TERM
    scontrol requeue "$SLURM_JOB_ID" || { echo "scontrol requeue failed" >&2; return 1; }
    if [ -n "${slurmtf_exclude:-}" ]; then
        local old exclude="$slurmtf_exclude"
        old=$(scontrol show job "$SLURM_JOB_ID" | grep -o "ExcNodeList=[^ ]*" | cut -d= -f2)
        [ -n "$old" ] && [ "$old" != "(null)" ] && exclude="$old,$exclude"
        scontrol update JobId="$SLURM_JOB_ID" ExcNodeList="$exclude" \
            && slurmtf_log "the restarted job avoids node(s) $exclude"
    fi
    return 0
}

# After the step: done (exit 0), a new step in the same allocation (restart in place,
# again until done or stopped), a requeue (exit 0 after `scontrol requeue`), or a stop
# with the last failure's status and line.
slurmtf_job_end() {
    while slurmtf_decide; do
        [ -z "$slurmtf_note" ] || slurmtf_log "$slurmtf_note"
        case "$slurmtf_action" in
            done)
                [ "$slurmtf_why" = completed ] || slurmtf_log "$slurmtf_line"
                slurmtf_unstage
                exit 0 ;;
            restart)
                slurmtf_log "$slurmtf_line"
                slurmtf_attempt="$slurmtf_next_restart"
                slurmtf_place
                slurmtf_run_step ;;
            requeue)
                slurmtf_log "$slurmtf_line"
                slurmtf_requeue && exit 0
                slurmtf_unstage  # not when requeued: a restart on this node reuses the copy
                exit "$slurmtf_status" ;;
            *)
                slurmtf_log "$slurmtf_line" >&2
                slurmtf_unstage
                exit "$slurmtf_status" ;;
        esac
    done
    slurmtf_log "srun exited $slurmtf_rc; ${PYTHON:-python3} -m slurmtf.cli recovery" \
        "could not decide what follows, so no restart. HINT: $slurmtf_install_line" >&2
    [ "$slurmtf_rc" -eq 0 ] && exit 1
    exit "$slurmtf_rc"
}

# CHECK_FIRST=1 (`slurmtf submit --check_first`): before training, `slurmtf check` over
# the job's nodes (docs/CHECK.md). An outlier node (check exit 1) is left out of the
# training step (srun --exclude) while enough nodes remain (MIN_NODES, by default
# all of them), else the job is requeued without it (ExcNodeList); either costs one
# restart of the MAX_RESTARTS budget; with the budget spent the job stops (exit 1) instead
# of training on it. A check that could not run is logged and training goes ahead.
slurmtf_check_first() {
    [ "${CHECK_FIRST:-0}" = "1" ] || return 0
    local py="${PYTHON:-python3}" rc=0 bad
    local json="$LOG_DIR/check-${SLURM_JOB_ID:-local}-${slurmtf_attempt:-0}.json"
    "$py" -m slurmtf.cli check --json="$json" || rc=$?
    [ "$rc" -eq 0 ] && return 0
    if [ "$rc" -ne 1 ] || [ ! -s "$json" ]; then
        slurmtf_log "check_first: the check did not run (exit $rc); training anyway" >&2
        return 0
    fi
    bad=$("$py" -c 'import json, sys
print(",".join(sorted({o["node"] for o in json.load(open(sys.argv[1]))["outliers"]})))' "$json")
    slurmtf_log "check_first: outlier node(s) $bad ($json)" >&2
    if slurmtf_decide --outliers="$bad" && [ "$slurmtf_action" = restart ]; then
        slurmtf_log "$slurmtf_line"
        slurmtf_attempt="$slurmtf_next_restart"
        slurmtf_place
        return 0
    fi
    trap - EXIT
    if [ "${slurmtf_action:-}" = requeue ]; then
        slurmtf_log "$slurmtf_line"
        slurmtf_requeue && exit 0
    fi
    slurmtf_log "${slurmtf_line:-not training on an outlier node}" >&2
    exit 1
}

# For the jobs `slurmtf submit` writes (submitit's script): called from its setup lines,
# before its srun; the decision runs when the script exits.
slurmtf_submitit_setup() {
    LOG_DIR="$1"
    slurmtf_budget="$2"
    PYTHON="${3:-${PYTHON:-python3}}"
    slurmtf_restarts="${SLURM_RESTART_COUNT:-0}"
    slurmtf_rank_prefix="${SLURM_JOB_ID:-local}_"
    slurmtf_rank_suffix="_log"
    slurmtf_logs_pattern="{job}_{rank}_log.{kind}"
    slurmtf_srun_err="$(slurmtf_rank_file 0 err)"  # the batch script's stderr too
    slurmtf_start_attempt  # (`slurmtf submit` records the job itself)
    slurmtf_resv_setup
    export SLURMTF_JOB_SH=1  # slurmtf.launch: on exit 75 this script decides, not rank 0
    # submitit's script runs its step as `srun ... -m submitit.core._submit FOLDER`: this
    # function stands in for that srun, so that the step can run again in place (the same
    # pickled job, the same log files) on the nodes slurmtf_place leaves.
    srun() {
        slurmtf_step=(slurmtf_srun_submitit "$@")
        slurmtf_run_step
        return "$slurmtf_rc"
    }
    trap 'slurmtf_rc=$?; trap - EXIT; slurmtf_job_end' EXIT
}

slurmtf_srun_submitit() {
    slurmtf_resv_args "${slurmtf_exclude_args[@]}"
    command srun "${slurmtf_exclude_args[@]}" "${slurmtf_resv[@]}" "$@"
}

# Slurm's reserved ports (slurmtf.slurm.resv_ports; the same rule): with MpiParams=ports in
# slurm.conf every training step asks srun for one port per rank (--resv-ports=NTASKS),
# reserved on each of its nodes against every other step that reserved ports; the ranks
# listen there (SLURM_STEP_RESV_PORTS). SLURMTF_RESV_PORTS: auto (default: when
# `scontrol show config` says MpiParams=ports), 1 (ask anyway), 0 (never; the ranks then
# take slurmtf's own ports). A step of more ranks than the range holds does not ask (Slurm
# would refuse it) and gets Slurm's own count, one port per local id.
slurmtf_resv_setup() {
    slurmtf_resv_span=0
    local mode="${SLURMTF_RESV_PORTS:-auto}" range
    case "${mode,,}" in
        0|off|no|false) return 0 ;;
        1|on|yes|true|auto|"") ;;
        *) slurmtf_log "SLURMTF_RESV_PORTS='$mode' is not auto, 1 or 0. HINT: leave it unset" \
               "(srun reserves ports where the cluster has MpiParams=ports), or 0 for" \
               "slurmtf's own ports" >&2
           exit 2 ;;
    esac
    range=$(scontrol show config 2>/dev/null | sed -n 's/^MpiParams *=.*ports=\([0-9]*-[0-9]*\).*/\1/p')
    if [[ "$range" =~ ^([0-9]+)-([0-9]+)$ ]] && [ "${BASH_REMATCH[1]}" -gt 0 ]; then
        slurmtf_resv_span=$((BASH_REMATCH[2] - BASH_REMATCH[1] + 1))
    fi
    [[ "${mode,,}" =~ ^(1|on|yes|true)$ ]] && [ "$slurmtf_resv_span" -le 0 ] && slurmtf_resv_span=65535
    return 0
}

# slurmtf_resv: srun's --resv-ports=N for a step of N ranks (the last --ntasks= of the
# arguments, else the job's SLURM_NTASKS, else one per node); none in a heterogeneous job
# (each component would get its own ports, which the other's ranks cannot know).
slurmtf_resv_args() {
    slurmtf_resv=()
    [ "${slurmtf_resv_span:-0}" -gt 0 ] || return 0
    [[ "${SLURM_HET_SIZE:-1}" =~ ^[0-9]+$ ]] && [ "${SLURM_HET_SIZE:-1}" -gt 1 ] && return 0
    local n="" arg
    for arg in "$@"; do [[ "$arg" != --ntasks=* ]] || n="${arg#--ntasks=}"; done
    n="${n:-${SLURM_NTASKS:-${SLURM_JOB_NUM_NODES:-1}}}"
    if [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -gt 0 ] && [ "$n" -le "$slurmtf_resv_span" ]; then
        slurmtf_resv=(--resv-ports="$n")
    fi
    return 0
}

# slurmtf_stage_data DATA_DIR [ARGS...]
# STAGE_DATA=1: before training, each node copies the data set SRC once (one task per
# node) to its local scratch ($STAGE_DIR, $SLURM_TMPDIR or $TMPDIR) and verifies it
# against SRC/MANIFEST.json (`slurmtf data stage`). SRC is the last `--data_dir=DIR` or
# `--data_dir DIR` of ARGS (the model's or script's arguments), else DATA_DIR. The
# models, and scripts started by slurmtf.run, read that copy (SLURMTF_STAGED_DATA=SRC
# turns --data_dir=SRC into it). A bad or missing file, or too little space, is one line
# and exit 2 before training. The copy is removed when the job ends (slurmtf_unstage,
# from slurmtf_job_end) and kept when it is requeued, so that a restart on the same node
# reuses it.
slurmtf_stage_data() {
    [ "${STAGE_DATA:-0}" = "1" ] || return 0
    local src
    src=$(slurmtf_data_source "$@")
    if [ -z "$src" ]; then
        slurmtf_log "STAGE_DATA=1 but no data set to stage. HINT: set DATA_DIR, or pass" \
            "--data_dir=DIR to the model or script, a folder with a MANIFEST.json" >&2
        exit 2
    fi
    [[ "$src" == /* ]] || src="$PWD/$src"
    local nodes="${SLURM_JOB_NUM_NODES:-1}" start=$SECONDS why
    local err="$LOG_DIR/stage-${SLURM_JOB_ID:-local}.err"
    slurmtf_staged_src="$src"
    slurmtf_log "staging $src to the local scratch of $nodes node(s)"
    if ! command srun --nodes="$nodes" --ntasks="$nodes" --ntasks-per-node=1 --kill-on-bad-exit=1 \
            --error="$err" "${PYTHON:-python3}" -m slurmtf.cli data stage "$src"
    then
        why=$(grep -E '^slurmtf data stage: ' "$err" | tail -n 1)
        slurmtf_log "not training: ${why:-staging failed, see $err}" >&2
        slurmtf_unstage
        exit 2
    fi
    slurmtf_log "staged $src on $nodes node(s) in $((SECONDS - start)) s"
    export SLURMTF_STAGED_DATA="$src"
}

# The data set of `slurmtf_data_source DATA_DIR [ARGS...]`: the last --data_dir=DIR or
# --data_dir DIR of ARGS (as absl reads them, up to a `--`), else DATA_DIR.
slurmtf_data_source() {
    local src="${1:-}" arg prev=""
    shift
    for arg in "$@"; do
        [ "$arg" = "--" ] && break
        if [ "$prev" = "--data_dir" ]; then
            src="$arg"
        elif [[ "$arg" == --data_dir=* ]]; then
            src="${arg#--data_dir=}"
        fi
        prev="$arg"
    done
    printf '%s' "$src"
}

# Remove this job's staged copies from every node's scratch (nothing when none).
slurmtf_unstage() {
    [ -n "${slurmtf_staged_src:-}" ] || return 0
    local nodes="${SLURM_JOB_NUM_NODES:-1}"
    command srun --nodes="$nodes" --ntasks="$nodes" --ntasks-per-node=1 --output=/dev/null \
        "${PYTHON:-python3}" -m slurmtf.cli data unstage \
        || slurmtf_log "could not remove the staged copies of $slurmtf_staged_src" >&2
    slurmtf_staged_src=""
}
