"""Import ffcv without its 2.8 s start-up cost: ``IMAGE_MODES`` as a plain dict.

``ffcv/fields/rgb_image.py`` (ffcv 1.0.2) builds ``IMAGE_MODES = numba.typed.Dict()`` at import and
sets two keys; numba compiles the typed dict's methods for that, 2.8 s in every process that imports
ffcv (each smoke, write and verify job). ffcv only ever reads it from Python: the writer's
``encode`` looks up the mode and the decoders' ``generate_code`` copy ``jpg``/``raw`` into their
compiled closures as plain ints. A plain dict with the same two entries is therefore the same
program. The finder below swaps ``numba.typed.Dict`` for ``dict`` while that one module executes,
and nowhere else; ``tests/unit/compat/test_ffcv_import.py`` pins the behaviour.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

from betonbuild._compat import Checked

CHECKED = (
    Checked(
        "ffcv",
        "1.0.2",
        why="rgb_image.py's IMAGE_MODES is a plain dict: 2.8 s of numba compilation saved in every process "
        "that imports ffcv",
    ),
    Checked("numba", "0.68.1", why="numba.typed.Dict is swapped for dict while ffcv's rgb_image module executes"),
)
MODULE = "ffcv.fields.rgb_image"


class _Loader(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, name):  # get_source, get_code, ... for tracebacks and inspect
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        import numba.typed

        numba.typed.Dict = dict  # a module attribute wins over numba.typed's lazy __getattr__
        try:
            self.loader.exec_module(module)
        finally:
            del numba.typed.Dict


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """Idempotent; does nothing once ffcv's image field is imported (it is then already built)."""
    if MODULE not in sys.modules and not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
