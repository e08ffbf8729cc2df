"""betonbuild's encoders of ffcv's built-in fields store what ffcv's own classes store (record,
allocations, descriptor type id and arguments), and a write of built-in fields imports no ffcv."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from betonbuild.beton.descriptors import field_descriptors, metadata_type, type_id_of
from betonbuild.fields import builtin_encoders as ours
from betonbuild.write.writer import encode_scratch


def ffcv_fields():
    from ffcv import fields

    return fields


def same_storage(theirs, mine, value) -> None:
    """Both fields store ``value`` alike: the same record bytes and the same allocations' bytes."""
    if isinstance(value, np.ndarray):
        value_copy = value.copy()
    record_theirs, buffers_theirs = encode_scratch(theirs, value)
    record_mine, buffers_mine = encode_scratch(mine, value_copy if isinstance(value, np.ndarray) else value)
    assert np.dtype(mine.metadata_type) == np.dtype(theirs.metadata_type)
    assert record_mine.tobytes() == record_theirs.tobytes()
    assert [b.tobytes() for b in buffers_mine] == [b.tobytes() for b in buffers_theirs]


def same_descriptor(theirs, mine) -> None:
    assert field_descriptors({"f": mine}).tobytes() == field_descriptors({"f": theirs}).tobytes()
    assert type_id_of(mine) == type_id_of(theirs) != 255


@pytest.mark.parametrize("value", [0, -1, 2**63 - 1, -(2**63), np.int64(7), np.uint8(200)])
def test_int(value):
    same_storage(ffcv_fields().IntField(), ours.IntEncoder(), value)
    same_descriptor(ffcv_fields().IntField(), ours.IntEncoder())


@pytest.mark.parametrize("value", [0.0, -1.5, float("nan"), float("inf"), 1e308, np.float32(0.1)])
def test_float(value):
    same_storage(ffcv_fields().FloatField(), ours.FloatEncoder(), value)
    same_descriptor(ffcv_fields().FloatField(), ours.FloatEncoder())


@pytest.mark.parametrize("value", [b"x", bytes(range(256)) * 9, b"\0"])
def test_bytes(value):
    array = np.frombuffer(value, dtype=np.uint8)
    same_storage(ffcv_fields().BytesField(), ours.BytesEncoder(), array)
    same_descriptor(ffcv_fields().BytesField(), ours.BytesEncoder())


@pytest.mark.parametrize("value", [{"a": [1, 2.5, None]}, "ünïcode ✓", [], 3, {"nested": {"deep": True}}])
def test_json(value):
    same_storage(ffcv_fields().JSONField(), ours.JSONEncoder(), value)
    same_descriptor(ffcv_fields().JSONField(), ours.JSONEncoder())


@pytest.mark.parametrize(
    ("dtype", "shape"),
    [("uint8", (8, 8)), ("<f4", (13,)), ("<f8", (2, 3, 4)), ("int16", (1,)), ("bool", (5, 1)), ("<c8", (2,))],
)
def test_ndarray(dtype, shape):
    dtype = np.dtype(dtype)
    value = (np.arange(int(np.prod(shape))) % 7).astype(dtype).reshape(shape)
    theirs, mine = ffcv_fields().NDArrayField(dtype=dtype, shape=shape), ours.NDArrayEncoder(dtype, shape)
    same_storage(theirs, mine, value)
    same_descriptor(theirs, mine)


@pytest.mark.parametrize(
    "options",
    [
        {"write_mode": "jpg", "max_resolution": 64, "jpeg_quality": 90},
        {"write_mode": "jpg", "max_resolution": None, "jpeg_quality": 75},
        {"write_mode": "raw", "max_resolution": 50},
        {"write_mode": "smart", "max_resolution": 80, "smart_threshold": 10_000},
        {"write_mode": "smart", "max_resolution": 80, "smart_threshold": None},
    ],
)
def test_rgb_image(options):
    rng = np.random.default_rng(1)
    for height, width in ((120, 90), (40, 200), (33, 33)):
        image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        same_storage(ffcv_fields().RGBImageField(**options), ours.RGBImageEncoder(**options), image)
    same_storage(ffcv_fields().RGBImageField(**options), ours.RGBImageEncoder(**options), Image.fromarray(image))
    same_descriptor(ffcv_fields().RGBImageField(**options), ours.RGBImageEncoder(**options))


def test_rgb_image_proportion_draws_from_the_same_global_rng():
    options = {"write_mode": "proportion", "max_resolution": 64, "compress_probability": 0.5}
    image = np.random.default_rng(2).integers(0, 256, (70, 70, 3), dtype=np.uint8)
    modes = []
    for seed in range(12):
        np.random.seed(seed)
        theirs = encode_scratch(ffcv_fields().RGBImageField(**options), image)
        np.random.seed(seed)
        mine = encode_scratch(ours.RGBImageEncoder(**options), image)
        assert mine[0].tobytes() == theirs[0].tobytes()
        assert [b.tobytes() for b in mine[1]] == [b.tobytes() for b in theirs[1]]
        modes.append(int(mine[0]["mode"][0]))
    assert set(modes) == {0, 1}, "both JPEG and raw were drawn"


@pytest.mark.parametrize("bad", [np.zeros((4, 4, 3), np.float32), np.zeros((4, 4, 4), np.uint8), [1, 2]])
def test_rgb_image_refuses_what_ffcv_refuses(bad):
    with pytest.raises(Exception) as theirs:
        encode_scratch(ffcv_fields().RGBImageField(), bad)
    with pytest.raises(Exception) as mine:
        encode_scratch(ours.RGBImageEncoder(), bad)
    assert type(mine.value) is type(theirs.value) and str(mine.value) == str(theirs.value)


def test_the_record_of_all_fields_is_ffcvs():
    from ffcv.types import get_metadata_type

    theirs = [ffcv_fields().IntField(), ffcv_fields().RGBImageField(), ffcv_fields().JSONField()]
    mine = [ours.IntEncoder(), ours.RGBImageEncoder(), ours.JSONEncoder()]
    assert metadata_type(dict(zip("abc", mine))) == get_metadata_type(theirs)


def test_a_subclass_of_an_ffcv_field_is_a_custom_field():
    class Mine(ffcv_fields().BytesField):
        pass

    assert type_id_of(Mine()) == 255


def test_a_write_of_builtin_fields_imports_neither_ffcv_nor_torch(tmp_path: Path):
    """The point of the encoders: no torch and numba import (2-3 s) before the first sample."""
    config = {
        "datasets": {
            "d": {
                "source": {"kind": "python", "factory": "rows:make"},
                "fields": {
                    "image": {"type": "rgb_image", "write_mode": "jpg", "max_resolution": 32},
                    "x": {"type": "ndarray", "dtype": "float32", "shape": [3]},
                    "label": {"type": "int"},
                    "score": {"type": "float"},
                    "blob": {"type": "bytes"},
                    "meta": {"type": "json"},
                },
            }
        }
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "rows.py").write_text(
        textwrap.dedent(
            """
            import numpy as np

            class Rows:
                def __len__(self):
                    return 20

                def __getitem__(self, i):
                    image = np.full((40, 50, 3), i, dtype=np.uint8)
                    return image, np.full(3, i, np.float32), i, i / 2, bytes([i + 1]), {"i": i}

            def make():
                return Rows()
            """
        )
    )
    script = textwrap.dedent(
        """
        import json
        import sys
        import numpy as np
        from betonbuild.config.load import load_config
        from betonbuild.sources import open_source
        from betonbuild.write.writer import write_beton

        spec = load_config(json.load(open("config.json"))).datasets["d"]
        source = open_source(spec)
        write_beton(spec, source, np.arange(len(source)), "out.beton", num_workers=2)
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("ffcv", "torch", "numba")))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    from betonbuild.beton.format import BetonFile

    beton = BetonFile(str(tmp_path / "out.beton"))
    assert beton.num_samples == 20
    assert list(beton.metadata["label"]) == list(range(20))
