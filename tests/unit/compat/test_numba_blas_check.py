"""numba's BLAS check skipped in the Loader child: the batch decodes the same values, and
scipy.linalg (0.38 s) is never imported."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_ffcv_numba_cache import WRITE, run

pytestmark = pytest.mark.slow  # fresh processes that import ffcv and compile its Loader

READ = """
import json, sys
import betonbuild
from betonbuild._compat.numba_blas_check import skip_blas_check
if sys.argv[2] == "skip":
    skip_blas_check()
from betonbuild._compat.ffcv_numba_cache import cache_compiled_code
from ffcv.loader import Loader, OrderOption
from ffcv.fields.decoders import SimpleRGBImageDecoder, IntDecoder, NDArrayDecoder

cache_compiled_code()
loader = Loader(sys.argv[1], batch_size=12, order=OrderOption.SEQUENTIAL,
                pipelines={"image": [SimpleRGBImageDecoder()], "label": [IntDecoder()], "vec": [NDArrayDecoder()]})
images, labels, vecs = next(iter(loader))
print(json.dumps({"images": images.reshape(12, -1).sum(axis=1).tolist(), "labels": labels.ravel().tolist(),
                  "vecs": vecs.tolist(), "linalg": "scipy.linalg" in sys.modules}))
"""


def test_the_loader_reads_the_same_values_without_numbas_blas_check_and_scipy_linalg_stays_unimported(tmp_path):
    beton = tmp_path / "data.beton"
    run(WRITE, str(beton))
    checked = run(READ, str(beton), "check")
    skipped = run(READ, str(beton), "skip")
    assert checked["linalg"] is True  # numba's check imported it: what the skip saves
    assert skipped["linalg"] is False
    for key in ("images", "labels", "vecs"):
        assert skipped[key] == checked[key], key
    assert skipped["labels"] == list(range(12))


CHILD = """
import json, os, sys
from betonbuild.verify import loader
loader.import_ffcv = lambda: None  # what the check is about happens before ffcv's import
sys.stdin = open(os.devnull)  # nothing asked: the child ends at once
real_exit = os._exit
def report_and_exit(code):
    print(json.dumps(sys.modules.get("scipy.linalg.cython_blas", "absent") is None))
    real_exit(code)
os._exit = report_and_exit
loader.loader_child()
"""


def test_the_loader_child_skips_the_check():
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert json.loads(done.stdout.strip().splitlines()[-1]) is True, done.stderr
