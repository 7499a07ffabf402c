"""What a person reads: events rendered, the live progress line, stderr filtered."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from slurmtf.monitor import console
from slurmtf.monitor import status as watch
from tests.helpers.fakeslurm import FakeSlurm

CLUSTER = {
    "event": "cluster", "rank": 0, "num_workers": 2, "workers": ["node1:12000", "node2:12001"],
    "strategy": "multi_worker_mirrored", "collective": "ring", "replicas": 2,
    "global_batch": 64, "per_replica_batch": 32, "dtype": "fp32", "synthetic": True,
    "restart_count": 0,
}  # fmt: skip
PROGRESS = {"event": "progress", "step": 50, "total": 250, "loss": 0.25, "accuracy": 0.9,
            "examples_per_sec": 640.0}  # fmt: skip


@pytest.mark.parametrize(
    ("event", "line"),
    [
        (CLUSTER, "rank 0: 2 worker(s) [node1:12000, node2:12001], multi_worker_mirrored "
                  "(ring), 2 replica(s), global batch 64 (32 per replica), fp32, SYNTHETIC data"),
        ({"event": "eval", "step": 46, "epoch": 2.0, "examples": 360, "loss": 0.1,
          "accuracy": 0.97},
         "eval at step 46 (epoch 2.0): loss 0.1000, accuracy 0.9700 on 360 examples"),
        ({"event": "done", "rank": 1, "step": 230, "start_step": 120, "first_loss": 2.3,
          "last_loss": 0.1, "preempted": False},
         "rank 1: done at step 230 (resumed at 120), loss 2.3000 -> 0.1000"),
        ({"event": "done", "rank": 0, "step": 57, "start_step": 0, "preempted": True},
         "rank 0: preempted, checkpoint saved, at step 57, loss ? -> ?"),
        ({"event": "launch", "rank": 0, "node": "node1", "restart_count": 1,
          "params": {"lr": "0.1"}}, "rank 0 started on node1 (restart 1) with lr=0.1"),
        ({"event": "exit", "rank": 0, "status": 75}, "rank 0 exited with status 75"),
        ({"event": "signal", "rank": 1, "signal": "SIGUSR2"}, "rank 1 received SIGUSR2"),
        ({"event": "stalled", "message": "rank 1 stuck"}, "stalled: rank 1 stuck"),
        ({"event": "mystery", "a": 1}, "mystery: a=1"),
    ],
)  # fmt: skip
def test_each_event_reads_as_one_human_line(event: dict[str, object], line: str) -> None:
    assert console.Renderer().line(event) == line


def test_progress_eta_uses_the_global_batch_of_the_cluster_event() -> None:
    renderer = console.Renderer()
    assert renderer.line(PROGRESS).endswith("640.0 examples/s  ETA ?")  # batch not known yet
    renderer.line(CLUSTER)
    # 200 steps x 64 examples / 640 examples/s = 20 s
    assert renderer.line(PROGRESS) == (
        "step 50/250  loss 0.2500  accuracy 0.9000  640.0 examples/s  ETA 0m20s"
    )


def test_render_lines_keeps_other_lines_and_replaces_events() -> None:
    lines = ["hello from the user", json.dumps({"event": "exit", "rank": 0, "status": 0})]
    assert console.render_lines(lines) == ["hello from the user", "rank 0 exited with status 0"]


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        ("13:04:54 rank0 I Sharding callback duration: 11 microseconds", False),
        ("I0000 00:00:1795611942.023699 7446 grpc_server_lib.cc:467] Started server", False),
        ("13:04:54 rank0 I step 5/20 loss 1.2580", False),  # the progress event shows it
        ("13:04:50 rank0 W Training on SYNTHETIC data (no --data_dir)", True),
        ("models.mnist: a peer failed ... HINT: read the other ranks' logs", True),
        ("srun: error: node2: task 1: Killed", True),
        ("tensorflow.python.framework.errors_impl.UnavailableError: lost", True),
        ("E0000 00:00:1795.1 27274 base_collective_executor.cc:252] StartAbort", True),
        ("UnavailableError: lost peer", True),
    ],
)
def test_stderr_shows_warnings_and_errors_not_tensorflow_info(line: str, shown: bool) -> None:
    assert console.shown_stderr(line) is shown
    assert console.shown_stderr(line, verbose=True) is True


def test_a_terminal_gets_one_live_progress_line_a_file_plain_lines() -> None:
    live, plain = io.StringIO(), io.StringIO()
    for out, is_tty in ((live, True), (plain, False)):
        shown = console.Console(out, live=is_tty)
        shown.progress("step 1/2")
        shown.line("eval at step 1")
        shown.progress("step 2/2")
        shown.close()
    assert plain.getvalue() == "step 1/2\neval at step 1\nstep 2/2\n"
    # In place: each redraw starts with a carriage return and a clear-to-end-of-line; the
    # other line is printed above the live one, and the last progress stays.
    assert live.getvalue() == (
        "\r\x1b[Kstep 1/2" + "\r\x1b[Keval at step 1\nstep 1/2" + "\r\x1b[Kstep 2/2" + "\n"
    )
    assert live.getvalue().replace("\r\x1b[K", "\n").splitlines()[-1] == "step 2/2"


def scontrol(state: str) -> tuple[int, str, str]:
    return (0, f"JobId=7 JobState={state} ExitCode=0:0 Restarts=0\n", "")


def test_follow_renders_events_and_hides_tensorflow_chatter_unless_verbose(
    tmp_path: Path,
) -> None:
    (tmp_path / "7_0_log.out").write_text(
        "\n".join(json.dumps(e) for e in (CLUSTER, PROGRESS)) + "\n"
    )
    (tmp_path / "7_0_log.err").write_text(
        "13:04:54 rank0 I Sharding callback duration: 11 microseconds\n"
        "13:04:55 rank0 W Training on SYNTHETIC data\n"
    )
    for verbose in (False, True):
        fake = FakeSlurm({"scontrol": [scontrol("COMPLETED")] * 2})
        out = io.StringIO()
        watch.follow("7", tmp_path, 1, runner=fake, out=out, sleep=lambda _: None,
                     verbose=verbose, live=False)  # fmt: skip
        text = out.getvalue()
        assert '"event"' not in text
        assert "step 50/250  loss 0.2500" in text
        assert "W Training on SYNTHETIC data" in text
        assert ("Sharding callback duration" in text) is verbose


def test_status_lists_each_ranks_real_log_files_not_a_template(tmp_path: Path) -> None:
    from slurmtf.contracts import SUBMITIT_LOG_NAME
    from slurmtf.monitor.records import JobPlace

    place = JobPlace("12", tmp_path, SUBMITIT_LOG_NAME, "record")
    assert "(not written yet)" in watch.log_lines(place)[1]
    for rank in range(10):
        (tmp_path / f"12_{rank}_log.out").write_text("")
    lines = watch.log_lines(place)
    assert lines[0] == f"  logs (10 rank(s) in {tmp_path}, found via record):"
    assert lines[1] == f"    rank 0: {tmp_path}/12_0_log.out  {tmp_path}/12_0_log.err"
    assert lines[-1] == f"    ... and 2 more rank(s) in {tmp_path}"
    assert not any("{" in line for line in lines)
