"""``source_jpeg: keep``: source JPEGs stored byte for byte where ffcv reads them as they are, the rest
re-encoded as before, and every kept image read through the real ``ffcv.Loader``."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from betonbuild._compat.ffcv_ctypes import ffcv_imdecode
from betonbuild.beton.digest import content_digest
from betonbuild.beton.format import IMAGE_MODE_JPEG, BetonFile
from betonbuild.beton.jpeg_frame import jpeg_frame
from betonbuild.config.load import load_config
from betonbuild.demo import colour_photos
from betonbuild.errors import ConfigError, SampleError
from betonbuild.fields.kept_jpeg import KeptJPEG, keep_or_reason
from betonbuild.provenance import ffcv_build
from betonbuild.sources import open_source
from betonbuild.verify import verify_beton
from betonbuild.write.writer import write_beton

# numba's dispatcher finalizer raises KeyError when ffcv.Loader objects are collected (ffcv 1.0.2, harmless).

SIZE = (200, 160)  # width, height of the same-size folder (SimpleRGBImageDecoder needs one size)


def _photo(name: str, width: int, height: int) -> Image.Image:
    return Image.fromarray(colour_photos()[name][:height, :width])


def _save(path: Path, image: Image.Image, **options) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, **options)
    return path


@pytest.fixture(scope="module")
def same_size(tmp_path_factory) -> Path:
    """Baseline 4:2:0, progressive, 4:4:4 and greyscale JPEGs of one size: every one is kept."""
    root = tmp_path_factory.mktemp("same")
    astronaut, coffee = _photo("astronaut", *SIZE), _photo("coffee", *SIZE)
    _save(root / "a" / "baseline.jpg", astronaut, quality=90)
    _save(root / "a" / "progressive.jpg", coffee, quality=85, progressive=True)
    _save(root / "b" / "grey.jpg", astronaut.convert("L"), quality=90)
    _save(root / "b" / "s444.jpg", coffee, quality=95, subsampling=0)
    return root


@pytest.fixture(scope="module")
def quirks(tmp_path_factory) -> Path:
    """An ImageNet-like folder's quirks: CMYK, a PNG named .JPEG, one larger than max_resolution."""
    root = tmp_path_factory.mktemp("quirks")
    coffee = _photo("coffee", 260, 200)
    _save(root / "a" / "kept.JPEG", coffee, quality=90)
    _save(root / "a" / "cmyk.JPEG", coffee.convert("CMYK"), quality=90)
    _save(root / "b" / "png.JPEG", coffee, format="PNG")
    _save(root / "b" / "large.JPEG", _photo("astronaut", 512, 400), quality=90)
    return root


def _spec(root: Path, name: str = "folder", **image):
    options = {"type": "rgb_image", "write_mode": "jpg", "image_mode": "convert", "source_jpeg": "keep", **image}
    entry = {
        "source": {"kind": "image_folder", "root": str(root)},
        "fields": {"image": options, "label": {"type": "int"}},
        "verify": {"mode": "full"},
    }
    return load_config({"datasets": {name: entry}}).datasets[name]


def _write(spec, path: Path, workers: int = 1) -> dict:
    source = open_source(spec)
    with open(os.devnull, "w") as quiet:
        return write_beton(spec, source, np.arange(len(source)), path, workers, log=quiet)


def _stored(path: Path, position: int) -> tuple[int, int, int, bytes]:
    beton = BetonFile(str(path))
    record = beton.metadata["image"][position]
    data = bytes(beton.variable_payload("image", position))
    return int(record["mode"]), int(record["width"]), int(record["height"]), data


def test_kept_jpegs_are_stored_byte_for_byte_with_the_frame_header_size(same_size: Path, tmp_path: Path):
    spec = _spec(same_size)
    record = _write(spec, tmp_path / "kept.beton", workers=2)
    assert record["source_jpeg"] == {"image": {"kept": 4, "reencoded": 0, "reencoded_because": {}}}
    for position, path in enumerate(open_source(spec).files):
        mode, width, height, data = _stored(tmp_path / "kept.beton", position)
        assert (mode, width, height) == (IMAGE_MODE_JPEG, *SIZE)
        assert data == Path(path).read_bytes()


def test_the_rest_is_reencoded_as_before_and_the_record_says_why(quirks: Path, tmp_path: Path):
    keep = _spec(quirks, max_resolution=300)
    record = _write(keep, tmp_path / "keep.beton", workers=2)
    assert record["source_jpeg"]["image"] == {
        "kept": 1,
        "reencoded": 3,
        "reencoded_because": {"not_jpeg": 1, "cmyk_or_ycck": 1, "larger_than_max_resolution": 1},
    }
    _write(_spec(quirks, max_resolution=300, source_jpeg="reencode"), tmp_path / "reencode.beton")
    files = open_source(keep).files
    for position, path in enumerate(files):
        kept, again = _stored(tmp_path / "keep.beton", position), _stored(tmp_path / "reencode.beton", position)
        if path.endswith("kept.JPEG"):
            assert kept[3] == Path(path).read_bytes() and kept[3] != again[3]
        else:
            assert kept == again  # exactly what `reencode` (ffcv's way) stores


def test_reencode_stores_what_plain_ffcv_stores(quirks: Path, tmp_path: Path):
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    spec = _spec(quirks, max_resolution=300, source_jpeg="reencode")
    _write(spec, tmp_path / "ours.beton")
    source = open_source(spec)
    plain = [(Image.open(path).convert("RGB"), label) for path, label in zip(source.files, source.listing.labels)]
    fields = {"image": RGBImageField(write_mode="jpg", max_resolution=300, jpeg_quality=90), "label": IntField()}
    DatasetWriter(str(tmp_path / "plain.beton"), fields, num_workers=1).from_indexed_dataset(plain)
    ours, theirs = BetonFile(str(tmp_path / "ours.beton")), BetonFile(str(tmp_path / "plain.beton"))
    assert content_digest(ours) == content_digest(theirs)


def _loader_images(path: Path, decoder) -> np.ndarray:
    from ffcv.fields.basics import IntDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import ToTensor

    loader = Loader(
        str(path),
        batch_size=8,
        num_workers=1,
        order=OrderOption.SEQUENTIAL,
        drop_last=False,
        pipelines={"image": [decoder, ToTensor()], "label": [IntDecoder(), ToTensor()]},
    )
    return np.concatenate([images.numpy() for images, _ in loader])


def _libjpeg_turbo(path: str) -> np.ndarray:
    """The source file decoded by ffcv's own libjpeg-turbo call (its C ``imdecode``)."""
    data = np.frombuffer(Path(path).read_bytes(), dtype=np.uint8)
    width, height = SIZE
    out = np.empty((height, width, 3), dtype=np.uint8)
    assert ffcv_imdecode(data, out, height, width) == 0
    return out


@pytest.mark.slow
def test_every_kept_jpeg_reads_through_ffcvs_loader_and_decoders(same_size: Path, tmp_path: Path):
    import cv2
    from ffcv.fields.decoders import (
        CenterCropRGBImageDecoder,
        RandomResizedCropRGBImageDecoder,
        SimpleRGBImageDecoder,
    )
    from ffcv.fields.rgb_image import get_center_crop

    spec = _spec(same_size)
    _write(spec, tmp_path / "kept.beton")
    sources = [_libjpeg_turbo(path) for path in open_source(spec).files]

    simple = _loader_images(tmp_path / "kept.beton", SimpleRGBImageDecoder())
    assert len(simple) == len(sources)
    for found, expected in zip(simple, sources):
        assert np.array_equal(found, expected)  # baseline, progressive, 4:4:4 and greyscale (as RGB)
    pil = np.asarray(Image.open(open_source(spec).files[2]).convert("RGB"), dtype=np.int16)
    assert np.abs(simple[2].astype(np.int16) - pil).max() <= 8  # greyscale: the same picture as PIL's

    centre = _loader_images(tmp_path / "kept.beton", CenterCropRGBImageDecoder((64, 64), 224 / 256))
    for found, expected in zip(centre, sources):
        top, left, height, width = get_center_crop(expected.shape[0], expected.shape[1], None, 224 / 256)
        crop = cv2.resize(expected[top : top + height, left : left + width], (64, 64), interpolation=cv2.INTER_AREA)
        assert np.abs(found.astype(np.int16) - crop).max() <= 1

    random = _loader_images(tmp_path / "kept.beton", RandomResizedCropRGBImageDecoder((48, 48)))
    assert random.shape == (len(sources), 48, 48, 3)
    for found, expected in zip(random, sources):
        # A resized crop of that photo, not noise: its values within the photo's range (the crop is random
        # and unseeded, so a mean comparison failed on a dark corner of a light photo).
        assert int(expected.min()) - 2 <= int(found.min()) and int(found.max()) <= int(expected.max()) + 2


def test_a_truncated_jpeg_is_never_kept_and_names_dataset_field_index_and_file(tmp_path: Path):
    good = _save(tmp_path / "root" / "a" / "good.jpg", _photo("coffee", 120, 90), quality=90)
    cut = tmp_path / "root" / "a" / "truncated.jpg"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    assert keep_or_reason(_spec(tmp_path / "root"), cut.read_bytes()) == "truncated_or_unusual_markers"
    with pytest.raises(SampleError) as caught:
        _write(_spec(tmp_path / "root", name="cut"), tmp_path / "cut.beton")
    message = str(caught.value)
    assert "'cut'" in message and "image" in message and "index 1" in message and str(cut) in message
    assert not (tmp_path / "cut.beton").exists()


def test_frame_header_reasons_for_12_bit_arithmetic_and_rgb_jpegs():
    buffer = io.BytesIO()
    _photo("coffee", 64, 48).save(buffer, format="JPEG", quality=90)
    data = buffer.getvalue()
    sof = data.index(b"\xff\xc0")
    field = (
        load_config(
            {
                "datasets": {
                    "p": {
                        "source": {"kind": "python", "factory": "m:f"},
                        "fields": {"image": {"type": "rgb_image", "write_mode": "jpg", "source_jpeg": "keep"}},
                    }
                }
            }
        )
        .datasets["p"]
        .fields[0]
    )
    assert isinstance(keep_or_reason(field, data), KeptJPEG)
    assert jpeg_frame(data).precision == 8
    twelve = data[: sof + 4] + b"\x0c" + data[sof + 5 :]
    assert keep_or_reason(field, twelve) == "not_8_bit"
    arithmetic = data[:sof] + b"\xff\xc9" + data[sof + 2 :]
    assert keep_or_reason(field, arithmetic) == "arithmetic_or_lossless"
    ids = sof + 10  # the three component ids follow precision, height, width and the count
    rgb = data[:ids] + b"R" + data[ids + 1 : ids + 3] + b"G" + data[ids + 4 : ids + 6] + b"B" + data[ids + 7 :]
    assert keep_or_reason(field, rgb) == "rgb_colour_space"
    assert keep_or_reason(field, b"\x89PNG\r\n\x1a\n") == "not_jpeg"
    grey = io.BytesIO()
    _photo("coffee", 64, 48).convert("L").save(grey, format="JPEG")
    assert keep_or_reason(field, grey.getvalue()) == "greyscale_with_image_mode_strict"


def test_keep_needs_write_mode_jpg():
    entry = {
        "source": {"kind": "python", "factory": "m:f"},
        "fields": {"image": {"type": "rgb_image", "write_mode": "raw", "source_jpeg": "keep"}},
    }
    with pytest.raises(ConfigError, match="source_jpeg.*write_mode: jpg"):
        load_config({"datasets": {"p": entry}})


ADAPTER = """
from PIL import Image


def make(root):
    import pathlib

    files = sorted(pathlib.Path(root).rglob("*.jpg"))
    return [(f.read_bytes(), 0) for f in files] + [(Image.open(f), 1) for f in files]
"""


def test_a_python_source_keeps_jpeg_bytes_and_unloaded_pil_jpegs(same_size: Path, tmp_path: Path, monkeypatch):
    import sys

    (tmp_path / "bb_keep_adapter.py").write_text(ADAPTER)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    entry = {
        "source": {"kind": "python", "factory": "bb_keep_adapter:make", "args": {"root": str(same_size)}},
        "fields": {
            "image": {"type": "rgb_image", "write_mode": "jpg", "image_mode": "convert", "source_jpeg": "keep"},
            "label": {"type": "int"},
        },
    }
    spec = load_config({"datasets": {"py": entry}}).datasets["py"]
    try:
        record = _write(spec, tmp_path / "py.beton")
    finally:
        sys.modules.pop("bb_keep_adapter", None)
    assert record["source_jpeg"]["image"]["kept"] == 8
    files = sorted(same_size.rglob("*.jpg"))
    for position, path in enumerate(files + files):
        assert _stored(tmp_path / "py.beton", position)[3] == path.read_bytes()


def test_a_webdataset_keeps_its_jpeg_members(tmp_path: Path, monkeypatch):
    import json

    from betonbuild.sources.shards import shard_list
    from tests.wds_samples import PHOTO_KEYS, photo_samples, wds_spec, write_shard

    monkeypatch.chdir(tmp_path)
    samples = photo_samples()
    write_shard(tmp_path / "s-0.tar", samples)
    fields = {
        "image": {"type": "rgb_image", "write_mode": "jpg", "source_jpeg": "keep"},
        "label": {"type": "int"},
        "meta": {"type": "json"},
    }
    spec = wds_spec(str(tmp_path / "s-0.tar"), keys=PHOTO_KEYS, fields=fields)
    Path("shards.json").write_text(json.dumps(shard_list(spec, "cache.json")))
    source = open_source(spec, tmp_path)
    with open(os.devnull, "w") as quiet:
        record = write_beton(spec, source, np.arange(len(source)), tmp_path / "w.beton", 1, log=quiet)
    assert record["source_jpeg"]["image"] == {
        "kept": len(samples) - 1,
        "reencoded": 1,
        "reencoded_because": {"not_jpeg": 1},
    }
    for position, sample in enumerate(samples):
        if "jpg" in sample:
            assert _stored(tmp_path / "w.beton", position)[3] == sample["jpg"]


def _variable_check(spec, path: Path) -> dict:
    source = open_source(spec)
    report = verify_beton(spec, source, np.arange(len(source)), str(path), ffcv_build())
    return next(c for c in report["checks"] if c["name"] == "variable_fields")


def test_verification_counts_kept_images_and_a_tampered_kept_image_fails(quirks: Path, tmp_path: Path):
    spec = _spec(quirks, max_resolution=300)
    path = tmp_path / "keep.beton"
    _write(spec, path)
    check = _variable_check(spec, path)
    assert check["ok"], check["detail"]
    stats = check["fields"]["image"]
    assert stats["kept"] == 1 and stats["reencoded"] == 3 and stats["jpeg"] == 3
    assert stats["jpeg_mean_abs_error_mean"] > 0 and "jpeg_max_abs_error_max" in stats
    # One byte of the kept JPEG's entropy-coded data changed: a few pixels of one block, far below
    # the pixel tolerance, but the bytes differ from the source's
    kept = next(i for i, f in enumerate(open_source(spec).files) if f.endswith("kept.JPEG"))
    beton = BetonFile(str(path))
    ptr = int(beton.metadata["image"][kept]["data_ptr"])
    size = len(beton.variable_payload("image", kept))
    del beton
    with open(path, "r+b") as fh:
        fh.seek(ptr + size - 40)
        byte = fh.read(1)
        fh.seek(ptr + size - 40)
        fh.write(bytes([byte[0] ^ 0x01 if byte[0] not in (0xFF, 0xFE) else 0x10]))
    check = _variable_check(spec, path)
    assert not check["ok"]
    assert f"sample {kept}" in check["detail"] and "stored bytes differ from the source" in check["detail"]


def test_decode_reduced_decodes_at_a_dct_scale_and_stores_ffcvs_size(tmp_path: Path):
    astronaut = _photo("astronaut", 512, 480)
    _save(tmp_path / "root" / "a" / "halved.jpg", astronaut, quality=90)  # 512 -> 200: reduced 2x
    _save(tmp_path / "root" / "a" / "small.jpg", _photo("coffee", 300, 200), quality=90)  # 300 -> 200: full
    full = _spec(tmp_path / "root", max_resolution=200, source_jpeg="reencode")
    reduced = _spec(tmp_path / "root", max_resolution=200, source_jpeg="reencode", decode="reduced")
    _write(full, tmp_path / "full.beton")
    _write(reduced, tmp_path / "reduced.beton")
    a, b = BetonFile(str(tmp_path / "full.beton")), BetonFile(str(tmp_path / "reduced.beton"))
    from betonbuild.beton.payloads import decode_image

    halved = [decode_image(f, "image", 0).astype(np.int16) for f in (a, b)]
    assert halved[0].shape == halved[1].shape == (187, 200, 3)  # ffcv's own target size
    assert 0 < np.abs(halved[0] - halved[1]).mean() < 3
    assert _stored(tmp_path / "full.beton", 1) == _stored(tmp_path / "reduced.beton", 1)  # shrunk < 2x
    source = open_source(reduced)
    report = verify_beton(reduced, source, np.arange(len(source)), str(tmp_path / "reduced.beton"), ffcv_build())
    assert report["ok"], [c for c in report["checks"] if not c["ok"]]


def test_a_failing_sample_of_a_keeping_field_is_saved_and_replays(tmp_path: Path):
    from betonbuild.write.failure import replay, save_failure

    good = _save(tmp_path / "root" / "a" / "a.jpg", _photo("coffee", 120, 90), quality=90)
    _save(tmp_path / "root" / "a" / "b.jpg", _photo("coffee", 120, 90), quality=80)
    (tmp_path / "root" / "a" / "c.jpg").write_bytes(good.read_bytes()[:-300])
    spec = _spec(tmp_path / "root", name="cut")
    with pytest.raises(SampleError) as caught:
        _write(spec, tmp_path / "cut.beton")
    saved = save_failure(tmp_path / "failure", spec, open_source(spec), caught.value, "full")
    with pytest.raises(SampleError, match="index 2"):
        replay(saved)
    (tmp_path / "root" / "a" / "c.jpg").write_bytes(good.read_bytes())  # repaired: the replay passes
    values, _ = replay(saved)
    assert isinstance(values[0], KeptJPEG) and values[0].data == good.read_bytes()


def test_a_pickled_reencoded_sample_replays_from_its_file(tmp_path: Path):
    from betonbuild.write.failure import replay, save_failure

    _save(tmp_path / "root" / "a" / "a.jpg", _photo("coffee", 120, 90), quality=90)
    _save(tmp_path / "root" / "a" / "b.jpg", _photo("coffee", 120, 90).convert("L"), quality=90)
    spec = _spec(tmp_path / "root", name="grey", image_mode="strict")
    with pytest.raises(SampleError, match="mode L") as caught:
        _write(spec, tmp_path / "grey.beton")
    saved = save_failure(tmp_path / "failure", spec, open_source(spec), caught.value, "full")
    assert (saved / "sample.pkl").exists()
    with pytest.raises(SampleError, match="mode L.*index 1|index 1.*mode L"):
        replay(saved)


def test_the_merged_record_adds_up_the_parts_counts():
    from betonbuild.fields.kept_jpeg import sum_keep_counts

    parts = [
        {"image": {"kept": 3, "reencoded": 1, "reencoded_because": {"not_jpeg": 1}}},
        {"image": {"kept": 2, "reencoded": 2, "reencoded_because": {"not_jpeg": 1, "cmyk_or_ycck": 1}}},
    ]
    assert sum_keep_counts(parts) == {
        "image": {"kept": 5, "reencoded": 3, "reencoded_because": {"not_jpeg": 2, "cmyk_or_ycck": 1}}
    }


def test_jpeg_bytes_that_keep_re_encodes_are_decoded_directly_with_pil_s_pixels(tmp_path: Path, monkeypatch):
    """A python or Parquet source's JPEG bytes that are not kept (larger than max_resolution) are
    decoded as the sources' reencode decodes them: libjpeg-turbo directly once it has agreed with PIL
    on that kind of JPEG, PIL's pixels either way; bytes that decode nowhere name the sample."""
    import betonbuild.sources.jpeg as jpeg_module  # why: the direct decoder's agreement record, emptied
    from betonbuild.fields.kept_jpeg import Reencode, resolve_source_jpeg  # why: only here called directly

    monkeypatch.setattr(jpeg_module, "JPEG_KINDS", {})
    spec = _spec(tmp_path, max_resolution=64)
    field = spec.fields[0]
    data = io.BytesIO()
    _photo("coffee", 260, 200).save(data, format="JPEG", quality=90)
    expected = np.asarray(Image.open(io.BytesIO(data.getvalue())).convert("RGB"))

    def fail(message, fix):
        return SampleError(spec.name, field.name, 0, message, fix)

    first, second = (resolve_source_jpeg(field, data.getvalue(), fail) for _ in range(2))
    assert isinstance(first, Reencode) and isinstance(second, Reencode)
    assert first.reason == second.reason == "larger_than_max_resolution"
    assert isinstance(first.image, Image.Image)  # the first of its kind: PIL's, compared with the direct decode
    assert isinstance(second.image, np.ndarray) and np.array_equal(second.image, expected)
    assert np.array_equal(np.asarray(first.image), expected)
    with pytest.raises(SampleError, match="cannot decode the image's 9 bytes"):
        resolve_source_jpeg(field, b"not a jpg", fail)
