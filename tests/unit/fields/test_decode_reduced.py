"""``decode: reduced`` for every source that hands an ``rgb_image`` field a JPEG to decode: image
folders (also beside ``source_jpeg: keep``), webdataset rgb8 members, Parquet image bytes and a
python source's JPEG files and bytes. Each writes ffcv's size from a reduced-scale decode (pixels
near, not equal to, the full decode's), verifies, and leaves JPEGs shrunk less than 2x as before."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from betonbuild.beton.format import BetonFile
from betonbuild.beton.payloads import decode_image
from betonbuild.config.load import load_config
from betonbuild.demo import colour_photos
from betonbuild.errors import ConfigError
from betonbuild.fields.builtin_encoders import ffcv_resizer
from betonbuild.fields.reduced_decode import decoded_reduced, reduces
from betonbuild.provenance import ffcv_build
from betonbuild.sources import open_source
from betonbuild.verify import verify_beton
from betonbuild.write.writer import write_beton

MAX_RESOLUTION = 120
LARGE, SMALL = (512, 480), (180, 150)  # shrunk 2x or more by MAX_RESOLUTION; shrunk less than 2x


def _jpeg(name: str, size: tuple[int, int], quality: int = 90) -> bytes:
    out = io.BytesIO()
    Image.fromarray(colour_photos()[name][: size[1], : size[0]]).save(out, format="JPEG", quality=quality)
    return out.getvalue()


def _full_decode(data: bytes) -> np.ndarray:
    """What plain ffcv stores (before its JPEG encode): the full decode, resized by ffcv's resizer."""
    return ffcv_resizer(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")), MAX_RESOLUTION)


def _spec(source: dict, name: str = "reduced", decode: str = "reduced", **image) -> object:
    options = {"type": "rgb_image", "write_mode": "raw", "max_resolution": MAX_RESOLUTION, "decode": decode, **image}
    entry = {"source": source, "fields": {"image": options, "label": {"type": "int"}}, "verify": {"mode": "full"}}
    return load_config({"datasets": {name: entry}}).datasets[name]


def _write_and_verify(spec, path: Path) -> BetonFile:
    """Written and verified; of its two images, the first is counted as decoded reduced, by both."""
    source = open_source(spec)
    rows = np.arange(len(source))
    with open(os.devnull, "w") as quiet:
        record = write_beton(spec, source, rows, path, 2, log=quiet)
    report = verify_beton(spec, source, rows, str(path), ffcv_build())
    assert report["ok"], [c["detail"] for c in report["checks"] if not c["ok"]]
    assert record["measured_images"]["image"]["reduced_decode"] == 1
    assert next(c for c in report["checks"] if c["name"] == "variable_fields")["fields"]["image"]["reduced_decode"] == 1
    return BetonFile(str(path))


def _assert_reduced_then_full(beton: BetonFile, spec, large: bytes, small: bytes) -> None:
    """Row 0 (``large``) holds the reduced decode, row 1 (``small``) the full one, both at ffcv's size."""
    stored = [decode_image(beton, "image", i) for i in range(2)]
    expected = _full_decode(large)
    assert stored[0].shape == expected.shape
    np.testing.assert_array_equal(stored[0], decoded_reduced(spec.fields[0], large))
    difference = np.abs(stored[0].astype(np.int16) - expected).mean()
    assert 0 < difference < 8  # near the full decode's pixels (a 4x shrink: ~3 levels), and not them
    np.testing.assert_array_equal(stored[1], _full_decode(small))


def test_reduces_only_jpegs_shrunk_2x_or_more():
    spec = _spec({"kind": "image_folder", "root": "unused"})
    large, small = _jpeg("astronaut", LARGE), _jpeg("coffee", SMALL)
    assert reduces(spec.fields[0], large) and not reduces(spec.fields[0], small)
    assert not reduces(spec.fields[0], large[:-300])  # cut: decoded in full, which names the error
    png = io.BytesIO()
    Image.open(io.BytesIO(large)).save(png, format="PNG")
    assert not reduces(spec.fields[0], png.getvalue())
    assert not reduces(_spec({"kind": "image_folder", "root": "unused"}, decode="full").fields[0], large)
    assert decoded_reduced(spec.fields[0], large).shape == _full_decode(large).shape


@pytest.mark.parametrize("keep", [False, True])
def test_an_image_folder_decodes_reduced_and_keeps_what_fits(tmp_path: Path, keep: bool):
    large, small, fits = _jpeg("astronaut", LARGE), _jpeg("coffee", SMALL), _jpeg("coffee", (100, 80))
    for name, data in (("0_large.jpg", large), ("1_small.jpg", small), ("2_fits.jpg", fits)):
        (tmp_path / "root" / "a").mkdir(parents=True, exist_ok=True)
        (tmp_path / "root" / "a" / name).write_bytes(data)
    options = {"write_mode": "jpg", "source_jpeg": "keep"} if keep else {}
    spec = _spec({"kind": "image_folder", "root": str(tmp_path / "root")}, **options)
    source = open_source(spec)
    rows = np.arange(len(source))
    with open(os.devnull, "w") as quiet:
        record = write_beton(spec, source, rows, tmp_path / "out.beton", 2, log=quiet)
    assert verify_beton(spec, source, rows, str(tmp_path / "out.beton"), ffcv_build())["ok"]
    beton = BetonFile(str(tmp_path / "out.beton"))
    if keep:  # the one that fits is stored as it is; the others decoded (the large one reduced) and encoded
        counts = record["source_jpeg"]["image"]
        assert counts["kept"] == 1 and counts["reencoded_because"] == {"larger_than_max_resolution": 2}
        assert beton.variable_payload("image", 2).tobytes() == fits
        assert decode_image(beton, "image", 0).shape == _full_decode(large).shape
    else:
        _assert_reduced_then_full(beton, spec, large, small)


def test_webdataset_rgb8_members_decode_reduced(tmp_path: Path, monkeypatch):
    pytest.importorskip("webdataset")
    from wds_samples import write_shard

    from betonbuild.sources.shards import shard_list
    from betonbuild.sources.webdataset import WebDatasetSource

    monkeypatch.chdir(tmp_path)
    large, small = _jpeg("astronaut", LARGE), _jpeg("coffee", SMALL)
    write_shard(
        tmp_path / "s" / "a.tar", [{"__key__": "0", "jpg": large, "cls": 0}, {"__key__": "1", "jpg": small, "cls": 1}]
    )
    source = {"kind": "webdataset", "shards": "s/*.tar", "keys": {"image": "jpg", "label": "cls"}}
    spec = _spec(source)
    Path("shards.json").write_text(json.dumps(shard_list(spec, "cache.json")))
    wds = WebDatasetSource(spec, "shards.json")
    rows = np.arange(len(wds))
    with open(os.devnull, "w") as quiet:
        write_beton(spec, wds, rows, tmp_path / "out.beton", 1, log=quiet)
    assert verify_beton(spec, wds, rows, str(tmp_path / "out.beton"), ffcv_build())["ok"]
    _assert_reduced_then_full(BetonFile(str(tmp_path / "out.beton")), spec, large, small)


def test_parquet_image_bytes_decode_reduced(tmp_path: Path):
    large, small = _jpeg("astronaut", LARGE), _jpeg("coffee", SMALL)
    image = pa.StructArray.from_arrays(
        [pa.array([large, small], pa.binary()), pa.array(["0.jpg", "1.jpg"])], ["bytes", "path"]
    )
    pq.write_table(pa.table({"image": image, "label": pa.array([0, 1])}), tmp_path / "img.parquet")
    spec = _spec({"kind": "parquet", "path": str(tmp_path / "img.parquet")})
    _assert_reduced_then_full(_write_and_verify(spec, tmp_path / "out.beton"), spec, large, small)


FACTORY = """
from PIL import Image
class files:  # PIL JPEGs opened from their files, not loaded
    def __init__(self, paths): self.paths = paths
    def __len__(self): return len(self.paths)
    def __getitem__(self, i): return Image.open(self.paths[i]), i
def raw(paths):
    return [(open(p, "rb").read(), i) for i, p in enumerate(paths)]
"""


@pytest.mark.parametrize("factory", ["files", "bytes_kept"])
def test_a_python_source_s_pil_jpeg_files_and_bytes_decode_reduced(tmp_path: Path, monkeypatch, factory: str):
    large, small = _jpeg("astronaut", LARGE), _jpeg("coffee", SMALL)
    paths = [str(tmp_path / "large.jpg"), str(tmp_path / "small.jpg")]
    Path(paths[0]).write_bytes(large)
    Path(paths[1]).write_bytes(small)
    (tmp_path / "reduced_factory.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "reduced_factory", raising=False)
    options = {}
    if factory == "bytes_kept":  # JPEG bytes are taken only by a keeping field; neither of these fits
        options = {"write_mode": "jpg", "source_jpeg": "keep", "image_mode": "convert"}
    name = "raw" if factory == "bytes_kept" else "files"
    spec = _spec({"kind": "python", "factory": f"reduced_factory:{name}", "args": {"paths": paths}}, **options)
    beton = _write_and_verify(spec, tmp_path / "out.beton")
    if factory == "bytes_kept":  # re-encoded from the reduced decode: near the full decode, not equal
        stored, expected = decode_image(beton, "image", 0), _full_decode(large)
        assert stored.shape == expected.shape
        assert np.abs(stored.astype(np.int16) - decoded_reduced(spec.fields[0], large)).mean() < 8
        return
    _assert_reduced_then_full(beton, spec, large, small)


def test_a_python_source_s_pil_image_is_not_drafted_in_place(tmp_path: Path):
    from betonbuild.write.contract import check_sample

    path = tmp_path / "large.jpg"
    path.write_bytes(_jpeg("astronaut", LARGE))
    image = Image.open(path)  # a source may hand the same object out again
    spec = _spec({"kind": "image_folder", "root": "unused"})
    checked = check_sample(spec, (image, 0), 0)[0]
    np.testing.assert_array_equal(checked, decoded_reduced(spec.fields[0], path.read_bytes()))
    assert image.size == LARGE and image.tile  # the source's own object: not drafted, not loaded


def test_a_python_source_s_jpeg_file_gone_is_the_sample_s_error(tmp_path: Path):
    from betonbuild.errors import SampleError
    from betonbuild.write.contract import check_sample

    path = tmp_path / "gone.jpg"
    path.write_bytes(_jpeg("astronaut", LARGE))
    image = Image.open(path)  # opened, not loaded: decoded reduced from the file's bytes
    spec = _spec({"kind": "image_folder", "root": "unused"}, name="py")
    path.unlink()
    with pytest.raises(SampleError, match=r"dataset 'py', field 'image', sample index 7.*gone\.jpg"):
        check_sample(spec, (image, 0), 7)


def test_reduced_without_max_resolution_is_refused():
    entry = {
        "source": {"kind": "image_folder", "root": "r"},
        "fields": {"image": {"type": "rgb_image", "decode": "reduced"}, "label": {"type": "int"}},
    }
    with pytest.raises(ConfigError, match=r"datasets\.f\.fields\.image\.decode.*no max_resolution"):
        load_config({"datasets": {"f": entry}})


@pytest.mark.parametrize("option", [{"decode": "reduced"}, {"source_jpeg": "keep", "write_mode": "jpg"}])
def test_jpeg_options_on_an_arrays_source_are_refused(option: dict):
    image = {"type": "rgb_image", "max_resolution": 64, **option}
    entry = {
        "source": {"kind": "arrays", "columns": {"image": "images.npy", "label": "labels.npy"}},
        "fields": {"image": image, "label": {"type": "int"}},
    }
    key = next(iter(k for k in option if k != "write_mode"))
    with pytest.raises(ConfigError, match=rf"datasets\.a\.fields\.image\.{key}.*holds pixels, not JPEGs"):
        load_config({"datasets": {"a": entry}})


@pytest.mark.parametrize("keep", [False, True])
def test_the_write_record_and_the_report_count_the_reduced_decodes(tmp_path: Path, keep: bool):
    """No quality loss hidden: how many images took the reduced decode, measured at the write and
    counted again when the verification compares image by image (its measurements then unused)."""
    root = tmp_path / "root" / "a"
    root.mkdir(parents=True)
    for name, data in (("0.jpg", _jpeg("astronaut", LARGE)), ("1.jpg", _jpeg("chelsea", LARGE))):
        (root / name).write_bytes(data)
    (root / "2.jpg").write_bytes(_jpeg("coffee", SMALL))  # shrunk less than 2x: decoded in full
    options = {"write_mode": "jpg", "source_jpeg": "keep"} if keep else {"write_mode": "jpg"}
    spec = _spec({"kind": "image_folder", "root": str(tmp_path / "root")}, **options)
    source, rows, path = open_source(spec), np.arange(3), tmp_path / "out.beton"
    with open(os.devnull, "w") as quiet:
        record = write_beton(spec, source, rows, path, 2, log=quiet)
    measured = record["measured_images"]["image"]
    assert measured["reduced_decode"] == 2 and measured["jpeg"] == 3
    worst = []
    for evidence in (record["measured_images"], None):
        report = verify_beton(spec, source, rows, str(path), ffcv_build(), measured=evidence)
        stats = next(c for c in report["checks"] if c["name"] == "variable_fields")["fields"]["image"]
        assert stats["reduced_decode"] == 2, stats
        assert ("measured_at_write" in stats) == (evidence is not None)
        worst.append(stats["jpeg_mean_abs_error_max"])
    # both against the pixels the write encoded (the reduced decode), not a full decode of the source
    assert worst[1] == pytest.approx(worst[0], abs=2e-3)
    full = _spec({"kind": "image_folder", "root": str(tmp_path / "root")}, decode="full", write_mode="jpg")
    with open(os.devnull, "w") as quiet:
        record = write_beton(full, open_source(full), rows, tmp_path / "full.beton", 2, log=quiet)
    assert "reduced_decode" not in record["measured_images"]["image"]  # said only where it can happen
