"""Unit tests of betonbuild.workflow.locks: a dead run's Snakemake locks are removed, a live one's kept."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from betonbuild._compat.snakemake_locks import LOCK_DIR, lock_files
from betonbuild.fencing import OWNER_VAR, TOKEN_VAR
from betonbuild.workflow.locks import OWNER_FILE, clear_stale_locks, processes_of_run, record_lock_owner


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A working directory with the lock files a running (or killed) Snakemake 9 leaves."""
    monkeypatch.chdir(tmp_path)
    LOCK_DIR.mkdir(parents=True)
    for name in ("0.input.lock", "0.output.lock"):
        (LOCK_DIR / name).write_text(f"{tmp_path}/results/x\n")
    return tmp_path


def owner(pid: int, host: str | None = None) -> None:
    OWNER_FILE.write_text(json.dumps({"host": host or socket.gethostname(), "pid": pid}))


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_record_lock_owner_writes_this_host_and_process(workdir, monkeypatch):
    monkeypatch.setenv(TOKEN_VAR, "inherited-from-an-outer-run")
    monkeypatch.setenv(OWNER_VAR, "/elsewhere/owner.json")
    record_lock_owner()
    recorded = json.loads(OWNER_FILE.read_text())
    assert recorded == {"host": socket.gethostname(), "pid": os.getpid(), "token": recorded["token"]}
    # The run's jobs inherit a fresh token and the owner file's path, which fencing reads.
    assert os.environ[TOKEN_VAR] == recorded["token"] != "inherited-from-an-outer-run"
    assert os.environ[OWNER_VAR] == str(workdir / OWNER_FILE)
    record_lock_owner()
    assert json.loads(OWNER_FILE.read_text())["token"] == os.environ[TOKEN_VAR] != recorded["token"]


def test_the_locks_of_a_dead_run_are_removed_with_its_owner_file(workdir):
    pid = dead_pid()
    owner(pid)
    assert [p.name for p in lock_files()] == ["0.input.lock", "0.output.lock"]
    message = clear_stale_locks()
    assert message == f"removed the lock left by snakemake process {pid}, which no longer exists (killed?)"
    assert lock_files() == [] and not OWNER_FILE.exists()


def test_the_locks_of_a_live_run_are_kept(workdir):
    owner(os.getpid())
    assert clear_stale_locks() is None
    assert len(lock_files()) == 2 and OWNER_FILE.exists()


def test_the_locks_of_a_run_on_another_host_are_kept(workdir):
    owner(dead_pid(), host=socket.gethostname() + "-elsewhere")
    assert clear_stale_locks() is None
    assert len(lock_files()) == 2


def test_locks_without_an_owner_file_are_kept(workdir):
    assert clear_stale_locks() is None
    assert len(lock_files()) == 2


def test_an_unreadable_owner_file_keeps_the_locks(workdir):
    OWNER_FILE.write_text("{not json")
    assert clear_stale_locks() is None
    assert len(lock_files()) == 2


def test_no_locks_is_nothing_to_do_and_the_owner_file_stays(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    OWNER_FILE.parent.mkdir()
    owner(dead_pid())
    assert clear_stale_locks() is None
    assert OWNER_FILE.exists()


def wait_for_environment(pid: int, name: str, timeout: float = 30.0) -> None:
    """Waits until process ``pid`` runs with ``name`` in its environment: between fork and exec a
    loaded machine shows the forking process's environment (the fresh-clone CI at eb3b8c7 raced)."""
    import time

    deadline = time.monotonic() + timeout
    while f"{name}=".encode() not in open(f"/proc/{pid}/environ", "rb").read():
        assert time.monotonic() < deadline, f"process {pid} never showed {name} in its environment"
        time.sleep(0.01)


def test_the_locks_are_kept_while_a_job_of_the_dead_run_still_runs(workdir):
    """The main process is gone, but a job it started (carrying its run token) still runs and may
    still write: the lock stays, and the message names the job's process and what to do."""
    main = dead_pid()
    OWNER_FILE.write_text(json.dumps({"host": socket.gethostname(), "pid": main, "token": "run-old"}))
    job = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**os.environ, TOKEN_VAR: "run-old"},
    )
    try:
        wait_for_environment(job.pid, TOKEN_VAR)  # until exec, /proc shows the parent's environment
        message = clear_stale_locks()
        assert len(lock_files()) == 2 and OWNER_FILE.exists()
        assert message is not None and f"{job.pid}" in message and "still run" in message
        assert f"kill {job.pid}" in message and "snakemake --unlock" in message
    finally:
        job.kill()
        job.wait()
    # Once the job has ended, the lock is removed as for any dead run.
    assert clear_stale_locks().startswith(f"removed the lock left by snakemake process {main}")
    assert lock_files() == []


def test_processes_of_run_finds_exactly_the_processes_started_with_the_token(monkeypatch):
    monkeypatch.setenv(TOKEN_VAR, "run-mine")  # this process is never counted
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    carrying = subprocess.Popen(sleep, env={**os.environ, TOKEN_VAR: "run-a"})
    longer = subprocess.Popen(sleep, env={**os.environ, TOKEN_VAR: "run-ab"})  # a prefix is no match
    try:
        assert processes_of_run("run-a") == [carrying.pid]
        assert processes_of_run("run-mine") == []
    finally:
        for p in (carrying, longer):
            p.kill()
            p.wait()
    assert processes_of_run("run-a") == []
