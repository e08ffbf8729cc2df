"""The pages a write has started are made durable while it goes on (``write.data_sync``), so the
fsync before the file is published waits for the last pages only."""

from __future__ import annotations

import itertools
import os
import threading
import time

import numpy as np

from betonbuild.write import data_sync
from betonbuild.write.data_sync import DataSync
from betonbuild.write.writer import write_beton
from tests.unit.write.test_bounded_memory import Rows, rows_spec
from tests.unit.write.test_shm_reclaim import wait_for


def test_syncs_when_pages_were_started_and_only_then(tmp_path, monkeypatch):
    path = tmp_path / "file"
    path.write_bytes(b"x" * 4096)
    synced = []
    monkeypatch.setattr(data_sync, "SYNC", lambda fd: synced.append(os.fstat(fd).st_ino))
    pages = [0]
    sync = DataSync(str(path), lambda: pages[0], interval=0.005).start()
    try:
        time.sleep(0.1)  # twenty intervals, no new page
        assert synced == []
        pages[0] = 3
        wait_for(lambda: len(synced) == 1, 10, "a sync after new pages")
        time.sleep(0.1)
        assert len(synced) == 1  # nothing new since
        pages[0] = 4
        wait_for(lambda: len(synced) == 2, 10, "a sync after another page")
    finally:
        sync.stop()
    assert set(synced) == {path.stat().st_ino}  # the file itself
    assert sync.syncs == 2 and not sync._thread.is_alive() and _descriptors_of(path) == 0


def test_a_failing_write_does_not_wait_for_a_sync_under_way(tmp_path, monkeypatch):
    """stop(wait=False) returns while fdatasync is still in the kernel; the thread closes its own
    descriptor when the call returns."""
    path = tmp_path / "file"
    path.write_bytes(b"x")
    entered, release, fds = threading.Event(), threading.Event(), []

    def slow_sync(fd):
        fds.append(fd)
        entered.set()
        release.wait(10)

    monkeypatch.setattr(data_sync, "SYNC", slow_sync)
    sync = DataSync(str(path), itertools.count().__next__, interval=0.005).start()  # always a new page
    assert entered.wait(10)
    stopper = threading.Thread(target=sync.stop, kwargs={"wait": False})
    stopper.start()
    stopper.join(5)
    assert not stopper.is_alive() and sync._thread.is_alive()  # returned, the sync still under way
    release.set()
    sync._thread.join(5)
    assert not sync._thread.is_alive()
    assert _descriptors_of(path) == 0


def _descriptors_of(path) -> int:
    """How many of this process's descriptors are open on ``path``."""
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            found += os.readlink(f"/proc/self/fd/{fd}") == str(path)
        except OSError:
            pass  # the listing's own descriptor, closed by now
    return found


def test_a_file_system_error_ends_the_thread_quietly(tmp_path, monkeypatch):
    path = tmp_path / "file"
    path.write_bytes(b"x")

    def refuse(fd):
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(data_sync, "SYNC", refuse)
    sync = DataSync(str(path), itertools.count().__next__, interval=0.005).start()
    wait_for(lambda: not sync._thread.is_alive(), 10, "the thread to end")
    sync.stop()


def test_a_write_syncs_its_temp_file_while_the_workers_write(tmp_path, monkeypatch):
    """A write of ~15 pages: the temp file (not the target, which does not exist yet) is synced
    during the write, and the file written is whole."""
    synced, real_sync = [], data_sync.SYNC

    def spy(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_sync(fd)

    monkeypatch.setattr(data_sync, "SYNC", spy)
    monkeypatch.setattr(data_sync, "INTERVAL_SECONDS", 0.001)
    target = tmp_path / "out.beton"
    n = 20_000
    record = write_beton(rows_spec(100), Rows(n), np.arange(n), target, num_workers=2)
    assert record["num_samples"] == n and target.exists()
    assert synced, "no fdatasync while the workers wrote"
    assert all(os.path.dirname(p) == str(tmp_path) for p in synced)
    assert all(os.path.basename(p).startswith(".out.beton.tmp") for p in synced)  # atomic.temp_path_for's

    from betonbuild.beton.format import BetonFile

    assert BetonFile(str(target)).num_samples == n
