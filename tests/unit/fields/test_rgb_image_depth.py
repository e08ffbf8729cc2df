"""rgb_image: images of more than 8 bits per channel are refused, never clipped (issue 17 item 2),
and the JPEG tolerance failure shows its digits and its fixes (items 7 and 13)."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from betonbuild.config.load import load_config
from betonbuild.demo import colour_photos
from betonbuild.errors import SampleError
from betonbuild.fields.rgb_image import KIND, digits_above
from betonbuild.sources import open_source
from betonbuild.write.contract import check_value
from betonbuild.write.writer import write_beton

FIELDS = {"strict": {"type": "rgb_image"}, "convert": {"type": "rgb_image", "image_mode": "convert"}}
SPEC = load_config({"datasets": {"scans": {"source": {"kind": "python", "factory": "m:f"}, "fields": FIELDS}}})
FIELD = {f.name: f for f in SPEC.datasets["scans"].fields}


def refused(field: str, image) -> SampleError:
    with pytest.raises(SampleError) as info:
        check_value("scans", FIELD[field], image, 7)
    assert (info.value.dataset, info.value.field, info.value.index) == ("scans", field, 7)
    return info.value


def high_depth_images() -> dict[str, Image.Image]:
    ramp = np.arange(64 * 64).reshape(64, 64)
    images = {
        "I;16": Image.fromarray(ramp.astype(np.uint16)),
        "I": Image.fromarray(ramp.astype(np.int32) * 1000),
        "F": Image.fromarray(ramp.astype(np.float32) / 7),
    }
    for mode, dtype in (("I;16B", ">u2"), ("I;16L", "<u2")):
        images[mode] = Image.frombytes(mode, (64, 64), ramp.astype(dtype).tobytes())
    return images


@pytest.mark.parametrize("mode", ["I;16", "I;16B", "I;16L", "I", "F"])
@pytest.mark.parametrize("field", ["strict", "convert"])
def test_a_high_depth_pil_image_is_refused_with_how_to_scale_it(mode, field):
    image = high_depth_images()[mode]
    assert image.mode == mode
    error = refused(field, image)
    assert f"PIL image has mode {mode} (" in error.why
    assert "would clip every value above 255, so betonbuild refuses it even with `image_mode: convert`" in error.why
    assert "scale it to 8 bits" in error.fix and "image_mode: convert" not in error.fix


def test_the_refusal_gives_the_depth_and_the_largest_value():
    assert "(16-bit integer values, largest 4095)" in refused("convert", high_depth_images()["I;16"]).why
    assert "(32-bit float values, largest 585" in refused("convert", high_depth_images()["F"]).why


@pytest.mark.parametrize("mode", ["1", "L", "LA", "P", "PA", "RGBA", "CMYK", "YCbCr"])
def test_8_bit_modes_still_convert_as_before(mode):
    photo = colour_photos()["astronaut"][:48, :64]
    image = Image.fromarray(photo).convert(mode)
    result = check_value("scans", FIELD["convert"], image, 7)
    assert result.dtype == np.uint8 and result.shape == (48, 64, 3)
    assert np.array_equal(result, np.asarray(image.convert("RGB")))
    assert "not RGB" in refused("strict", image).why


ADAPTER = textwrap.dedent(
    """
    import numpy as np
    from PIL import Image


    class Scans:
        def __len__(self):
            return 6

        def __getitem__(self, i):
            if i == 4:  # one 12-bit scan among 8-bit ones
                return Image.fromarray(np.arange(4096, dtype=np.uint16).reshape(64, 64)), i
            return Image.fromarray(np.full((64, 64), 40 * i, dtype=np.uint8)), i


    def make():
        return Scans()
    """
)


def test_the_writer_refuses_a_16_bit_image_naming_its_index(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "bb_scans_adapter.py").write_text(ADAPTER)
    fields = {"image": {"type": "rgb_image", "image_mode": "convert"}, "label": {"type": "int"}}
    source = {"kind": "python", "factory": "bb_scans_adapter:make"}
    spec = load_config({"datasets": {"scans": {"source": source, "fields": fields}}}).datasets["scans"]
    source = open_source(spec)
    with open(os.devnull, "w") as quiet, pytest.raises(SampleError) as info:
        write_beton(spec, source, np.arange(6), tmp_path / "scans.beton", 1, log=quiet)
    sys.modules.pop("bb_scans_adapter", None)
    assert (info.value.field, info.value.index) == ("image", 4)
    assert "has mode I;16 (16-bit integer values, largest 4095)" in str(info.value)
    assert not (tmp_path / "scans.beton").exists()


# --- the JPEG tolerance message ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "limit", "shown"),
    [(8.002, 8.0, "8.002"), (8.5, 8.0, "8.50"), (8.0000001, 8.0, "8.0000001"), (12.345, 8.0, "12.35")],
)
def test_a_value_above_a_limit_is_shown_with_the_digits_that_make_it_above(value, limit, shown):
    assert digits_above(value, limit) == shown


class Stored:
    """A stored JPEG image as verification gives it to ``compare``."""

    def __init__(self, image: np.ndarray, tolerance: float):
        self._image, self.tolerance, self.position = image, tolerance, 0

    def image(self, name: str):
        return self._image, False


def test_a_jpeg_error_of_8_002_against_8_0_prints_its_digits_and_the_key():
    source = np.zeros((1, 1000, 3), np.uint8)
    stored = np.full_like(source, 8)
    stored[0, 0, 0] = 14  # 2999 values off by 8 and one by 14: the mean error is 24006 / 3000 = 8.002
    stats: dict = {}
    problem = KIND.compare(FIELD["strict"], Stored(stored, 8.0), source, stats)
    assert problem == "JPEG mean absolute pixel error 8.002 exceeds the tolerance 8.0 (`verify.jpeg_mean_abs_error`)"
    KIND.report_stats(FIELD["strict"], 0, stats, 8.0)
    assert "`write_mode: raw`" in stats["fix"] and "`jpeg_quality` (now 90)" in stats["fix"]
    assert "jpeg_over_tolerance" not in stats
    at_100 = (
        load_config(
            {
                "datasets": {
                    "d": {
                        "source": {"kind": "python", "factory": "m:f"},
                        "fields": {"i": {"type": "rgb_image", "jpeg_quality": 100}},
                    }
                }
            }
        )
        .datasets["d"]
        .fields[0]
    )
    stats = {}
    KIND.compare(at_100, Stored(stored, 8.0), source, stats)
    KIND.report_stats(at_100, 0, stats, 8.0)
    assert "jpeg_quality" not in stats["fix"], "at quality 100 raising it is no fix"
    assert stats["fix"].startswith("store the images losslessly with `write_mode: raw`")
