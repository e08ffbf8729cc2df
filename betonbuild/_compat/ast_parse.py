"""``ast.parse`` serialised across threads: CPython 3.11's AST constructor is not thread-safe.

CPython 3.11 keeps the AST constructor's recursion counter in one per-interpreter struct. When a
garbage collection inside ``ast.parse`` runs Python finalizers, the GIL can pass to another thread
that parses too; the two share the counter, and one of them fails with ``SystemError: AST
constructor recursion depth mismatch`` (cpython gh-106905). ffcv's Loader parses its generated
pipeline code (``ffcv/pipeline/graph.py``) on its own threads while the verification's main thread
runs, and pytest parses every module it rewrites; and a finalizer that fails inside the constructor
(numba's dispatcher finalizers raise KeyError at collection) leaves the counter wrong on one thread
alone. After the merges of this round the test suite failed this way in most runs. Every
``ast.parse`` therefore runs under one re-entrant lock with the garbage collector paused: no
finalizer, so no Python code and no thread switch, runs inside the AST constructor.
``tests/unit/compat/test_ast_parse.py`` reproduces the failure without the lock.
"""

from __future__ import annotations

import ast
import functools
import gc
import threading

from betonbuild._compat import PYTHON, Checked

CHECKED = (
    Checked(
        PYTHON,
        "3.11",
        why="ast.parse under one lock, gc paused: two threads parsing at once fail with 'AST constructor "
        "recursion depth mismatch' (cpython gh-106905); ffcv's Loader parses on its threads",
    ),
)
_LOCK = threading.RLock()


def install() -> None:
    """Wraps ``ast.parse`` once per process (idempotent): every caller that looks it up on the module,
    ffcv's graph code and pytest's assertion rewriting included, takes the lock."""
    if getattr(ast.parse, "betonbuild_locked", False):
        return
    unlocked = ast.parse

    @functools.wraps(unlocked)
    def parse(*args, **kwargs):
        with _LOCK:
            collecting = gc.isenabled()
            gc.disable()  # no finalizer (Python code, a thread switch) runs inside the AST constructor
            try:
                return unlocked(*args, **kwargs)
            finally:
                if collecting:
                    gc.enable()

    parse.betonbuild_locked = True
    ast.parse = parse
