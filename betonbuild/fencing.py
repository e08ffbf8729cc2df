"""Fencing: a job of a superseded snakemake run never publishes an output.

The main process of every run draws a run token and records it in the working directory's owner
file (``betonbuild.workflow.locks.record_lock_owner``, in ``onstart``), and puts the token and the
owner file's path into its environment, which every job inherits (local jobs as child processes,
SLURM jobs through ``sbatch --export=ALL``). Just before an output is renamed into place
(``betonbuild.atomic.atomic_path``), the job checks that the owner file still names its token: a job
orphaned by a killed run, still running when a newer run took the working directory over, then
discards its file instead of replacing the newer run's, and says so in its log, on the killed run's
console and in ``.snakemake/betonbuild-fenced.log``. A process without a token (``betonbuild
write`` by hand, tests) is not a job of a run and is not fenced.

The check and the rename are two steps, not one: a newer run's takeover within the microseconds
between them is not caught, but a newer run publishes the same target only after its own manifest
and smoke stages, long after its takeover, so the orphan cannot land after it.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

from betonbuild.errors import WriteError

TOKEN_VAR = "BETONBUILD_RUN_TOKEN"
OWNER_VAR = "BETONBUILD_RUN_OWNER"  # absolute path of the owner file that names the current run
FENCED_LOG = "betonbuild-fenced.log"  # beside the owner file: every refused publication, one line each


def run_token() -> str | None:
    """This process's run token, or None outside a snakemake run of betonbuild."""
    return os.environ.get(TOKEN_VAR) or None


def current_owner_token(owner_file: str | os.PathLike) -> str | None:
    """The token the owner file names now (None when it is gone or unreadable)."""
    try:
        return json.loads(Path(owner_file).read_text()).get("token")
    except (OSError, ValueError, AttributeError):
        return None


def check_still_owner(target: str | os.PathLike) -> None:
    """Raises WriteError when this process belongs to a run that no longer owns the working directory."""
    token, owner_file = run_token(), os.environ.get(OWNER_VAR)
    if token is None or not owner_file:
        return
    current = current_owner_token(owner_file)
    if current == token:
        return
    by = f"run {current}" if current else f"a newer run (the owner record {owner_file} no longer names this run)"
    message = (
        f"this job belongs to run {token}, superseded by {by}; not publishing {target}: its snakemake "
        "process was killed and a newer run owns this working directory now, which makes its own copy; "
        "nothing to do here (run snakemake again if that newer run did not finish)"
    )
    _record(Path(owner_file).with_name(FENCED_LOG), message)
    raise SupersededError(message)


class SupersededError(WriteError):
    """A job of a run that no longer owns the directory. Its snakemake is dead (nothing prints the
    job's log) and the newer run recreated that log, so ``rulescript.run`` also writes this one to
    the console the job was started from."""

    to_console = True


def _record(log: Path, message: str) -> None:
    """The newer run removes and recreates the job's own log when it reruns the job, so the refusal
    is also appended where it stays (``.snakemake/betonbuild-fenced.log``)."""
    line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} pid {os.getpid()}: {message}\n"
    with contextlib.suppress(OSError), open(log, "a") as fh:
        fh.write(line)
