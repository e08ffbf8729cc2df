"""Ends a finished rule job at once, without the interpreter's teardown.

After torch, numba and ffcv are loaded, CPython's teardown takes about 0.45 s of every job and does
nothing for us: every output is already renamed into place and closed. CPython's private
``atexit._run_exitfuncs`` runs the atexit handlers first (a user's adapter may have some), then the
buffers of Python's streams, of the given files and of C's stdio are flushed, and ``os._exit``
ends the process.
"""

from __future__ import annotations

import atexit
import ctypes
import multiprocessing
import os
import sys

from betonbuild._compat import PYTHON, Checked

CHECKED = (
    Checked(
        PYTHON,
        "3.11",
        why="atexit._run_exitfuncs, then os._exit: the interpreter's teardown (0.45 s) skipped at the end of every job",
    ),
)


def exit_without_teardown(*files, status: int = 0) -> None:
    """Exits with ``status`` now, atexit handlers run and every buffer flushed. A process that still
    has a child process returns instead (and exits normally), so that multiprocessing joins it."""
    if multiprocessing.active_children():
        return
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr, *files):
        if stream is not None:
            stream.flush()
    ctypes.CDLL(None).fflush(None)  # output of C extensions, written with printf
    os._exit(status)
