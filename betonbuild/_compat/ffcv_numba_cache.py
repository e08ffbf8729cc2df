"""ffcv's compiled Loader code kept in numba's on-disk cache, for the next process that reads a file.

ffcv 1.0.2's ``Compiler.compile`` njit-compiles the OS-cache manager's ``read`` and every field's
decoder without ``cache=True``, so every process that makes a ``Loader`` compiles them again: the
smoke gate's Loader batch, the full verification's, each part's. ``cache_compiled_code()`` makes
``Compiler.compile`` pass ``cache=True``, with numba's cache in ``cache_directory()`` (a directory of
the user's, as numba's and torch's own caches are; ``NUMBA_CACHE_DIR`` if set, none with
``BETONBUILD_NUMBA_CACHE=off``). Measured on a one-sample file (2 cores, loaded): a Loader batch in a
fresh process 4.8-5.0 s without the cache, 2.7-3.4 s with it. What is compiled is unchanged: numba
keys each cached entry on the function's bytecode, the values of its closure, the signature and
the CPU, and drops a module's entries when its source file changes (an ffcv upgrade). A function
numba cannot cache (generated code, dynamic globals) is compiled as before.
"""

from __future__ import annotations

import os
from pathlib import Path

from betonbuild._compat import Checked

CHECKED = (
    Checked(
        "ffcv",
        "1.0.2",
        why="Compiler.compile copied with cache=True added: the Loader's reader and decoders are compiled "
        "once per machine, not once per Loader process (~2 s of a 5 s Loader batch on a loaded machine)",
    ),
    Checked(
        "numba",
        "0.68.1",
        why="its on-disk cache (NUMBA_CACHE_DIR, keyed on bytecode, closure values, signature and CPU) "
        "holds ffcv's compiled reading code between processes",
    ),
)

SWITCH = "BETONBUILD_NUMBA_CACHE"  # a directory, or "off"


def cache_directory() -> Path | None:
    """Where the compiled code is kept; None when switched off."""
    chosen = os.environ.get(SWITCH) or os.environ.get("NUMBA_CACHE_DIR")
    if chosen == "off":
        return None
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "betonbuild" / "numba"


def cache_compiled_code() -> bool:
    """From now on in this process, ffcv's ``Compiler.compile`` caches what it compiles (see the
    module docstring). False (nothing changed) when switched off or when the directory is not
    writable. Only that directory is used: numba's other places (beside ffcv's own files, in
    site-packages) are never written."""
    from ffcv.pipeline.compiler import Compiler

    if getattr(Compiler, "betonbuild_cache", False):
        return True
    directory = cache_directory()
    if directory is None or not _writable(directory):
        return False
    from numba.core import config

    # numba reads NUMBA_* again before each compile: both say the same
    os.environ["NUMBA_CACHE_DIR"] = config.CACHE_DIR = str(directory)
    Compiler.compile = classmethod(_cached_compile)
    Compiler.betonbuild_cache = True
    return True


def _cached_compile(cls, code, signature=None):
    """ffcv 1.0.2's ``Compiler.compile`` (the same njit options), its dispatcher given a cache
    that only uses ``NUMBA_CACHE_DIR``."""
    from numba import njit
    from numba.core import typeinfer
    from numba.core.caching import CompileResultCacheImpl, FunctionCache, UserProvidedCacheLocator

    class OwnDirectoryImpl(CompileResultCacheImpl):
        _locator_classes = [UserProvidedCacheLocator]

        def check_cachable(self, cres):
            """numba's test, without its warning: a function holding ctypes pointers (ffcv's
            imdecode and memcpy) is compiled uncached, as ffcv compiles it."""
            return all(lifted.can_cache for lifted in cres.lifted) and not cres.library.has_dynamic_globals

    class OwnDirectoryCache(FunctionCache):
        _impl_class = OwnDirectoryImpl

    if not cls.is_enabled:
        return code
    parallel = bool(getattr(code, "is_parallel", False)) and cls.num_threads > 1
    dispatcher = njit(fastmath=True, nogil=True, error_model="numpy", parallel=parallel)(code)
    if _closure_pickles(code):
        try:
            dispatcher._cache = OwnDirectoryCache(code)
        except RuntimeError:  # "cannot cache function ...: no locator available" (e.g. generated code)
            pass
    if signature is not None:  # as numba's jit(signature) does
        with typeinfer.register_dispatcher(dispatcher):
            dispatcher.compile(signature)
        dispatcher.disable_compile()
    return dispatcher


def _closure_pickles(code) -> bool:
    """Whether numba can key a cache entry on ``code``'s closure: its index key is the pickled closure
    values, and a value holding ctypes pointers (gray_image's tjDecompress2 prototype, or a compiled
    function that closes over one) raises "ctypes objects containing pointers cannot be pickled"
    in the Loader's batch thread. Such code is compiled uncached, as ffcv compiles it."""
    from numba.core.serialize import dumps

    try:
        dumps(tuple(cell.cell_contents for cell in code.__closure__ or ()))
    except Exception:  # noqa: BLE001 -- pickling raises ValueError, TypeError, PicklingError, ...: all mean no
        return False
    return True


def _writable(directory: Path) -> bool:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(directory, os.W_OK | os.X_OK)
