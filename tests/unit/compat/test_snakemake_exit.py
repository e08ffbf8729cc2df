"""Snakemake's final sys.exit without the interpreter's teardown: the same status, atexit handlers
run, buffered output flushed; a thread's sys.exit still ends only the thread."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = """
import atexit, sys, threading
from betonbuild._compat.snakemake_exit import install
install()
install()  # twice: still one replacement
atexit.register(lambda: print("atexit ran"))
sys.stdout.write("buffered, no newline")
thread = threading.Thread(target=lambda: sys.exit(9))
thread.start(); thread.join()
print(" | thread ended alone" if thread.is_alive() is False else "")
sys.exit({status!r})
print("never")
"""


@pytest.mark.parametrize(("status", "code"), [(0, 0), (3, 3), (None, 0), ("a message", 1)])
def test_the_status_atexit_handlers_and_buffers_are_kept(status, code):
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT.format(status=status))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == code
    assert done.stdout == "buffered, no newline | thread ended alone\natexit ran\n"
    assert ("a message" in done.stderr) is (status == "a message")


def test_the_teardown_is_skipped():
    """A module whose teardown would print: nothing printed once sys.exit is the fast one."""
    code = textwrap.dedent("""
        import sys
        class Noisy:
            def __del__(self):
                print("torn down")
        keep = Noisy()
        if sys.argv[1] == "fast":
            from betonbuild._compat.snakemake_exit import install
            install()
        sys.exit(0)
    """)
    runs = {
        how: subprocess.run([sys.executable, "-c", code, how], capture_output=True, text=True, timeout=60)
        for how in ("plain", "fast")
    }
    assert runs["plain"].stdout == "torn down\n"  # the interpreter's teardown deletes module globals
    assert runs["fast"].stdout == "" and runs["fast"].returncode == 0
