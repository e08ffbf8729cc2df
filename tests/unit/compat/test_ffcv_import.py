"""betonbuild imports ffcv without compiling a numba typed dict, and that changes nothing ffcv does."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from betonbuild.demo import colour_photos

# Each test starts fresh Python processes that import ffcv (with and without the patch): about 24 s.
pytestmark = pytest.mark.slow

WRITE = """
import sys, numpy as np
{prelude}
from ffcv.writer import DatasetWriter
from ffcv.fields import RGBImageField, IntField
from betonbuild.demo import colour_photos

photo = colour_photos()["astronaut"]
images = [np.ascontiguousarray(photo[i * 7:][:40, i * 5:][:, :50]) for i in range(30)]
samples = [(img, i) for i, img in enumerate(images)]
for mode in ("jpg", "raw"):
    DatasetWriter(f"{{sys.argv[1]}}.{{mode}}", {{"image": RGBImageField(write_mode=mode), "label": IntField()}},
                  num_workers=1).from_indexed_dataset(samples)
"""

READ = """
import json, sys, numpy as np
import betonbuild
from ffcv.loader import Loader, OrderOption
from ffcv.fields.decoders import SimpleRGBImageDecoder, IntDecoder
from ffcv.fields.rgb_image import IMAGE_MODES
import numba.typed

out = {"modes": dict(IMAGE_MODES), "modes_type": type(IMAGE_MODES).__name__,
       "numba_dict": numba.typed.Dict.__module__}
for mode in ("jpg", "raw"):
    loader = Loader(f"{sys.argv[1]}.{mode}", batch_size=1, order=OrderOption.SEQUENTIAL,
                    pipelines={"image": [SimpleRGBImageDecoder()], "label": [IntDecoder()]})
    out[mode] = [[int(img.sum()), list(img.shape[1:]), int(lab[0, 0])] for img, lab in loader]
print(json.dumps(out))
"""


def run(code: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_files_written_with_and_without_the_fast_import_are_byte_identical(tmp_path: Path):
    run(WRITE.format(prelude="import ffcv  # ffcv's own import: a numba typed dict"), str(tmp_path / "plain"))
    run(WRITE.format(prelude="import betonbuild"), str(tmp_path / "fast"))
    for mode in ("jpg", "raw"):
        plain, fast = ((tmp_path / f"{side}.{mode}").read_bytes() for side in ("plain", "fast"))
        assert hashlib.sha256(plain).digest() == hashlib.sha256(fast).digest(), mode


def test_the_loader_decodes_jpg_and_raw_images_after_the_fast_import(tmp_path: Path):
    run(WRITE.format(prelude="import ffcv"), str(tmp_path / "plain"))
    out = json.loads(run(READ, str(tmp_path / "plain")))
    assert out["modes"] == {"jpg": 0, "raw": 1} and out["modes_type"] == "dict"
    assert out["numba_dict"] == "numba.typed.typeddict", "numba.typed.Dict is restored for everyone else"
    photo = colour_photos()["astronaut"]
    assert [total for total, _, _ in out["raw"]] == [int(photo[i * 7 :][:40, i * 5 :][:, :50].sum()) for i in range(30)]
    assert all(shape == [40, 50, 3] for _, shape, _ in out["raw"] + out["jpg"])
    assert [label for *_, label in out["jpg"]] == list(range(30))
    # JPEG is lossy, so the decoded jpg pixels are close to the raw ones, not equal
    for (jpg_sum, jpg_shape, _), (raw_sum, raw_shape, _) in zip(out["jpg"], out["raw"]):
        assert jpg_shape == raw_shape and abs(jpg_sum - raw_sum) < 0.02 * raw_sum


COMPILED = """
{prelude}
import ffcv
import numba.typed.typeddict as typeddict
print(len(typeddict._make_dict.signatures) + len(typeddict._setitem.signatures))
"""


def test_importing_betonbuild_first_spares_ffcv_the_typed_dict_compilation():
    assert int(run(COMPILED.format(prelude=""))) > 0, "ffcv's own import compiles the typed dict"
    assert int(run(COMPILED.format(prelude="import betonbuild"))) == 0
