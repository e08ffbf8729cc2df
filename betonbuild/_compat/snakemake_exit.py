"""A finished Snakemake run exits without CPython's teardown of its modules.

CPython's teardown of Snakemake's own process (its DAG; pandas, sqlalchemy and sqlmodel, which its
SLURM plugin and persistence import; betonbuild's specs) takes 0.55 s after the run is over, on
every run: a build, a dry run, a no-op "Nothing to be done" (measured with strace on benchmark
10's build: no system call between Snakemake's last one and the first ``munmap`` of the teardown).
Snakemake 9.27.1 ends every run in ``snakemake.cli.main`` with ``sys.exit(code)``, at the top of
the call stack: the lock is released, the logs are written and the run's temp files removed
before it, and no ``finally`` is left above it. ``install()`` makes that ``sys.exit`` run the
atexit handlers (logging's shutdown among them), flush every stream and end the process with the
same status (``betonbuild._compat.fast_exit``, as betonbuild's own jobs end).
"""

from __future__ import annotations

import sys
import threading

from betonbuild._compat import Checked
from betonbuild._compat.fast_exit import exit_without_teardown

CHECKED = (
    Checked(
        "snakemake",
        "9.27.1",
        why="snakemake.cli.main ends every run with sys.exit(code) at the top of the stack; that exit "
        "skips the interpreter's teardown (0.55 s of every run)",
    ),
)


def install() -> None:
    """From now on, ``sys.exit`` in this process's main thread exits without the teardown (for
    Snakemake's main process, after its Snakefile is read)."""
    if getattr(sys.exit, "betonbuild_fast", False):
        return
    plain_exit = sys.exit

    def exit_at_once(status=None):
        if threading.current_thread() is not threading.main_thread():
            plain_exit(status)  # in a thread it ends only the thread, as it did
        if status is not None and not isinstance(status, int):
            print(status, file=sys.stderr)  # what SystemExit does with a message
            status = 1
        exit_without_teardown(status=status or 0)
        plain_exit(status)  # a child process still running: exit as before (multiprocessing joins it)

    exit_at_once.betonbuild_fast = True
    sys.exit = exit_at_once
