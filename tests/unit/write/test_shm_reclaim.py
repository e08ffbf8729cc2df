"""ffcv's shared memory block of a write killed with SIGKILL is reclaimed by the next write, and
nobody else's /dev/shm entries are touched (issue 17, item 6). Real processes, real kills."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from multiprocessing import shared_memory
from pathlib import Path

import pytest

from betonbuild.write.beton_writer import reclaim_dead_writers_shm, shm_name

SHM = Path("/dev/shm")
SCRIPT = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from betonbuild.config.load import load_config
    from betonbuild.write.writer import write_beton

    class Dataset:
        def __init__(self, n, delay):
            self.n, self.delay = n, delay

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            time.sleep(self.delay)
            return (np.zeros(4, dtype=np.uint8),)

    spec = load_config({"datasets": {"d": {
        "source": {"kind": "python", "factory": "x:y"},
        "fields": {"x": {"type": "ndarray", "dtype": "uint8", "shape": [4]}},
    }}}).datasets["d"]
    n, delay = int(sys.argv[2]), float(sys.argv[3])
    write_beton(spec, Dataset(n, delay), np.arange(n), sys.argv[1], num_workers=1)
    """
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not SHM.is_dir(), reason="POSIX shared memory lives in /dev/shm on Linux only"),
]


def mapped_shm(pid: int) -> set[str]:
    """The /dev/shm entries a process has mapped (ffcv's metadata block among them)."""
    with open(f"/proc/{pid}/maps") as fh:
        return {line.split()[-1][len("/dev/shm/") :] for line in fh if " /dev/shm/" in line and "(deleted)" not in line}


def zombie(pid: int) -> bool:
    """Whether ``pid`` has ended but is not reaped yet (state Z in /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0] == "Z"


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_the_shared_memory_of_a_killed_write_is_reclaimed_by_the_next_write(tmp_path):
    script = tmp_path / "write.py"
    script.write_text(SCRIPT)
    target = tmp_path / "out.beton"
    # Entries that are not ours to reclaim: another program's (ffcv's own naming), and one named
    # as betonbuild names its blocks but held by a live process (this one).
    foreign = shared_memory.SharedMemory(create=True, size=64)
    live_ours = shared_memory.SharedMemory(name=f"betonbuild-shm-{os.getpid()}-decoy", create=True, size=64)
    killed = subprocess.Popen(
        [sys.executable, str(script), str(target), "100000", "0.01"], cwd=tmp_path, start_new_session=True
    )
    leaked: set[str] = set()
    try:
        wait_for(lambda: any(tmp_path.glob(".out.beton.tmp-*")), timeout=120, what="the write to start")
        wait_for(lambda: mapped_shm(killed.pid), timeout=30, what="ffcv's shared memory")
        leaked = mapped_shm(killed.pid)
        os.killpg(killed.pid, signal.SIGKILL)  # the writer, its workers and its resource tracker
        # Not reaped yet: while the writer is a zombie its pid still exists, so no other betonbuild write
        # running meanwhile (another test's) reclaims the block before it is looked at here.
        wait_for(lambda: zombie(killed.pid), timeout=30, what="the killed writer to end")
        time.sleep(0.5)
        assert all((SHM / name).exists() for name in leaked), "the kill left ffcv's block behind"
        killed.wait(timeout=30)

        rerun = subprocess.run(
            [sys.executable, str(script), str(target), "50", "0"], cwd=tmp_path, capture_output=True, text=True
        )
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        assert [name for name in leaked if (SHM / name).exists()] == [], "the rerun did not reclaim the block"
        assert (SHM / foreign.name.lstrip("/")).exists() and (SHM / live_ours.name.lstrip("/")).exists()
        assert not list(tmp_path.glob(".out.beton.tmp-*")) and target.exists()
    finally:
        if killed.poll() is None:
            os.killpg(killed.pid, signal.SIGKILL)
        for name in leaked:
            (SHM / name).unlink(missing_ok=True)
        for block in (foreign, live_ours):
            block.close()
            block.unlink()


def test_reclaim_unlinks_only_betonbuild_blocks_of_dead_processes(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    names = {
        "dead": f"betonbuild-shm-{dead.pid}-0a1b2c3d",
        "live": shm_name(),  # this process's own naming
        "foreign": "psm_0a1b2c3d",
        "odd": "betonbuild-shm-notapid",
    }
    for name in names.values():
        (tmp_path / name).write_bytes(b"x")
    assert names["live"].startswith(f"betonbuild-shm-{os.getpid()}-")
    assert reclaim_dead_writers_shm(tmp_path) == [names["dead"]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(v for k, v in names.items() if k != "dead")
