# Shared part of slurmtf's batch scripts (jobs/*.sbatch, and the jobs `slurmtf submit`
# writes): sourced, never run. It sets up the run folders, binds GPUs, starts the tasks
# with srun and decides what happens when they end:
#
#   all tasks exit 0                    -> the job ends COMPLETED
#   preempted (exit 75 after a save)    -> requeue (same job id), resume from the checkpoint
#   a rank died, a peer was lost, a     -> requeue and resume from the last complete
#   stall was detected, a node is gone     checkpoint; a node that stopped answering (slurmd
#                                          gone, every process frozen) or whose rank froze
#                                          (heartbeats stopped) is excluded first
#   bad flags (exit 2), a model error   -> no retry; the last line says why
#
# Every requeue, whatever its cause, counts against one budget: MAX_RESTARTS (default 3;
# MAX_REQUEUES, its former name, is read when MAX_RESTARTS is unset), compared with
# Slurm's SLURM_RESTART_COUNT, so the budget holds across restarts.
#
# Functions (the batch script calls them in this order):
#   slurmtf_job_setup NAME              REPO, RUN, MODEL_DIR, LOG_DIR, PYTHON, srun_tasks,
#                                       gpu_bind
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
    slurmtf_restarts="${SLURM_RESTART_COUNT:-0}"
    slurmtf_budget="${MAX_RESTARTS:-${MAX_REQUEUES:-3}}"
    slurmtf_job_record
    slurmtf_srun_err="$LOG_DIR/srun.err"
    slurmtf_snapshot
    slurmtf_step_tasks
    # Slurm binds each task to its own GPUs (--gpu-bind=per_task:K, Slurm 21.08+) unless
    # the job chose a binding itself (--gpus-per-task, --gpu-bind); the model checks it.
    gpu_bind=()
    local per_node="${slurmtf_tasks_per_node:-${SLURM_NTASKS_PER_NODE:-1}}"
    if [ -z "${SLURM_GPU_BIND:-}${SLURM_GPUS_PER_TASK:-}" ] && [[ "$per_node" =~ ^[0-9]+$ ]] \
            && [[ "${SLURM_GPUS_ON_NODE:-0}" =~ ^[0-9]+$ ]] && [ "$per_node" -gt 1 ] \
            && [ "${SLURM_GPUS_ON_NODE:-0}" -ge "$per_node" ]; then
        gpu_bind=(--gpu-bind="per_task:$((SLURM_GPUS_ON_NODE / per_node))")
    fi
    echo "$(date -Is) job ${SLURM_JOB_ID:-local} restart $slurmtf_restarts of" \
         "$slurmtf_budget: ${SLURM_JOB_NUM_NODES:-1} node(s) ${SLURM_JOB_NODELIST:-}" \
         "x ${slurmtf_tasks_per_node:-${SLURM_NTASKS_PER_NODE:-?}} task(s)," \
         "model_dir $MODEL_DIR, per-rank logs $LOG_DIR"
}

# The step's task count. A job submitted with a task count (--ntasks-per-node, -n,
# --ntasks-per-gpu) gets it, as Slurm gave it. A job without one (the job scripts ask
# none, so that a --nodes=MIN-MAX range gets every node Slurm can give: a task count
# fixed at submission caps the nodes at MIN) runs TASKS_PER_NODE tasks on each node it
# got, by default one per GPU (one without GPUs): srun_tasks holds srun's flags.
slurmtf_step_tasks() {
    srun_tasks=()
    slurmtf_tasks_per_node=""
    [ -z "${SLURM_NTASKS:-}" ] || return 0
    local gpus="${SLURM_GPUS_ON_NODE:-0}" nodes="${SLURM_JOB_NUM_NODES:-1}"
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

# A hint for a rank's last error line when it could not import slurmtf, its models or
# TensorFlow: which install step is missing (empty for any other error).
slurmtf_install_hint() {
    local missing
    missing=$(grep -o -m 1 -E "No module named '[A-Za-z_]+" <<<"$1" | sed "s/.*'//")
    case "$missing" in
        slurmtf | slurmtf_models | tensorflow)
            printf ". HINT: %s on the nodes has no %s: %s -m %s" "${PYTHON:-python3}" \
                "$missing" "${PYTHON:-python3}" "$slurmtf_install_line" ;;
        models)
            printf ". HINT: models/ is in a checkout only (SLURMTF_REPO); installed, the %s" \
                "models are slurmtf_models: write the job scripts again (slurmtf job-scripts DIR)" ;;
    esac
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

slurmtf_job_srun() {
    srun --kill-on-bad-exit="${slurmtf_kill_on_bad_exit:-1}" --open-mode=append \
        "${srun_tasks[@]}" "${gpu_bind[@]}" \
         --output="$LOG_DIR/rank%t.out" --error="$LOG_DIR/rank%t.err" \
         "$@" 2> >(tee -a "${slurmtf_srun_err:-$LOG_DIR/srun.err}" >&2)
    slurmtf_rc=$?
    wait  # for tee
    echo "$(date -Is) srun exited $slurmtf_rc"
}

# A ParameterServerStrategy job (jobs/parameter_server.sbatch): the chief's script
# decides. A task that fails does not stop the others (--kill-on-bad-exit=0): a worker
# killed by a signal is tolerated, as TensorFlow's ClusterCoordinator runs its functions
# on the other workers (slurmtf_tolerate_workers); when the chief's script ends, however
# it ends, the servers stop by themselves (slurmtf serve). A ps or chief failure ends the
# chief's script with an error, and slurmtf_job_end requeues the job as for any rank.
# In a heterogeneous job the step spans every component (srun --het-group=0-N).
slurmtf_ps_srun() {
    local het=()
    if [[ "${SLURM_HET_SIZE:-}" =~ ^[0-9]+$ ]] && [ "$SLURM_HET_SIZE" -gt 1 ]; then
        het=(--het-group="0-$((SLURM_HET_SIZE - 1))")
    fi
    slurmtf_kill_on_bad_exit=0 slurmtf_job_srun "${het[@]}" "$@"
}

# Called by slurmtf_job_end (so for `slurmtf submit --jobs` too; in other jobs no task is
# a `slurmtf serve` worker). After a step that did not end with 0, the worker servers
# (their log says `slurmtf serve: worker ...`) that srun reports killed by a signal are
# tolerated: the chief's script ran their work on the other workers. When they are all
# srun reports, the attempt counts as a success; otherwise the attempt is judged by the
# other tasks' endings alone (slurmtf_srun_err then holds just those), so that a chief
# that failed after a worker was killed is judged by its own ending, not the worker's.
slurmtf_tolerate_workers() {
    [ "$slurmtf_rc" -ne 0 ] || return 0
    local line task ranks reason sig rank all_workers tolerated=() others=()
    while IFS= read -r line; do
        task=$(grep -o -m 1 -E "tasks? [0-9][0-9,-]*: " <<<"$line")
        reason="${line#*"$task"}"
        ranks=$(slurmtf_task_ranks "${task%: }")
        sig=$(slurmtf_signal_of "$reason")
        all_workers=1
        for rank in $ranks; do
            slurmtf_new "$(slurmtf_rank_file "$rank" err)" \
                | grep -q "^slurmtf serve: worker [0-9]* serving" || all_workers=0
        done
        if [ -z "$ranks" ] || [ "$all_workers" -eq 0 ] \
                || [[ -z "$sig" || "$sig" == "a signal ("* ]]; then
            others+=("$line")
            continue
        fi
        for rank in $ranks; do tolerated+=("rank $rank ($sig)"); done
    done < <(slurmtf_new "${slurmtf_srun_err:-$LOG_DIR/srun.err}" \
        | grep -E "tasks? [0-9][0-9,-]*: ")
    [ "${#tolerated[@]}" -gt 0 ] || return 0
    local named
    named=$(printf '%s, ' "${tolerated[@]}")
    named="${named%, }"
    if [ "${#others[@]}" -gt 0 ]; then
        slurmtf_log "tolerated the loss of worker $named; judging the attempt by" \
            "the other tasks"
        slurmtf_srun_err="$LOG_DIR/srun-judged.err"
        printf '%s\n' "${others[@]}" >"$slurmtf_srun_err"
        slurmtf_offsets[$slurmtf_srun_err]=0
        return 0
    fi
    slurmtf_log "tolerated the loss of worker $named: the chief's script" \
        "completed without it (ClusterCoordinator ran its work on the other workers)"
    slurmtf_rc=0
}

# The ranks of srun's `task 4`, `tasks 3-4` or `tasks 1,3-4`, one per line.
slurmtf_task_ranks() {
    local list="${1#task}" part
    list="${list#s}"
    for part in ${list//,/ }; do
        if [[ "$part" =~ ^([0-9]+)-([0-9]+)$ ]]; then
            seq "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"
        elif [[ "$part" =~ ^[0-9]+$ ]]; then
            echo "$part"
        fi
    done
}

# What this attempt appended to FILE.
slurmtf_new() {
    local f="$1"
    [ -e "$f" ] || return 0
    tail -c "+$(( ${slurmtf_offsets[$f]:-0} + 1 ))" "$f"
}

# From srun's messages on stdin, its words for the first task that failed (`task 1:
# Killed`); the others were stopped by --kill-on-bad-exit.
slurmtf_first_failure() { grep -m 1 -o -E "tasks? [0-9]+[^:]*: .*"; }

# Exit 75 from srun or from the first task it saw end (the job scripts), or rank 0's own word: the models' and fit's
# `preempted` events, or slurmtf submit's launcher reporting its child's exit 75 (the
# launcher itself exits 0 then, so that srun stops no one).
slurmtf_preempted() {
    [ "$slurmtf_rc" -eq 75 ] && return 0
    # The first task srun saw end exited 75; srun then stopped the others (kill-on-bad-exit).
    slurmtf_new "${slurmtf_srun_err:-$LOG_DIR/srun.err}" | slurmtf_first_failure \
        | grep -q -E ": Exited with exit code 75$" && return 0
    slurmtf_new "$(slurmtf_rank_file 0 out)" | grep -q -E -e '"event": "preempted"' \
        -e '"preempted": true' -e '"event": "exit", "rank": 0, "status": 75[,}]'
}

# The signal that ended a task, from srun's words for it: the signal's own text when the
# task died by it (`Killed`, `Segmentation fault (core dumped)`), or `Exited with exit
# code 128+N` when a launcher between srun and the model (slurmtf submit's) reported it.
# Prints e.g. SIGKILL, or nothing for a task that exited by itself.
slurmtf_signal_of() {
    local reason="$1" code
    case "$reason" in
        "Exited with exit code "*)
            code="${reason##* }"
            if [[ "$code" =~ ^[0-9]+$ ]] && [ "$code" -gt 128 ] && [ "$code" -le 192 ]; then
                printf 'SIG%s' "$(kill -l "$((code - 128))" 2>/dev/null || echo "$((code - 128))")"
            fi ;;
        Killed*) printf SIGKILL ;;
        Terminated*) printf SIGTERM ;;
        Segmentation*) printf SIGSEGV ;;
        Aborted*) printf SIGABRT ;;
        "Bus error"*) printf SIGBUS ;;
        "Floating point"*) printf SIGFPE ;;
        "Illegal instruction"*) printf SIGILL ;;
        Interrupt*) printf SIGINT ;;
        Hangup*) printf SIGHUP ;;
        "User defined signal 1"*) printf SIGUSR1 ;;
        "User defined signal 2"*) printf SIGUSR2 ;;
        *) printf 'a signal (%s)' "$reason" ;;
    esac
}

# The line of a rank's error output that says what went wrong: the last Python exception
# line or slurmtf one-line error (`NAME: ... HINT: ...`), else the last line that is not
# a TensorFlow/absl info or warning line (`W0000 ...`, `... : W tensorflow/...`).
slurmtf_error_line() {
    local text="$1" line
    line=$(grep -E -e '^([A-Za-z_][A-Za-z0-9_]*\.)*[A-Za-z_][A-Za-z0-9_]*(Error|Exception|Exit|Interrupt)(:.*)?$' \
        -e 'HINT: ' <<<"$text" | tail -n 1)
    [ -n "$line" ] || line=$(grep -v -E -e '^[[:space:]]*$' -e '^[IW][0-9]{4} ' \
        -e '^[0-9-]+ [0-9:.]+: [IW] ' -e '^WARNING:' <<<"$text" | tail -n 1)
    [ -n "$line" ] || line=$(grep -v '^[[:space:]]*$' <<<"$text" | tail -n 1)
    printf '%s' "$line"
}

# Sets slurmtf_why (why this attempt failed), slurmtf_retry (1: a restart may fix it)
# and slurmtf_bad_nodes (nodes to avoid next time). srun names the task that failed
# first; the others were stopped by --kill-on-bad-exit and say nothing about the cause.
# What happened decides, not which wrapper reported it: a task ended by a signal (the
# OOM killer's SIGKILL, a segfault), directly or as exit 128+N through a launcher, was
# killed and is retried; exit 2 never is; an exit with the rank's own error is not.
slurmtf_classify() {
    slurmtf_retry=0
    slurmtf_bad_nodes=()
    local srun_text first rank reason text f sig lost=() frozen=0
    local peer="a peer failed, stalled or timed out" stall="no training step finished for"
    srun_text=$(slurmtf_new "${slurmtf_srun_err:-$LOG_DIR/srun.err}")
    if grep -q -E "Exited with exit code 2$" <<<"$srun_text" || [ "$slurmtf_rc" -eq 2 ]; then
        slurmtf_why="bad flags or settings (exit 2): a restart cannot fix them"
        return
    fi
    for f in "$LOG_DIR/$slurmtf_rank_prefix"*"$slurmtf_rank_suffix.err"; do
        [ -e "$f" ] || continue
        text=$(slurmtf_new "$f")
        # "lost rank 1 (node2:12001)": the node of a rank that died, froze or went quiet.
        mapfile -t -O "${#lost[@]}" lost < <(grep -o "lost rank [0-9]* ([^:)]*" <<<"$text" \
            | sed 's/.*(//')
        if grep -v -e "$peer" -e "$stall" <<<"$text" | grep -q -i "heartbeat"; then
            frozen=1  # TensorFlow's coordination service: a task stopped sending heartbeats
        fi
    done
    first=$(slurmtf_first_failure <<<"$srun_text")
    rank=$(slurmtf_task_ranks "${first%%: *}" | head -n 1)
    reason="${first#*: }"
    sig=""
    [ -n "$rank" ] && sig=$(slurmtf_signal_of "$reason")
    if [ -n "$sig" ]; then
        slurmtf_why="rank $rank was killed by $sig"
    elif [ -n "$rank" ]; then
        text=$(slurmtf_new "$(slurmtf_rank_file "$rank" err)")
        if ! grep -q -e "$peer" -e "$stall" <<<"$text"; then
            slurmtf_why="rank $rank failed with its own error (exit code ${reason##* }):"
            slurmtf_why+=" $(slurmtf_error_line "$text")"
            slurmtf_why+=$(slurmtf_install_hint "$text")
            return
        fi
        slurmtf_why="rank $rank lost a peer or saw a stall"
    elif grep -q "Node failure" <<<"$srun_text" || [ "$slurmtf_rc" -ge 128 ]; then
        slurmtf_why="srun exited $slurmtf_rc ($(grep -m 1 -o "Node failure.*" <<<"$srun_text"))"
    else
        slurmtf_why="srun exited $slurmtf_rc without a lost peer, node or killed task"
        return
    fi
    slurmtf_retry=1
    local node
    for node in $(printf '%s\n' "${lost[@]}" | sort -u); do
        if [ "$frozen" = "1" ] || ! slurmtf_node_answers "$node"; then
            slurmtf_bad_nodes+=("$node")
        fi
    done
}

# Whether NODE's slurmd still starts a task of this job (a dead or frozen one does not).
slurmtf_node_answers() {
    timeout -s KILL "${SLURMTF_NODE_PROBE_S:-15}" \
        srun --nodes=1 --ntasks=1 --nodelist="$1" --time=1 --output=/dev/null \
             --error=/dev/null true >/dev/null 2>&1
}

slurmtf_requeue() {
    # `scontrol requeue` ends this script with SIGTERM: finish the update first.
    trap '' TERM
    scontrol requeue "$SLURM_JOB_ID" || { echo "scontrol requeue failed" >&2; return 1; }
    if [ "${#slurmtf_bad_nodes[@]}" -gt 0 ]; then
        local old exclude
        old=$(scontrol show job "$SLURM_JOB_ID" | grep -o "ExcNodeList=[^ ]*" | cut -d= -f2)
        exclude=$(printf '%s\n' "${slurmtf_bad_nodes[@]}" | paste -sd,)
        [ -n "$old" ] && [ "$old" != "(null)" ] && exclude="$old,$exclude"
        scontrol update JobId="$SLURM_JOB_ID" ExcNodeList="$exclude" \
            && slurmtf_log "the restarted job avoids node(s) $exclude"
    fi
    return 0
}

slurmtf_job_end() {
    slurmtf_tolerate_workers
    if [ "$slurmtf_rc" -eq 0 ] && ! slurmtf_preempted; then
        slurmtf_unstage
        exit 0
    fi
    local what status="$slurmtf_rc"
    if slurmtf_preempted; then
        what="preempted after saving a checkpoint"
        slurmtf_why="$what"
        slurmtf_retry=1
        slurmtf_bad_nodes=()
        status=75
    else
        slurmtf_classify
        what="failed: $slurmtf_why"
    fi
    if [ "$slurmtf_retry" = "1" ]; then
        if [ "$slurmtf_restarts" -lt "$slurmtf_budget" ]; then
            slurmtf_log "$what: requeueing job $SLURM_JOB_ID" \
                "(restart $((slurmtf_restarts + 1)) of $slurmtf_budget, MAX_RESTARTS)"
            slurmtf_requeue && exit 0
        else
            slurmtf_log "$what; not requeued: already restarted $slurmtf_restarts" \
                "time(s) (MAX_RESTARTS=$slurmtf_budget)" >&2
        fi
    else
        slurmtf_log "$what; not requeued" >&2
    fi
    [ "$status" -eq 0 ] && status=1
    slurmtf_unstage  # not when requeued above: a restart on this node reuses the copy
    exit "$status"
}

# CHECK_FIRST=1 (`slurmtf submit --check_first`): before training, `slurmtf check` over
# the job's nodes (docs/CHECK.md). An outlier node (check exit 1): the job is requeued
# without it (ExcNodeList), one restart of the MAX_RESTARTS budget; with the budget spent
# it stops (exit 1) instead of training on it. A check that could not run is logged and
# training goes ahead.
slurmtf_check_first() {
    [ "${CHECK_FIRST:-0}" = "1" ] || return 0
    local py="${PYTHON:-python3}" rc=0 bad
    local json="$LOG_DIR/check-${SLURM_JOB_ID:-local}-${slurmtf_restarts:-0}.json"
    "$py" -m slurmtf.cli check --json="$json" || rc=$?
    [ "$rc" -eq 0 ] && return 0
    if [ "$rc" -ne 1 ] || [ ! -s "$json" ]; then
        slurmtf_log "check_first: the check did not run (exit $rc); training anyway" >&2
        return 0
    fi
    bad=$("$py" -c 'import json, sys
print("\n".join(sorted({o["node"] for o in json.load(open(sys.argv[1]))["outliers"]})))' "$json")
    mapfile -t slurmtf_bad_nodes <<< "$bad"
    slurmtf_log "check_first: outlier node(s) $(echo "$bad" | paste -sd,) ($json)" >&2
    trap - EXIT
    if [ "${slurmtf_restarts:-0}" -lt "${slurmtf_budget:-0}" ]; then
        slurmtf_log "requeueing job $SLURM_JOB_ID without them" \
            "(restart $((${slurmtf_restarts:-0} + 1)) of ${slurmtf_budget:-0}, MAX_RESTARTS)"
        slurmtf_requeue && exit 0
    fi
    slurmtf_log "not training on an outlier node (MAX_RESTARTS=${slurmtf_budget:-0} spent)" >&2
    exit 1
}

# For the jobs `slurmtf submit` writes (submitit's script): called from its setup lines,
# before its srun; the decision runs when the script exits.
slurmtf_submitit_setup() {
    LOG_DIR="$1"
    slurmtf_budget="$2"
    slurmtf_restarts="${SLURM_RESTART_COUNT:-0}"
    slurmtf_rank_prefix="${SLURM_JOB_ID:-local}_"
    slurmtf_rank_suffix="_log"
    slurmtf_logs_pattern="{job}_{rank}_log.{kind}"
    slurmtf_srun_err="$(slurmtf_rank_file 0 err)"  # the batch script's stderr too
    slurmtf_snapshot  # (`slurmtf submit` records the job itself)
    export SLURMTF_JOB_SH=1  # slurmtf.launch: on exit 75 this script requeues, not rank 0
    trap 'slurmtf_rc=$?; trap - EXIT; slurmtf_job_end' EXIT
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
    if ! srun --nodes="$nodes" --ntasks="$nodes" --ntasks-per-node=1 --kill-on-bad-exit=1 \
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
    srun --nodes="$nodes" --ntasks="$nodes" --ntasks-per-node=1 --output=/dev/null \
        "${PYTHON:-python3}" -m slurmtf.cli data unstage \
        || slurmtf_log "could not remove the staged copies of $slurmtf_staged_src" >&2
    slurmtf_staged_src=""
}
