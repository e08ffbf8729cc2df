"""Stale Snakemake locks after a SIGKILL: recognised and removed, so the next run simply completes.

Snakemake locks the working directory while it runs and removes the lock when it ends; a run
killed with SIGKILL (or a power loss) leaves the lock behind and every later run is refused until
``--unlock``. Snakemake's lock files (``betonbuild._compat.snakemake_locks``) do not say who holds
them, so the main process of every run records its host, PID and a fresh run token here
(``onstart``) and hands the token to every job through the environment (``betonbuild.fencing``).

A later run on the same host removes the locks only when no process of the old run is left: not
its main process, and no process whose environment (``/proc/<pid>/environ``) carries its token: a
job orphaned by a kill of the main process alone keeps running and keeps the lock, and the message
names its processes. A live run's lock is never touched, so a concurrent second run is still
refused by Snakemake.

On SLURM the jobs run on other nodes, whose processes this host cannot see: the lock of a dead
main process is removed although its jobs may still run there (``squeue --me`` lists them,
``scancel`` ends them). Such a job cannot overwrite a newer run's output: it carries the old token,
and fencing refuses its rename once the newer run has recorded itself in the (shared) owner file.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from pathlib import Path

from betonbuild._compat.snakemake_locks import lock_files
from betonbuild.atomic import _alive, write_json
from betonbuild.fencing import OWNER_VAR, TOKEN_VAR

OWNER_FILE = Path(".snakemake/betonbuild-lock-owner.json")
PROC = Path("/proc")


def record_lock_owner() -> None:
    """This process owns the working directory from now on; its jobs inherit the new run token."""
    token = uuid.uuid4().hex
    # A run started from inside another run's job owns its own working directory: no inherited token.
    for var in (TOKEN_VAR, OWNER_VAR):
        os.environ.pop(var, None)
    write_json(OWNER_FILE, {"host": socket.gethostname(), "pid": os.getpid(), "token": token})
    os.environ[OWNER_VAR] = str(OWNER_FILE.resolve())
    os.environ[TOKEN_VAR] = token


def processes_of_run(token: str, proc: Path = PROC) -> list[int]:
    """Live processes on this host (other than this one) started with ``token`` in their environment."""
    entry = f"{TOKEN_VAR}={token}".encode()
    found = []
    for path in proc.iterdir():
        if not path.name.isdigit() or int(path.name) == os.getpid():
            continue
        try:
            environ = (path / "environ").read_bytes()
        except OSError:  # gone meanwhile, or another user's
            continue
        if entry in environ.split(b"\0"):
            found.append(int(path.name))
    return sorted(found)


def _describe(pid: int) -> str:
    try:
        args = (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return str(pid)
    return f"{pid} ({args[:100]}{'...' if len(args) > 100 else ''})"


def clear_stale_locks() -> str | None:
    """Removes the locks of a dead run on this host; returns what was done (or why not), or None."""
    locks = lock_files()
    if not locks or not OWNER_FILE.exists():
        return None
    try:
        owner = json.loads(OWNER_FILE.read_text())
    except (OSError, ValueError):
        return None
    if owner.get("host") != socket.gethostname() or _alive(int(owner.get("pid", 0))):
        return None
    survivors = processes_of_run(owner["token"]) if owner.get("token") else []
    if survivors:
        pids = " ".join(map(str, survivors))
        return (
            f"kept the lock left by snakemake process {owner['pid']}, which no longer exists (killed?): "
            f"processes of that run still run and may still write results: "
            f"{'; '.join(_describe(p) for p in survivors)}. Wait for them to end, or end them with "
            f"`kill {pids}`, then run again; or, to start now, run `snakemake --unlock` first "
            "(once a new run has started, their outputs are not published)"
        )
    for lock in locks:
        lock.unlink(missing_ok=True)
    OWNER_FILE.unlink(missing_ok=True)
    return f"removed the lock left by snakemake process {owner['pid']}, which no longer exists (killed?)"
