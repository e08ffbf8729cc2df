"""Stale Snakemake locks after a SIGKILL: recognised and removed, so the next run simply completes.

Snakemake locks the working directory while it runs and removes the lock when it ends; a run
killed with SIGKILL (or a power loss) leaves the lock behind and every later run is refused until
``--unlock``. Snakemake's lock files (``betonbuild._compat.snakemake_locks``) do not say who holds
them, so the main process of every run records its host and PID here (``onstart``); a later run on
the same host removes the locks only when that process no longer exists. A live run's lock is
never touched, so a concurrent second run is still refused by Snakemake.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from betonbuild._compat.snakemake_locks import lock_files
from betonbuild.atomic import _alive, write_json

OWNER_FILE = Path(".snakemake/betonbuild-lock-owner.json")


def record_lock_owner() -> None:
    write_json(OWNER_FILE, {"host": socket.gethostname(), "pid": os.getpid()})


def clear_stale_locks() -> str | None:
    """Removes the locks of a dead run on this host; returns what was done, or None."""
    locks = lock_files()
    if not locks or not OWNER_FILE.exists():
        return None
    try:
        owner = json.loads(OWNER_FILE.read_text())
    except (OSError, ValueError):
        return None
    if owner.get("host") != socket.gethostname() or _alive(int(owner.get("pid", 0))):
        return None
    for lock in locks:
        lock.unlink(missing_ok=True)
    OWNER_FILE.unlink(missing_ok=True)
    return f"removed the lock left by snakemake process {owner['pid']}, which no longer exists (killed?)"
