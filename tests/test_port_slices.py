"""slurmtf/sandbox/port_slices.py: a new sandbox's step ports avoid a running one's."""

from __future__ import annotations

import os
from pathlib import Path

from slurmtf.sandbox import config as c
from slurmtf.sandbox import port_slices
from slurmtf.sandbox.config import SandboxConfig


def test_free_slice_prefers_its_own_then_the_next_free_one_cyclically() -> None:
    assert port_slices.free_slice(3, [1, 2], 20) == 3
    assert port_slices.free_slice(3, [3, 4], 20) == 5
    assert port_slices.free_slice(19, [19], 20) == 0
    assert port_slices.free_slice(7, range(20), 20) == 7  # all used: its own


def test_running_ranges_reads_each_slurmctlds_conf(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nMpiParams=ports=23000-23999\n")
    for pid, argv in ((10, [b"slurmctld", b"-D", b"-f", bytes(conf)]),
                      (11, [b"/opt/slurm/sbin/slurmctld", b"-f", bytes(conf)]),
                      (12, [b"slurmd", b"-f", bytes(conf)]),  # not a controller
                      (13, [b"slurmctld", b"-f", b"/gone/slurm.conf"])):  # fmt: skip
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cmdline").write_bytes(b"\0".join(argv) + b"\0")
    assert port_slices.running_ranges(tmp_path) == [(23000, 23999), (23000, 23999)]


def test_a_chosen_slice_renders_and_is_kept_in_the_config(tmp_path: Path) -> None:
    cfg = SandboxConfig(dir=tmp_path, resv_slice=4)
    low = c.WINDOW_LOW + 4 * c.RESV_PORTS_SPAN
    assert cfg.resv_port_range == (low, low + c.RESV_PORTS_SPAN - 1)
    assert f"MpiParams=ports={low}-{low + c.RESV_PORTS_SPAN - 1}" in c.render_slurm_conf(cfg)
    assert SandboxConfig(dir=tmp_path).resv_port_range == c.resv_port_range(tmp_path)
    assert port_slices.slice_of(low, c.WINDOW_LOW, c.RESV_PORTS_SPAN) == 4


def test_choosing_holds_the_machines_lock(tmp_path: Path) -> None:
    lock = tmp_path / "ports.lock"
    with port_slices.choosing(lock):
        child = os.fork()
        if child == 0:  # another process cannot take the lock meanwhile
            import fcntl

            fd = os.open(lock, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os._exit(0)
            os._exit(1)
        _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    with port_slices.choosing(tmp_path / "missing" / "ports.lock"):
        pass  # no lock file possible: no lock, no error
