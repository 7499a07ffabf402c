"""``slurmtf tensorboard JOB|DIR``: finding a job's runs, naming a sweep's, the
TensorBoard and ssh command lines, the errors, and a sweep's HParams data read back."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from slurmtf.cli import jobs as jobs_cli
from slurmtf.cli import sweep as sweep_cli
from slurmtf.cli import tensorboard as tb_cli
from slurmtf.errors import InputError
from slurmtf.monitor import board, hparams
from slurmtf.monitor import records as jobrecord
from slurmtf.monitor.board import Run
from slurmtf.monitor.sweep_rows import point_row
from tests.helpers.boards import accumulator
from tests.helpers.fakeslurm import GONE, FakeSlurm

SUBMITIT = "{job}_{rank}_log.{kind}"


def _log(path: Path, *events: dict[str, object]) -> None:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))


def _summaries(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "events.out.tfevents.1.host").write_bytes(b"")
    return folder


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private record of submitted jobs and a log folder."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    logs = tmp_path / "logs"
    logs.mkdir()
    return logs


def _sweep(logs: Path, points: int = 4) -> None:
    """Array 9: ``points`` finished tasks, each with a model folder and a final eval."""
    for task in range(points):
        job = f"9_{task}"
        jobrecord.append(job, logs, SUBMITIT)
        params = {"lr": str(10.0**-task), "opt": "sgd" if task % 2 else "adam"}
        _log(
            logs / f"{job}_0_log.out",
            {"event": "launch", "params": params,
             "command": ["python3", "-m", "m", f"--model_dir={logs / f'{job}_model'}"]},
            {"event": "progress", "step": 8, "total": 8, "loss": 1.0, "examples_per_sec": 50.0},
            {"event": "eval", "step": 8, "loss": 0.5 - task / 10, "accuracy": 0.5 + task / 10},
            {"event": "done", "step": 8},
        )  # fmt: skip
        _summaries(logs / f"{job}_model" / "eval")


def test_folder_flags_both_spellings() -> None:
    command = ["python3", "s.py", "--model_dir=/m", "--logdir", "/tb", "--log-dir=/l", "--x=/y"]
    assert board.folder_flags(command) == [Path("/m"), Path("/tb"), Path("/l")]


def test_a_job_run_from_its_record_and_model_dir(state: Path) -> None:
    jobrecord.append("5", state, SUBMITIT)
    model = _summaries(state / "elsewhere" / "train")
    _summaries(state / "4_model")  # another job's, beside it in the same log folder
    _log(
        state / "5_0_log.out", {"event": "launch", "command": ["m", f"--model_dir={model.parent}"]}
    )
    runs, places = board.job_runs("5", FakeSlurm({"scontrol": [GONE]}))
    assert runs == [Run("5", model.parent)]
    assert places[0].source == "record"


def test_a_job_script_run_from_the_recorded_model_dir(state: Path, tmp_path: Path) -> None:
    """The job scripts record MODEL_DIR (the models' --model_dir, a `train` script's env)."""
    model = _summaries(tmp_path / "runs" / "r1" / "logs").parent.parent
    jobrecord.append("8", state, "rank{rank}.{kind}", "r1", model_dir=model)
    _log(state / "rank0.out", {"event": "cluster", "rank": 0})
    runs, _ = board.job_runs("8", FakeSlurm({"scontrol": [GONE]}))
    assert runs == [Run("8", model)]


def test_every_array_task_named_by_its_parameters(state: Path) -> None:
    _sweep(state)
    runs, places = board.job_runs("9", FakeSlurm({"scontrol": [GONE]} | {"*": [GONE]}))
    assert [r.name for r in runs] == ["lr=1.0 opt=adam", "lr=0.1 opt=sgd", "lr=0.01 opt=adam",
                                      "lr=0.001 opt=sgd"]  # fmt: skip
    assert [r.path for r in runs] == [state / f"9_{t}_model" for t in range(4)]
    assert len(places) == 4


def test_same_parameters_fall_back_to_task_ids() -> None:
    tasks = [(jobrecord.JobPlace(f"3_{t}", Path("/nowhere"), SUBMITIT, "record"), "a=1")
             for t in range(2)]  # fmt: skip
    assert board.run_name("a=1,b:2") == "a=1;b_2"
    assert board.task_runs(tasks) == []  # no summaries yet: no runs


def test_logdir_spec_and_command_lines() -> None:
    runs = [Run("lr=0.1", Path("/m/a")), Run("hparams", Path("/m/h"))]
    spec = board.logdir_spec(runs)
    assert spec == "lr=0.1:/m/a,hparams:/m/h"
    command = board.board_command(spec, 6123, "localhost", python="py", spec=True)
    assert command[:2] == ["py", "-c"]
    assert "tensorboard.compat.notf" in command[2]  # TensorBoard without TensorFlow
    assert command[3:] == ["--logdir_spec", spec, "--port", "6123", "--host", "localhost"]
    assert board.board_command("/tmp/l", 1, "h", python="py")[3:5] == ["--logdir", "/tmp/l"]
    with pytest.raises(InputError, match="HINT: rename"):
        board.logdir_spec([Run("x", Path("/a,b"))])


def test_links_name_each_run_and_follow_new_ones(tmp_path: Path) -> None:
    first = _summaries(tmp_path / "9_0_model" / "train").parent
    later = _summaries(tmp_path / "9_1_model" / "train").parent
    odd = _summaries(tmp_path / "a,b" / "train").parent  # a ',' is fine in a link's target
    links = board.Links.create()
    try:
        assert links.update([Run("lr=0.1", first), Run("x/y", odd)]) == ["lr=0.1", "x/y"]
        assert links.update([Run("lr=0.1", first)]) == []  # linked already
        assert links.update([Run("lr=0.1", first), Run("lr=0.01", later)]) == ["lr=0.01"]
        names = sorted(p.name for p in links.folder.iterdir())
        assert names == ["lr=0.01", "lr=0.1", "x_y"]
        assert (links.folder / "lr=0.01" / "train").is_dir()
        moved = _summaries(tmp_path / "elsewhere" / "train").parent
        assert links.update([Run("lr=0.1", moved)]) == ["lr=0.1"]
        assert (links.folder / "lr=0.1").readlink() == moved
    finally:
        links.remove()
    assert not links.folder.exists()
    assert (first / "train").is_dir()  # what the links named is left as it was


def test_serve_links_new_runs_while_tensorboard_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real child in TensorBoard's place; the job's runs grow between two looks."""
    monkeypatch.setattr(board, "REFRESH_S", 0.1)
    folders = [_summaries(tmp_path / f"9_{t}_model" / "train").parent for t in range(2)]
    looks = [[Run("a", folders[0])], [Run("a", folders[0]), Run("b", folders[1])]]
    said: list[str] = []
    links = board.Links.create()
    done = tmp_path / "done"

    def runs() -> list[Run]:
        found = looks.pop(0) if len(looks) > 1 else looks[0]
        if len(found) == 2:
            done.touch()  # the child ends at its next look
        return found

    child = [sys.executable, "-c", f"import os, time\nwhile not os.path.exists({str(done)!r}): "
             "time.sleep(0.05)\ntime.sleep(0.3)"]  # fmt: skip
    try:
        links.update(looks[0])  # as the command does before TensorBoard starts
        assert board.serve(child, links, runs, said.append) == 0
        assert sorted(p.name for p in links.folder.iterdir()) == ["a", "b"]
    finally:
        links.remove()
    assert said == ["slurmtf: new run(s) in TensorBoard: b"], said


@pytest.mark.parametrize(
    ("bind", "line"),
    [("localhost", "ssh -L 6006:localhost:6006 ada@login1"),
     ("0.0.0.0", "ssh -L 6006:localhost:6006 ada@login1"),
     ("10.1.2.3", "ssh -L 6006:10.1.2.3:6006 ada@login1")],
)  # fmt: skip
def test_ssh_line(bind: str, line: str) -> None:
    assert board.ssh_line(6006, bind, user="ada", host="login1") == line


def test_dry_run_prints_the_command_and_the_ssh_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _summaries(tmp_path / "run1" / "train").parent
    assert tb_cli.main([str(folder), "--dry_run", "--port=7001"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "slurmtf: TensorBoard over 1 run(s): run1"
    assert shlex.split(out[1])[-6:] == [
        "--logdir_spec", f"run1:{folder}", "--port", "7001", "--host", "localhost"]  # fmt: skip
    assert not list(Path(tempfile.gettempdir()).glob("slurmtf-board-*")), "a dry run links"
    assert "ssh -L 7001:localhost:7001 " in out[2]
    assert board.free_port("127.0.0.1") > 0


@pytest.mark.parametrize(
    ("argv", "words"),
    [(["12345"], "JOB='12345': has no record"),
     (["{empty}"], "holds no TensorBoard summaries"),
     (["{tmp}/missing"], "is not a folder"),
     (["5", "--port=70000"], "--port=70000: is not a port")],
)  # fmt: skip
def test_errors_are_one_line_with_a_hint_and_exit_2(
    argv: list[str], words: str, state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (state / "empty").mkdir()
    argv = [a.format(empty=state / "empty", tmp=state) for a in argv]
    assert tb_cli.main(argv, runner=FakeSlurm({"scontrol": [GONE]})) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("slurmtf tensorboard: ")
    assert words in err
    assert "HINT: " in err


def test_a_job_without_summaries_yet_says_where_it_looked(
    state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jobrecord.append("6", state, SUBMITIT)
    _log(state / "6_0_log.out", {"event": "launch", "command": ["m"]})
    assert tb_cli.main(["6", "--dry_run"], runner=FakeSlurm({"scontrol": [GONE]})) == 2
    err = capsys.readouterr().err
    assert f"no TensorBoard summaries (events.out.tfevents.*) yet, e.g. in {state}/6_model" in err
    assert "HINT: " in err


def test_status_names_the_command(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    jobrecord.append("6", state, SUBMITIT)
    _log(state / "6_0_log.out", {"event": "launch", "command": ["m"]})
    assert jobs_cli.main(["status", "6"], runner=FakeSlurm({"scontrol": [GONE], "*": [GONE]})) == 0
    out = capsys.readouterr().out
    assert out.count("slurmtf tensorboard 6 ") == 1


def _hparams_of(folder: Path) -> tuple[list[str], dict[str, dict[str, object]]]:
    """The experiment's parameter names and each session's parameters and metrics, as
    TensorBoard's own event reader finds them."""
    from tensorboard.plugins.hparams import plugin_data_pb2

    root = accumulator(folder)
    data = root.PluginTagToContent("hparams")["_hparams_/experiment"]
    experiment = plugin_data_pb2.HParamsPluginData.FromString(data).experiment
    names = [h.name for h in experiment.hparam_infos]
    sessions = {}
    for session in sorted(p for p in folder.iterdir() if p.is_dir()):
        acc = accumulator(session)
        start = plugin_data_pb2.HParamsPluginData.FromString(
            acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
        ).session_start_info
        values: dict[str, object] = {k: v.number_value or v.string_value
                                     for k, v in start.hparams.items()}  # fmt: skip
        for tag in acc.Tags()["tensors"]:
            if not tag.startswith("_hparams_"):
                values[tag] = round(float(acc.Tensors(tag)[-1].tensor_proto.float_val[0]), 4)
        sessions[session.name] = values
    return names, sessions


def test_sweep_writes_hparams_once_and_tensorboard_serves_them(
    state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _sweep(state)
    gone = FakeSlurm({"scontrol": [GONE], "*": [GONE]})
    assert sweep_cli.main(["9"], runner=gone) == 0
    folder = state / "9_hparams"
    names, sessions = _hparams_of(folder)
    assert names == ["lr", "opt"]
    assert sessions == {
        f"9_{t}": {"lr": 10.0**-t, "opt": "sgd" if t % 2 else "adam",
                   "loss": round(0.5 - t / 10, 4), "accuracy": round(0.5 + t / 10, 4),
                   "examples_per_sec": 50.0}
        for t in range(4)
    }  # fmt: skip
    files = sorted(folder.rglob("events.out.tfevents.*"))
    assert sweep_cli.main(["9"], runner=gone) == 0  # unchanged: not written again
    assert sorted(folder.rglob("events.out.tfevents.*")) == files
    capsys.readouterr()
    assert tb_cli.main(["9", "--dry_run"], runner=gone) == 0
    spec = shlex.split(capsys.readouterr().out.splitlines()[1])[4]
    assert spec.endswith(f",hparams:{folder}")
    assert spec.count(",") == 4


def test_hparams_rewritten_when_a_point_changes(tmp_path: Path) -> None:
    def row(acc: float) -> object:
        events = [{"event": "launch", "params": {"lr": "0.1"}},
                  {"event": "eval", "step": 3, "loss": 0.1, "accuracy": acc}]  # fmt: skip
        return point_row("2_0", "RUNNING", 0, events, logs=str(tmp_path / "2_0_0_log.out"))

    assert hparams.write_rows("2", [row(0.5)]) == tmp_path / "2_hparams"  # type: ignore[list-item]
    assert not hparams.write_sweep("2", [row(0.5)], tmp_path / "2_hparams")  # type: ignore[list-item]
    assert hparams.write_sweep("2", [row(0.7)], tmp_path / "2_hparams")  # type: ignore[list-item]
    assert _hparams_of(tmp_path / "2_hparams")[1]["2_0"]["accuracy"] == 0.7
    assert [p.name for p in tmp_path.iterdir()] == ["2_hparams"]  # no staging left behind


def test_no_tensorflow_imported(tmp_path: Path) -> None:
    """Writing a sweep's HParams data and the command's whole path up to TensorBoard's
    start never import TensorFlow (installed here: it would be, through TensorBoard's
    file layer)."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from slurmtf.cli import tensorboard\n"
        "from slurmtf.monitor import hparams\n"
        "from slurmtf.monitor.sweep_rows import point_row\n"
        f"root = Path({str(tmp_path)!r})\n"
        "events = [{'event': 'launch', 'params': {'lr': '0.1'}}, {'event': 'done', 'step': 1}]\n"
        "row = point_row('1_0', 'COMPLETED', 0, events, logs=str(root / 'x'))\n"
        "assert hparams.write_sweep('1', [row], root / 'hp')\n"
        "assert tensorboard.main([str(root), '--dry_run']) == 0\n"
        "assert 'tensorflow' not in sys.modules, 'tensorflow imported'\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
