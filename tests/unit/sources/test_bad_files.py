"""Bad source files get a message naming the dataset and the file, never a traceback (issue 17,
items 2-4): object arrays, truncated .npy files, an implausible __len__, decompression bombs and
16-bit images in an image folder, decompression bombs in webdataset shards. Where a message gives
a fix, a test follows it."""

from __future__ import annotations

import io
import json
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from bad_files import HUGE_ADAPTER, write_16_bit_png, write_bomb_png
from PIL import Image
from wds_samples import wds_spec, write_shard

from betonbuild.config.load import load_config
from betonbuild.config.spec import DatasetSpec
from betonbuild.errors import SampleError, SourceError
from betonbuild.sources import open_source
from betonbuild.sources.python import ORDER_BYTES_PER_SAMPLE, physical_memory
from betonbuild.sources.shards import shard_list
from betonbuild.sources.webdataset import WebDatasetSource
from betonbuild.workflow.stages import make_source_manifest
from betonbuild.write.contract import check_sample

DIGIT_FIELDS = {"image": {"type": "ndarray", "dtype": "uint8", "shape": [8, 8]}, "label": {"type": "int"}}


def make_spec(source: dict, fields: dict, name: str = "ds", **entry) -> DatasetSpec:
    return load_config({"datasets": {name: {"source": source, "fields": fields, **entry}}}).datasets[name]


def source_error(spec: DatasetSpec) -> str:
    with pytest.raises(SourceError) as info:
        open_source(spec)
    assert info.value.dataset == spec.name
    message = str(info.value)
    assert message.startswith(f"dataset '{spec.name}': ")
    return message


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch):
    """tmp_path as the working directory; user modules imported from it are forgotten after."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield tmp_path
    for name, module in list(sys.modules.items()):
        if (getattr(module, "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


# --- arrays ---------------------------------------------------------------------------------------


def npz_spec(path: Path) -> DatasetSpec:
    columns = {"image": "image", "label": "label"}
    return make_spec({"kind": "arrays", "path": str(path), "columns": columns}, DIGIT_FIELDS)


def test_an_npz_holding_an_object_array_is_a_source_error_naming_the_file_and_the_array(tmp_path: Path):
    path = tmp_path / "mixed.npz"
    np.savez(path, image=np.zeros((3, 8, 8), np.uint8), label=np.array([1, "two", None], dtype=object))
    spec = npz_spec(path)
    message = source_error(spec)
    assert f"array 'label' of {path} holds Python objects (dtype object)" in message
    assert "save it as a numeric or fixed-width array" in message


def test_an_npz_column_saved_as_numbers_as_its_fix_says_loads(tmp_path: Path):
    path = tmp_path / "fixed.npz"
    np.savez(path, image=np.zeros((3, 8, 8), np.uint8), label=np.array([1, 2, 3], dtype=object).astype(np.int64))
    spec = npz_spec(path)
    assert len(open_source(spec)) == 3


def test_a_npy_column_of_objects_is_a_source_error(tmp_path: Path):
    np.save(tmp_path / "image.npy", np.zeros((3, 8, 8), np.uint8))
    np.save(tmp_path / "label.npy", np.array([1, None, 3], dtype=object), allow_pickle=True)
    columns = {"image": str(tmp_path / "image.npy"), "label": str(tmp_path / "label.npy")}
    message = source_error(make_spec({"kind": "arrays", "columns": columns}, DIGIT_FIELDS))
    assert f"{tmp_path / 'label.npy'} holds Python objects" in message


def test_a_truncated_npy_names_the_file_the_rows_its_header_claims_and_the_bytes_it_holds(tmp_path: Path):
    images = tmp_path / "image.npy"
    np.save(images, np.arange(100 * 64, dtype=np.uint8).reshape(100, 8, 8))
    np.save(tmp_path / "label.npy", np.arange(100, dtype=np.int64))
    header = os.path.getsize(images) - 6400
    with open(images, "r+b") as fh:
        fh.truncate(header + 40 * 64 + 10)  # 40 whole rows and a piece of the 41st
    columns = {"image": str(images), "label": str(tmp_path / "label.npy")}
    message = source_error(make_spec({"kind": "arrays", "columns": columns}, DIGIT_FIELDS))
    assert (
        f"{images} is truncated: its header claims 100 rows of uint8 [8, 8] ({header + 6400:,} bytes with the "
        f"{header}-byte header) but the file holds {header + 2570:,} bytes (40 whole rows)"
    ) in message


def test_a_file_that_is_not_an_npy_is_a_source_error(tmp_path: Path):
    (tmp_path / "image.npy").write_bytes(b"not an array at all")
    np.save(tmp_path / "label.npy", np.arange(3))
    columns = {"image": str(tmp_path / "image.npy"), "label": str(tmp_path / "label.npy")}
    message = source_error(make_spec({"kind": "arrays", "columns": columns}, DIGIT_FIELDS))
    assert f"{tmp_path / 'image.npy'} is not a readable .npy file" in message


def test_a_truncated_npz_is_a_source_error(tmp_path: Path):
    path = tmp_path / "cut.npz"
    np.savez(path, image=np.zeros((30, 8, 8), np.uint8), label=np.arange(30))
    path.write_bytes(path.read_bytes()[:500])
    spec = npz_spec(path)
    assert f"{path} is not a readable .npz file" in source_error(spec)


# --- python ---------------------------------------------------------------------------------------


def python_spec(factory: str, **entry) -> DatasetSpec:
    fields = {"x": {"type": "float"}, "y": {"type": "int"}}
    return make_spec({"kind": "python", "factory": factory}, fields, name="tab", **entry)


def test_an_implausible_len_is_refused_before_the_order_is_allocated(workdir: Path):
    (workdir / "bb_huge_adapter.py").write_text(HUGE_ADAPTER)
    assert 10**12 * ORDER_BYTES_PER_SAMPLE > physical_memory()
    message = source_error(python_spec("bb_huge_adapter:huge"))
    assert "the dataset's __len__ is 1,000,000,000,000: 1,000,000,000,000 samples need 7,450.6 GiB" in message
    assert "more than this machine's" in message and "check __len__ (it is implausibly large)" in message
    with pytest.raises(SourceError, match="implausibly large"):
        make_source_manifest(python_spec("bb_huge_adapter:huge"), str(workdir / "results" / "source.json"))
    assert not (workdir / "results" / "source.json").exists()


def test_selecting_fewer_samples_as_the_length_message_says_opens_the_source(workdir: Path):
    (workdir / "bb_huge_adapter.py").write_text(HUGE_ADAPTER)
    spec = python_spec("bb_huge_adapter:huge", writer={"indices": "0:1000", "shuffle": True})
    manifest = make_source_manifest(spec, str(workdir / "results" / "source.json"))
    assert manifest["length"] == 10**12 and manifest["num_samples"] == 1000


def test_a_len_python_cannot_represent_is_a_source_error(workdir: Path):
    (workdir / "bb_huge_adapter.py").write_text(HUGE_ADAPTER)
    assert "len() of the dataset failed: OverflowError" in source_error(python_spec("bb_huge_adapter:broken"))


# --- image folders: decompression bombs ----------------------------------------------------------


def folder_spec(root: Path, image: dict | None = None) -> DatasetSpec:
    fields = {"image": image or {"type": "rgb_image"}, "label": {"type": "int"}}
    return make_spec({"kind": "image_folder", "root": str(root)}, fields, name="photos")


def sample_error(call) -> SampleError:
    with pytest.raises(SampleError) as info:
        call()
    return info.value


def test_a_decompression_bomb_names_the_file_its_pixels_the_limit_and_how_to_raise_it(photo_folder: Path):
    bomb = photo_folder / "coffee" / "zz_bomb.png"
    write_bomb_png(bomb)
    assert bomb.stat().st_size < 200_000
    source = open_source(folder_spec(photo_folder))
    index = [rel for rel, _ in source.items].index("coffee/zz_bomb.png")
    error = sample_error(lambda: source[index])
    assert (error.dataset, error.field, error.index) == ("photos", "image", index)
    limit = Image.MAX_IMAGE_PIXELS
    assert (
        f"image file {bomb} is 900,000,000 pixels, above PIL's decompression-bomb limit of {2 * limit:,} pixels "
        f"(PIL.Image.MAX_IMAGE_PIXELS = {limit:,}"
    ) in error.why
    assert "resize it" in error.fix and "`PIL.Image.MAX_IMAGE_PIXELS = 900000000`" in error.fix
    assert "adapter" not in error.fix
    source[0]  # the other images still load


def test_a_bomb_warning_made_an_error_is_the_same_message_and_raising_the_limit_as_it_says_loads(
    photo_folder: Path, monkeypatch
):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 3000)  # the photos are 64x64 = 4096 pixels: a warning
    source = open_source(folder_spec(photo_folder))
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        error = sample_error(lambda: source[0])
    assert "is 4,096 pixels, above PIL's decompression-bomb limit of 3,000 pixels" in error.why
    assert "`PIL.Image.MAX_IMAGE_PIXELS = 4096`" in error.fix
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 4096)  # what the fix says
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        image, _ = source[0]
    assert image.size == (64, 64)


# --- webdataset shards: decompression bombs ------------------------------------------------------

BOMB_PIPELINE = """
import PIL.Image

PIL.Image.MAX_IMAGE_PIXELS = 4096  # what the message says


def decoded(dataset):
    return dataset.decode("rgb8").to_tuple("jpg;png", "cls", "json")
"""


def test_a_bomb_in_a_shard_names_the_member_and_raising_the_limit_in_a_pipeline_as_it_says_loads(
    tmp_path: Path, monkeypatch
):
    pytest.importorskip("webdataset")
    monkeypatch.chdir(tmp_path)
    samples = [{"__key__": f"k{i}", "png": png_bytes(64), "cls": i, "json": {}} for i in range(3)]
    write_shard(tmp_path / "s" / "p-0.tar", samples)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # a 64x64 image (4096 pixels) is above twice that
    spec = wds_spec("s/p-0.tar")
    Path("shards.json").write_text(json.dumps(shard_list(spec, "cache.json")))
    error = sample_error(lambda: WebDatasetSource(spec, "shards.json")[1])
    assert (error.dataset, error.field, error.index) == ("d", "image", 1)
    assert error.location == "shard s/p-0.tar, key k1"
    assert "its 'png' member is 4,096 pixels, above PIL's decompression-bomb limit of 2,000 pixels" in error.why
    assert "`pipeline:`" in error.fix and "`PIL.Image.MAX_IMAGE_PIXELS = 4096`" in error.fix
    (tmp_path / "bb_bomb_pipeline.py").write_text(BOMB_PIPELINE)
    monkeypatch.syspath_prepend(str(tmp_path))
    followed = wds_spec("s/p-0.tar", pipeline="bb_bomb_pipeline:decoded")
    image, label, _ = WebDatasetSource(followed, "shards.json")[1]
    assert image.shape == (64, 64, 3) and label == 1


def png_bytes(side: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.zeros((side, side, 3), dtype=np.uint8)).save(out, format="PNG")
    return out.getvalue()


# --- image folders: 16-bit greyscale -------------------------------------------------------------


@pytest.mark.parametrize("image_mode", ["strict", "convert"])
def test_a_16_bit_png_in_an_image_folder_is_refused_naming_the_file_even_with_convert(tmp_path: Path, image_mode):
    scan = tmp_path / "scans" / "xray" / "0.png"
    write_16_bit_png(scan)
    spec = folder_spec(tmp_path / "scans", {"type": "rgb_image", "image_mode": image_mode})
    source = open_source(spec)
    image, label = source[0]
    assert image.mode == "I;16" and np.asarray(image).max() == 4095
    error = sample_error(lambda: check_sample(spec, (image, label), 0))
    assert (error.dataset, error.field, error.index) == ("photos", "image", 0)
    assert (
        f"PIL image (file {scan}) has mode I;16 (16-bit integer values, largest 4095); "
        "PIL's .convert('RGB') would clip every value above 255"
    ) in error.why
    assert "scale it to 8 bits" in error.fix and "image_mode: convert" not in error.fix


def test_16_bit_pngs_saved_as_8_bit_as_the_fix_says_are_accepted(tmp_path: Path):
    scan = tmp_path / "scans" / "xray" / "0.png"
    write_16_bit_png(scan)
    image = np.asarray(Image.open(scan), dtype=np.float64)
    Image.fromarray(np.round(image * 255 / 4095).astype(np.uint8)).save(scan)  # scaled to 8 bits
    spec = folder_spec(tmp_path / "scans", {"type": "rgb_image", "image_mode": "convert"})
    source = open_source(spec)
    values = check_sample(spec, source[0], 0)
    assert values[0].shape == (64, 64, 3) and len(np.unique(values[0])) == 256  # every level kept
