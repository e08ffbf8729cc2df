"""CPython 3.11's ast.parse fails when two threads parse at once; betonbuild's lock prevents it."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap

import pytest

import betonbuild  # noqa: F401  (installs the lock in this process, as in every betonbuild process)

RACE = textwrap.dedent(
    """
    import ast, sys, threading, time
    if sys.argv[1] == "locked":
        import betonbuild  # noqa: F401
    source = open(ast.__file__).read()

    class Finalized:  # garbage whose finalizer runs Python code inside a parse's collection
        def __del__(self):
            sum(range(2000))

    errors = []
    deadline = time.monotonic() + 20

    def parse():
        for _ in range(400):
            if errors and sys.argv[1] != "locked" or time.monotonic() > deadline:
                return
            for _ in range(50):
                a, b = Finalized(), Finalized()
                a.b, b.a = b, a
            try:
                ast.parse(source)
            except SystemError as exc:
                errors.append(str(exc))

    threads = [threading.Thread(target=parse) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(len(errors), errors[:1])
    """
)


def race(mode: str) -> str:
    done = subprocess.run([sys.executable, "-c", RACE, mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
def test_threads_parsing_at_once_fail_without_the_lock_and_not_with_it():
    assert "recursion depth mismatch" in race("plain")
    assert race("locked").startswith("0 []")


def test_the_lock_is_installed_and_parse_still_parses():
    assert ast.parse.betonbuild_locked
    assert isinstance(ast.parse("x = 1").body[0], ast.Assign)
