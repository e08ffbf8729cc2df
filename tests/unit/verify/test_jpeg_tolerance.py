"""The JPEG tolerance failure names `verify.jpeg_mean_abs_error` and its fixes, once, and each fix,
followed, makes the report pass (issue 17 items 7 and 13)."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from betonbuild.config.load import load_config
from betonbuild.provenance import ffcv_build
from betonbuild.sources import open_source
from betonbuild.verify import verify_beton
from betonbuild.write.writer import write_beton

# numba's dispatcher finalizer raises KeyError when ffcv.Loader objects are collected (ffcv 1.0.2, harmless).

ADAPTER = textwrap.dedent(
    """
    import numpy as np
    from betonbuild.demo import colour_photos

    PHOTO = colour_photos()["astronaut"]


    def make(n=10):
        return [(np.ascontiguousarray(PHOTO[3 * i :][:32, 2 * i :][:, :40]), i) for i in range(n)]
    """
)
# Mean absolute error of these crops as the Loader decodes them: about 2-2.6 at jpeg_quality 90 to 100
# (ffcv's colour subsampling and fast IDCT), more at quality 20
QUALITY, TOLERANCE = 20, 3.5


@pytest.fixture
def project(tmp_path: Path, monkeypatch) -> Path:
    (tmp_path / "bb_crops_adapter.py").write_text(ADAPTER)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield tmp_path
    sys.modules.pop("bb_crops_adapter", None)


def verified(project: Path, image: dict, tolerance: float = TOLERANCE) -> dict:
    entry = {
        "source": {"kind": "python", "factory": "bb_crops_adapter:make"},
        "fields": {"image": {"type": "rgb_image", **image}, "label": {"type": "int"}},
        "verify": {"mode": "full", "jpeg_mean_abs_error": tolerance},
    }
    spec = load_config({"datasets": {"crops": entry}}).datasets["crops"]
    source = open_source(spec)
    rows = np.arange(len(source))
    with open(os.devnull, "w") as quiet:
        write_beton(spec, source, rows, project / "crops.beton", 1, log=quiet)
    report = verify_beton(spec, source, rows, str(project / "crops.beton"), ffcv_build())
    return next(c for c in report["checks"] if c["name"] == "variable_fields")


def test_the_tolerance_failure_names_the_key_and_the_fixes_once(project: Path):
    check = verified(project, {"write_mode": "jpg", "jpeg_quality": QUALITY})
    assert not check["ok"]
    detail = check["detail"]
    assert "field 'image' sample 0 (source index 0): JPEG mean absolute pixel error " in detail
    assert f"exceeds the tolerance {TOLERANCE} (`verify.jpeg_mean_abs_error`)" in detail
    assert detail.count(". Fix: ") == 1
    assert detail.endswith(
        f". Fix: raise the field's `jpeg_quality` (now {QUALITY}), store the images losslessly with `write_mode: raw`, "
        "or raise `verify.jpeg_mean_abs_error` if that loss is acceptable"
    )
    assert "fix" not in check["fields"]["image"] and "jpeg_over_tolerance" not in check["fields"]["image"]


@pytest.mark.parametrize(
    ("image", "tolerance"),
    [
        ({"write_mode": "jpg", "jpeg_quality": 95}, TOLERANCE),  # raise jpeg_quality
        ({"write_mode": "raw"}, TOLERANCE),  # store losslessly
        ({"write_mode": "jpg", "jpeg_quality": QUALITY}, 12.0),  # raise verify.jpeg_mean_abs_error
    ],
)
def test_each_fix_followed_makes_the_report_pass(project: Path, image: dict, tolerance: float):
    check = verified(project, image, tolerance)
    assert check["ok"], check["detail"]
    assert "Fix:" not in check["detail"]
