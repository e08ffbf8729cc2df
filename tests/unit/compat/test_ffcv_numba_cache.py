"""ffcv's compiled reading code in numba's on-disk cache: a second Loader process reads the same
values from it, only the chosen directory is written, and the switch turns it off."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

# Fresh Python processes that import ffcv and compile its Loader: several seconds each.
pytestmark = pytest.mark.slow

WRITE = """
import sys, numpy as np
import betonbuild
from ffcv.writer import DatasetWriter
from ffcv.fields import RGBImageField, IntField, NDArrayField
from betonbuild.demo import colour_photos

photo = colour_photos()["astronaut"]
samples = [(np.ascontiguousarray(photo[i * 7:][:40, i * 5:][:, :50]), i, np.full(3, i, dtype=np.float32))
           for i in range(12)]
fields = {"image": RGBImageField(write_mode="jpg"), "label": IntField(),
          "vec": NDArrayField(np.dtype("float32"), (3,))}
DatasetWriter(sys.argv[1], fields, num_workers=1).from_indexed_dataset(samples)
"""

# One Loader pass in a fresh process, with betonbuild's cache switched on (or not) as the env says.
READ = """
import json, sys, time
import betonbuild
from betonbuild._compat.ffcv_numba_cache import cache_compiled_code
from ffcv.loader import Loader, OrderOption
from ffcv.fields.decoders import SimpleRGBImageDecoder, IntDecoder, NDArrayDecoder
from ffcv.pipeline.compiler import Compiler

cached = cache_compiled_code()
started = time.monotonic()
loader = Loader(sys.argv[1], batch_size=12, order=OrderOption.SEQUENTIAL,
                pipelines={"image": [SimpleRGBImageDecoder()], "label": [IntDecoder()], "vec": [NDArrayDecoder()]})
images, labels, vecs = next(iter(loader))
print(json.dumps({"cached": cached, "patched": getattr(Compiler, "betonbuild_cache", False),
                  "images": images.reshape(12, -1).sum(axis=1).tolist(), "labels": labels.ravel().tolist(),
                  "vecs": vecs.tolist(), "seconds": time.monotonic() - started}))
"""


def run(code: str, *args: str, env: dict | None = None) -> dict:
    import os

    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else {}


@pytest.fixture(scope="module")
def beton(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("numba-cache") / "data.beton"
    run(WRITE, str(path))
    return path


def ffcv_cache_files_since(started: float) -> list[str]:
    """numba cache files beside ffcv's own modules (site-packages) written since ``started``."""
    import ffcv

    root = Path(ffcv.__file__).parent
    return [str(p) for p in root.rglob("*.nb[ic]") if p.stat().st_mtime >= started]


def test_a_second_process_reads_the_same_values_from_the_cache_and_only_its_directory_is_written(beton, tmp_path):
    started = time.time() - 1
    cache = tmp_path / "cache"
    env = {"BETONBUILD_NUMBA_CACHE": str(cache)}
    uncached = run(READ, str(beton), env={"BETONBUILD_NUMBA_CACHE": "off"})
    first = run(READ, str(beton), env=env)
    entries = sorted(p.name for p in cache.rglob("*.nbi"))
    second = run(READ, str(beton), env=env)
    assert (uncached["cached"], first["cached"], second["cached"]) == (False, True, True)
    assert not uncached["patched"] and second["patched"]
    for key in ("images", "labels", "vecs"):
        assert first[key] == uncached[key] == second[key], key
    assert second["labels"] == list(range(12))
    assert np.allclose(second["vecs"], np.repeat(np.arange(12.0)[:, None], 3, axis=1))
    # the OS-cache reader and the int and ndarray decoders are cached; ffcv's imdecode (ctypes) is not
    assert any("compile_reader" in name for name in entries), entries
    assert sorted(p.name for p in cache.rglob("*.nbi")) == entries, "the second process wrote no new entry"
    assert ffcv_cache_files_since(started) == [], "numba must never write into ffcv's site-packages"


def test_an_unwritable_directory_leaves_ffcv_as_it_is(beton, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = run(READ, str(beton), env={"BETONBUILD_NUMBA_CACHE": str(blocker / "cache")})
    assert result["cached"] is False and result["patched"] is False
    assert result["labels"] == list(range(12))


# Compiled code closing over a ctypes function (as gray_image's decoder closes over tjDecompress2).
CTYPES_CLOSURE = """
import ctypes, json
import betonbuild
from betonbuild._compat.ffcv_numba_cache import cache_compiled_code
from ffcv.pipeline.compiler import Compiler

cached = cache_compiled_code()

def make():
    c_abs = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(("abs", ctypes.CDLL(None)))  # a closure value

    def absolute(x):
        return c_abs(x)
    return absolute

print(json.dumps({"cached": cached, "value": Compiler.compile(make())(-5)}))
"""


def test_code_closing_over_ctypes_pointers_is_compiled_uncached(tmp_path):
    # numba keys a cache entry on the pickled closure; a ctypes pointer cannot be pickled, which
    # failed ffcv's batch thread (and hung the Loader) before such code was left uncached
    # the code is a file: numba caches only functions whose source file it can locate
    script, cache = tmp_path / "closure.py", tmp_path / "cache"
    script.write_text(CTYPES_CLOSURE)
    for _ in range(2):
        result = run(f"import runpy; runpy.run_path({str(script)!r})", env={"BETONBUILD_NUMBA_CACHE": str(cache)})
        assert result == {"cached": True, "value": 5}
    assert not [p.name for p in cache.rglob("*absolute*")]
