"""The byte-level merge: parts written by plain ffcv, joined, read back by our reader and by ffcv.

Every built-in field type (int, float, ndarray, torch_tensor, rgb_image raw and jpg with variable
image sizes cut from real photos, variable-length bytes, json), an empty part and a one-sample part,
page sizes 2 MiB, 4 MiB and the 8 MiB default. The reference is the same samples written as ONE
file by plain ffcv. Plain ffcv cannot write a 0-sample file (it asks for a 0-byte shared memory
block), so the empty part is made by ``write_empty_beton``, which writes what ffcv would.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

ffcv = pytest.importorskip("ffcv")
import torch  # noqa: E402
from conftest import ListDataset  # noqa: E402
from ffcv.fields import (  # noqa: E402
    BytesField,
    FloatField,
    IntField,
    JSONField,
    NDArrayField,
    RGBImageField,
    TorchTensorField,
)
from ffcv.fields.decoders import CenterCropRGBImageDecoder  # noqa: E402
from ffcv.loader import Loader, OrderOption  # noqa: E402
from ffcv.reader import Reader  # noqa: E402
from ffcv.writer import DatasetWriter  # noqa: E402

from betonbuild.beton import copy as copy_module  # noqa: E402
from betonbuild.beton import merge_tables  # noqa: E402
from betonbuild.beton.format import HEADER_TYPE, BetonFile  # noqa: E402
from betonbuild.beton.merge import merge_betons, write_empty_beton  # noqa: E402
from betonbuild.beton.payloads import decode_json  # noqa: E402
from betonbuild.demo import colour_photos  # noqa: E402
from betonbuild.errors import BetonbuildError, MergeError  # noqa: E402

# ffcv's Loader leaves numba dispatchers whose finalizers raise KeyError at garbage collection:
# noise from numba/ffcv, reported by pytest as "unraisable" warnings.

MiB = 1 << 20
DEFAULT_PAGE = 8 * MiB
N = 80
# Part boundaries: a one-sample part, an empty part, then two larger ones (several pages at 2 MiB).
BOUNDS = [(0, 1), (1, 1), (1, 31), (31, N)]
ARR_SHAPE = (128, 128)
CROP = (32, 32)


def all_fields() -> dict:
    return {
        "idx": IntField(),
        "value": FloatField(),
        "arr": NDArrayField(np.dtype("<f4"), ARR_SHAPE),
        "tensor": TorchTensorField(torch.int16, (3, 5)),
        "raw": RGBImageField(write_mode="raw"),
        "jpg": RGBImageField(write_mode="jpg", jpeg_quality=90),
        "blob": BytesField(),
        "meta": JSONField(),
    }


def make_samples(n: int = N) -> list[tuple]:
    """Real photo crops of varying height and width; every other value varies per sample too."""
    photos = colour_photos()
    names = sorted(photos)
    rng = np.random.default_rng(1234)
    samples = []
    for i in range(n):
        photo = photos[names[i % len(names)]]
        h, w = int(rng.integers(17, 140)), int(rng.integers(17, 140))
        top, left = int(rng.integers(0, photo.shape[0] - h)), int(rng.integers(0, photo.shape[1] - w))
        image = np.ascontiguousarray(photo[top : top + h, left : left + w])
        samples.append(
            (
                i,
                float(rng.standard_normal()),
                rng.standard_normal(ARR_SHAPE).astype("<f4"),
                torch.from_numpy(rng.integers(-999, 999, (3, 5)).astype(np.int16)),
                image,
                image,
                rng.integers(0, 256, int(rng.integers(1, 6000))).astype(np.uint8),
                {"i": i, "name": names[i % len(names)], "tags": ["t"] * int(rng.integers(0, 40))},
            )
        )
    return samples


def write(path: Path, rows, fields=None, page_size: int = DEFAULT_PAGE) -> Path:
    fields = fields or all_fields()
    if not rows:
        write_empty_beton(path, fields, page_size)
    else:
        DatasetWriter(str(path), fields, page_size=page_size, num_workers=1).from_indexed_dataset(ListDataset(rows))
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def load(path, os_cache: bool, order, custom_fields=None) -> tuple[dict, list[int]]:
    """Every sample through ffcv.Loader: {field: [value per sample id]}, plus the order they came in."""
    names = Reader(str(path), custom_handlers=custom_fields or {}).field_names
    pipelines = {name: [CenterCropRGBImageDecoder(CROP, 1.0)] for name in ("raw", "jpg") if name in names}
    loader = Loader(
        str(path),
        batch_size=16,
        num_workers=2,
        os_cache=os_cache,
        order=order,
        seed=7,
        drop_last=False,
        pipelines=pipelines,
        custom_fields=custom_fields or {},
    )
    rows: dict[str, dict[int, np.ndarray]] = {name: {} for name in names}
    seen = []
    for batch in loader:
        ids = np.asarray(batch[0]).reshape(-1).tolist()
        seen += ids
        for name, column in zip(names, batch):
            column = column.numpy() if isinstance(column, torch.Tensor) else np.asarray(column)
            for k, sid in enumerate(ids):
                rows[name][sid] = column[k].copy()
    return {name: [values[i] for i in sorted(values)] for name, values in rows.items()}, seen


# ---------------------------------------------------------------------------------------------
# Every built-in field type, three page sizes


@pytest.fixture(scope="module")
def samples():
    return make_samples()


@pytest.fixture(scope="module")
def whole(tmp_path_factory, samples):
    """The reference: the same samples written as one file by plain ffcv, read by the Loader once."""
    path = write(tmp_path_factory.mktemp("whole") / "whole.beton", samples)
    loaded, _ = load(path, os_cache=True, order=OrderOption.SEQUENTIAL)
    return path, loaded


@pytest.fixture(scope="module")
def merges(tmp_path_factory, samples):
    """page_size -> (page_size, parts, merged path, record): the parts written by plain ffcv, merged once."""
    built = {}

    def get(page_size):
        if page_size not in built:
            root = tmp_path_factory.mktemp(f"merge{page_size >> 20}")
            parts = [
                write(root / f"part{k}.beton", samples[a:b], page_size=page_size) for k, (a, b) in enumerate(BOUNDS)
            ]
            target = root / "merged.beton"
            built[page_size] = page_size, parts, target, merge_betons(parts, target)
        return built[page_size]

    return get


PAGE_SIZES = pytest.mark.parametrize("page_size", [2 * MiB, 4 * MiB, DEFAULT_PAGE], ids=["2MiB", "4MiB", "8MiB"])


@pytest.fixture
def merged(merges, page_size):
    return merges(page_size)


@PAGE_SIZES
def test_record_and_layout(merged, samples):
    page_size, parts, target, record = merged
    assert record["num_samples"] == N
    assert record["samples_per_part"] == [b - a for a, b in BOUNDS]
    assert record["method"] in ("copy_file_range", "buffered", "copy_file_range+buffered")
    assert record["size"] == target.stat().st_size
    assert record["bytes_copied"] == sum(p["used_bytes"] for p in record["parts"])
    assert all(0 <= p["used_bytes"] <= p["data_bytes"] for p in record["parts"]) and record["bytes_copied"] > 0
    assert [p["first_sample"] for p in record["parts"]] == [a for a, _ in BOUNDS]
    for p in record["parts"]:
        assert p["target_offset"] % page_size == 0 and p["shift"] % page_size == 0 and p["shift"] >= 0
    if page_size == 2 * MiB:
        assert max(p["data_bytes"] for p in record["parts"]) > 2 * page_size  # multi-page parts are covered
    header = np.fromfile(target, dtype=HEADER_TYPE, count=1)[0]
    assert (int(header["version"]), int(header["page_size"]), int(header["num_samples"])) == (2, page_size, N)
    # Every allocation stays inside one page (ffcv's page arithmetic) and names a valid sample.
    reader = Reader(str(target))
    table = reader.alloc_table
    assert len(table) == sum(len(Reader(str(p)).alloc_table) for p in parts)
    assert (table["ptr"] // page_size == (table["ptr"] + table["size"] - 1) // page_size).all()
    assert table["sample_id"].max() == N - 1 and len(np.unique(table["ptr"])) == len(table)
    # Every payload pointer in the metadata is an allocation of that same sample.
    pairs = set(zip(table["sample_id"].tolist(), table["ptr"].tolist()))
    columns = dict(zip(reader.field_names, reader.metadata.dtype.names))
    for field, sub in [
        ("arr", None),
        ("tensor", None),
        ("raw", "data_ptr"),
        ("jpg", "data_ptr"),
        ("blob", "ptr"),
        ("meta", "ptr"),
    ]:
        column = reader.metadata[columns[field]]
        pointers = (column[sub] if sub else column).tolist()
        assert all((i, p) in pairs for i, p in enumerate(pointers)), field
    assert len(pairs) == 6 * N


@PAGE_SIZES
def test_ffcv_reader_metadata_matches_one_file(merged, whole):
    """Non-pointer metadata columns and per-sample allocation sizes equal those of the one-file write."""
    _, _, target, _ = merged
    a, b = Reader(str(target)), Reader(str(whole[0]))
    assert a.field_names == b.field_names and a.num_samples == b.num_samples == N
    assert a.metadata.dtype == b.metadata.dtype
    names = dict(zip(a.field_names, a.metadata.dtype.names))
    for field, sub in [
        ("idx", None),
        ("value", None),
        ("raw", "mode"),
        ("raw", "width"),
        ("raw", "height"),
        ("jpg", "mode"),
        ("jpg", "width"),
        ("jpg", "height"),
        ("blob", "size"),
        ("meta", "size"),
    ]:
        col_a, col_b = a.metadata[names[field]], b.metadata[names[field]]
        if sub:
            col_a, col_b = col_a[sub], col_b[sub]
        np.testing.assert_array_equal(col_a, col_b, err_msg=f"{field}.{sub}")
    key = lambda t: np.sort(t[["sample_id", "size"]], order=["sample_id", "size"])  # noqa: E731
    np.testing.assert_array_equal(key(a.alloc_table), key(b.alloc_table))


@PAGE_SIZES
def test_our_reader_reads_every_sample(merged, whole, samples):
    _, _, target, _ = merged
    beton, reference = BetonFile(target), BetonFile(whole[0])
    assert [f.name for f in beton.fields] == list(all_fields())
    np.testing.assert_array_equal(beton.metadata["idx"], np.arange(N))
    np.testing.assert_array_equal(beton.metadata["value"], [s[1] for s in samples])
    np.testing.assert_array_equal(beton.ndarray_column("arr"), np.stack([s[2] for s in samples]))
    np.testing.assert_array_equal(beton.ndarray_column("tensor"), np.stack([s[3].numpy() for s in samples]))
    for i, s in enumerate(samples):
        assert bytes(beton.variable_payload("raw", i)) == s[4].tobytes()
        assert bytes(beton.variable_payload("jpg", i)) == bytes(reference.variable_payload("jpg", i))
        assert bytes(beton.variable_payload("blob", i)) == s[6].tobytes()
        assert decode_json(beton.variable_payload("meta", i)) == s[7]


# Every Loader costs ~3 s of numba compilation: the full os_cache x order matrix runs at 2 MiB,
# RANDOM order in both memory modes at the other page sizes.
LOADER_CASES = [
    (2 * MiB, True, "SEQUENTIAL"),
    (2 * MiB, False, "SEQUENTIAL"),
    (2 * MiB, True, "RANDOM"),
    (2 * MiB, False, "RANDOM"),
    (4 * MiB, True, "RANDOM"),
    (4 * MiB, False, "RANDOM"),
    (DEFAULT_PAGE, True, "RANDOM"),
    (DEFAULT_PAGE, False, "RANDOM"),
]


@pytest.mark.slow  # ffcv's Loader (numba compilation) on 8 layouts: about 20 s
@pytest.mark.parametrize(
    "page_size,os_cache,order",
    LOADER_CASES,
    ids=[f"{p >> 20}MiB-{'os_cache' if c else 'process_cache'}-{o}" for p, c, o in LOADER_CASES],
)
def test_ffcv_loader_reads_every_sample(merged, whole, samples, page_size, os_cache, order):
    loaded, seen = load(merged[2], os_cache, getattr(OrderOption, order))
    assert sorted(seen) == list(range(N))
    if order == "RANDOM":
        assert seen != list(range(N))
    else:
        assert seen == list(range(N))
    reference = whole[1]
    for i, s in enumerate(samples):
        assert int(np.asarray(loaded["idx"][i]).reshape(-1)[0]) == i
        assert np.asarray(loaded["value"][i]).reshape(-1)[0] == s[1]
        np.testing.assert_array_equal(loaded["arr"][i], s[2])
        np.testing.assert_array_equal(loaded["tensor"][i], s[3].numpy())
        np.testing.assert_array_equal(loaded["raw"][i], reference["raw"][i])
        np.testing.assert_array_equal(loaded["jpg"][i], reference["jpg"][i])
        assert bytes(loaded["blob"][i][: s[6].size]) == s[6].tobytes()
        assert JSONField.unpack(loaded["meta"][i]) == s[7]
    # The raw images decoded by the Loader from the one-file write are the source crops, centre-cropped.
    assert reference["raw"][0].shape == (*CROP, 3)


@PAGE_SIZES
def test_merging_one_part_reproduces_it(merged, tmp_path):
    parts = merged[1]
    record = merge_betons([parts[3]], tmp_path / "one.beton")
    assert sha256(tmp_path / "one.beton") == sha256(parts[3])
    assert record["parts"][0]["shift"] == 0


def test_empty_parts(tmp_path, samples):
    empty = write(tmp_path / "empty.beton", [])
    assert Reader(str(empty)).num_samples == 0
    only = merge_betons([empty, empty], tmp_path / "only_empty.beton")
    assert only["num_samples"] == 0 and only["bytes_copied"] == 0
    assert Reader(str(tmp_path / "only_empty.beton")).num_samples == 0
    small = write(tmp_path / "small.beton", samples[:3])
    merge_betons([empty, small, empty], tmp_path / "m.beton")
    assert sha256(tmp_path / "m.beton") == sha256(small)  # empty parts contribute nothing


def test_many_small_parts_copy_only_their_used_bytes(tmp_path):
    """ffcv writes each part's last data page whole (8 MiB for 5 rows here); the merge copies each
    part up to its last allocation's end and leaves the rest a hole: 1,000 parts of 100 rows made a
    merged file of 8.4 GB on disk for 1.6 MB of rows. Layout and content are as before."""
    fields = lambda: {"idx": IntField(), "blob": BytesField()}  # noqa: E731
    rows = [(i, np.full(100 + i, i, dtype=np.uint8)) for i in range(20)]
    parts = [write(tmp_path / f"{k}.beton", rows[5 * k : 5 * k + 5], fields(), page_size=8 * MiB) for k in range(4)]
    whole = write(tmp_path / "whole.beton", rows, fields(), page_size=8 * MiB)
    record = merge_betons(parts, tmp_path / "m.beton")
    used = [p["used_bytes"] for p in record["parts"]]
    assert [p["data_bytes"] for p in record["parts"]] == [8 * MiB] * 4
    assert record["bytes_copied"] == sum(used) == sum(100 + i for i in range(20))
    merged = tmp_path / "m.beton"
    assert merged.stat().st_blocks * 512 < 4 * MiB < record["size"]  # holes where ffcv's pages were unused
    for path in (merged, whole):  # the merged file reads through ffcv.Loader as the whole write does
        loaded, _ = load(path, True, OrderOption.SEQUENTIAL)
        assert [int(np.asarray(v).reshape(-1)[0]) for v in loaded["idx"]] == list(range(20))
        assert all(np.array_equal(loaded["blob"][i][: len(blob)], blob) for i, (_, blob) in enumerate(rows))


def test_part_with_a_partial_last_page(tmp_path):
    """ffcv always writes whole pages; a part whose data ends mid-page is padded to a whole page."""
    fields = lambda: {"idx": IntField(), "blob": BytesField()}  # noqa: E731
    rows = [(i, np.full(1000 + i, i, dtype=np.uint8)) for i in range(6)]
    full = write(tmp_path / "full.beton", rows[:3], fields(), page_size=2 * MiB)
    other = write(tmp_path / "other.beton", rows[3:], fields(), page_size=2 * MiB)
    reader = Reader(str(full))
    table = reader.alloc_table
    used_end = int((table["ptr"] + table["size"]).max())
    raw = full.read_bytes()
    header = np.frombuffer(raw[: HEADER_TYPE.itemsize], dtype=HEADER_TYPE).copy()
    assert int(header["alloc_table_ptr"][0]) % (2 * MiB) == 0 and used_end % (2 * MiB) != 0
    header["alloc_table_ptr"] = used_end
    cut = tmp_path / "cut.beton"
    cut.write_bytes(header.tobytes() + raw[HEADER_TYPE.itemsize : used_end] + table.tobytes())
    merge_betons([full, other], tmp_path / "a.beton")
    record = merge_betons([cut, other], tmp_path / "b.beton")
    assert record["parts"][0]["data_bytes"] < 2 * MiB and record["parts"][1]["target_offset"] % (2 * MiB) == 0
    assert sha256(tmp_path / "a.beton") == sha256(tmp_path / "b.beton")


def test_fields_without_data_pages(tmp_path):
    """Only int/float fields: no data pages; the table follows the metadata, as ffcv writes it."""
    fields = lambda: {"a": IntField(), "b": FloatField()}  # noqa: E731
    rows = [(i, i / 3) for i in range(10)]
    parts = [write(tmp_path / f"p{k}.beton", rows[a:b], fields()) for k, (a, b) in enumerate([(0, 4), (4, 10)])]
    whole = write(tmp_path / "whole.beton", rows, fields())
    merge_betons(parts, tmp_path / "m.beton")
    assert sha256(tmp_path / "m.beton") == sha256(whole)


# ---------------------------------------------------------------------------------------------
# Custom fields (type id 255)


class DeclaredBytes(BytesField):
    betonbuild_pointer_columns = ("ptr",)


class DeclaredArray(NDArrayField):
    betonbuild_pointer_columns = ("",)  # the whole <u8 column is the pointer


class UndeclaredBytes(BytesField):
    pass


def custom_rows(n, start=0):
    rng = np.random.default_rng(start)
    return [
        (
            start + i,
            rng.integers(0, 256, int(rng.integers(1, 300_000))).astype(np.uint8),
            rng.standard_normal(1000).astype("<f8"),
        )
        for i in range(n)
    ]


def test_custom_fields_with_declared_pointers(tmp_path):
    def fields():
        return {"idx": IntField(), "blob": DeclaredBytes(), "vec": DeclaredArray(np.dtype("<f8"), (1000,))}

    rows = custom_rows(40)
    parts = [
        write(tmp_path / f"p{k}.beton", rows[a:b], fields(), page_size=2 * MiB)
        for k, (a, b) in enumerate([(0, 13), (13, 14), (14, 40)])
    ]
    descriptors = np.fromfile(parts[0], np.uint8, count=3 * 1041, offset=HEADER_TYPE.itemsize)
    type_ids = descriptors[::1041].tolist()
    assert type_ids == [1, 255, 255]
    classes = {"blob": DeclaredBytes, "vec": DeclaredArray}
    target = tmp_path / "m.beton"
    merge_betons(parts, target, custom_handlers=classes)
    reader = Reader(str(target), custom_handlers=classes)
    mm = np.memmap(target, dtype=np.uint8, mode="r")
    blob, vec = reader.metadata["f1"], reader.metadata["f2"]
    for i, row in enumerate(rows):
        assert bytes(mm[int(blob["ptr"][i]) : int(blob["ptr"][i]) + int(blob["size"][i])]) == row[1].tobytes()
        assert bytes(mm[int(vec[i]) : int(vec[i]) + 8000]) == row[2].tobytes()
    loaded, seen = load(target, False, OrderOption.RANDOM, custom_fields=classes)
    assert sorted(seen) == list(range(40))
    for i, row in enumerate(rows):
        assert bytes(loaded["blob"][i][: row[1].size]) == row[1].tobytes()
        np.testing.assert_array_equal(loaded["vec"][i], row[2])


# ---------------------------------------------------------------------------------------------
# Refusals: a clear MergeError naming the part, and no file at the target


def small_fields():
    return {"idx": IntField(), "blob": BytesField()}


def small_rows(n=5, start=0):
    return [(start + i, np.full(100 + i, i, dtype=np.uint8)) for i in range(n)]


@pytest.fixture
def good(tmp_path):
    return write(tmp_path / "good.beton", small_rows(), small_fields(), page_size=2 * MiB)


def refused(parts, target, match, **kwargs):
    with pytest.raises(MergeError, match=match) as info:
        merge_betons(parts, target, **kwargs)
    assert isinstance(info.value, BetonbuildError)
    assert not Path(target).exists()
    assert not list(Path(target).parent.glob(f".{Path(target).name}.tmp-*"))
    return str(info.value)


def test_refuses_different_page_size(tmp_path, good):
    other = write(tmp_path / "other.beton", small_rows(), small_fields(), page_size=4 * MiB)
    message = refused([good, other], tmp_path / "m.beton", "page size")
    assert "part 1" in message and str(other) in message and "4194304" in message and "2097152" in message


@pytest.mark.parametrize(
    "change,match",
    [
        ({"idx": FloatField(), "blob": BytesField()}, r"'idx' has type float \(0\) where .* has type int \(1\)"),
        ({"index": IntField(), "blob": BytesField()}, r"named 'index' where .* has 'idx'"),
        ({"idx": IntField(), "blob": JSONField()}, r"'blob' has type json"),
        ({"idx": IntField()}, r"1 fields differ from .*: 2 fields"),
    ],
)
def test_refuses_different_descriptors(tmp_path, good, change, match):
    rows = [tuple(r[: len(change)]) for r in small_rows()]
    if isinstance(change.get("blob"), JSONField):
        rows = [(i, {"k": i}) for i in range(5)]
    other = write(tmp_path / "other.beton", rows, change, page_size=2 * MiB)
    message = refused([good, other], tmp_path / "m.beton", match)
    assert "part 1" in message and str(other) in message


def test_refuses_different_ndarray_arguments(tmp_path):
    a = write(tmp_path / "a.beton", [(np.zeros(4, "<f4"),)], {"x": NDArrayField(np.dtype("<f4"), (4,))})
    b = write(tmp_path / "b.beton", [(np.zeros(5, "<f4"),)], {"x": NDArrayField(np.dtype("<f4"), (5,))})
    refused([a, b], tmp_path / "m.beton", "different arguments")


def patched(src: Path, dst: Path, offset: int, value: np.ndarray) -> Path:
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as fh:
        fh.seek(offset)
        fh.write(value.tobytes())
    return dst


def test_refuses_different_version(tmp_path, good):
    v3 = patched(good, tmp_path / "v3.beton", 0, np.array([3], "<u2"))
    message = refused([good, v3], tmp_path / "m.beton", "format version 3 differs")
    assert str(v3) in message
    refused([v3, v3], tmp_path / "m.beton", "only version 2 can be merged")


def test_refuses_unfinished_part(tmp_path, good):
    crashed = patched(good, tmp_path / "crashed.beton", 16, np.array([0], "<u8"))
    message = refused([good, crashed], tmp_path / "m.beton", "allocation table pointer is 0")
    assert "never finished" in message and "part 1" in message


def test_refuses_truncated_and_corrupt_parts(tmp_path):
    big = write(tmp_path / "big.beton", small_rows(50), small_fields(), page_size=2 * MiB)
    truncated = tmp_path / "truncated.beton"
    shutil.copyfile(big, truncated)
    os.truncate(truncated, 3 * MiB)
    refused([big, truncated], tmp_path / "m.beton", "truncated or corrupt")
    reader = Reader(str(big))
    ptr_offset = HEADER_TYPE.itemsize + 1041 * 2 + reader.metadata.dtype.fields["f1"][1]  # sample 0 blob.ptr
    wild = patched(big, tmp_path / "wild.beton", ptr_offset, np.array([1 << 40], "<u8"))
    refused([big, wild], tmp_path / "m.beton", r"sample 0 field 'blob.ptr' points to byte 1099511627776")


@PAGE_SIZES
def test_tables_merged_in_blocks_of_a_few_rows_give_the_same_bytes(merged, tmp_path, monkeypatch):
    """The parts' tables are read, checked and written in blocks of rows (a few MiB at any size)."""
    _, parts, target, record = merged
    monkeypatch.setattr(merge_tables, "BLOCK_ROWS", 3)
    again = merge_betons(parts, tmp_path / "blocks.beton")
    assert sha256(tmp_path / "blocks.beton") == sha256(target)
    assert again["parts"] == record["parts"]


def test_refusals_name_the_row_past_the_first_block(tmp_path, monkeypatch):
    monkeypatch.setattr(merge_tables, "BLOCK_ROWS", 4)
    big = write(tmp_path / "big.beton", small_rows(50), small_fields(), page_size=2 * MiB)
    reader = Reader(str(big))
    record = reader.metadata.dtype.itemsize
    ptr_offset = HEADER_TYPE.itemsize + 1041 * 2 + record * 13 + reader.metadata.dtype.fields["f1"][1]
    wild = patched(big, tmp_path / "wild.beton", ptr_offset, np.array([1 << 40], "<u8"))
    refused([big, wild], tmp_path / "m.beton", r"part 1 .*sample 13 field 'blob.ptr' points to byte 1099511627776")
    table_at = int(np.frombuffer(big.read_bytes()[: HEADER_TYPE.itemsize], dtype=HEADER_TYPE)["alloc_table_ptr"][0])
    beyond = patched(big, tmp_path / "beyond.beton", table_at + 24 * 9, np.array([50], "<u8"))  # sample_id of row 9
    refused([beyond, big], tmp_path / "m.beton", r"part 0 .*allocation 9 names sample 50 of 50")


def test_a_part_changed_after_its_check_is_refused_not_merged(tmp_path, monkeypatch):
    """Tables are read twice (checked before anything is written, then shifted and written): what is
    written is checked again, so a part edited in between is refused."""
    part = write(tmp_path / "p.beton", small_rows(20), small_fields(), page_size=2 * MiB)
    reader = Reader(str(part))
    ptr_offset = HEADER_TYPE.itemsize + 1041 * 2 + reader.metadata.dtype.itemsize * 7 + 8  # sample 7 blob.ptr
    checked = merge_tables.check_tables

    def check_then_edit(p, *args):
        checked(p, *args)
        with open(p.path, "r+b") as fh:
            fh.seek(ptr_offset)
            fh.write(np.array([1 << 40], "<u8").tobytes())

    monkeypatch.setattr("betonbuild.beton.merge.check_tables", check_then_edit)
    refused([part], tmp_path / "m.beton", r"sample 7 field 'blob.ptr' points to byte 1099511627776")


def test_refuses_custom_field_without_declared_pointers(tmp_path):
    part = write(
        tmp_path / "p.beton", [(0, np.arange(9, dtype=np.uint8))], {"idx": IntField(), "blob": UndeclaredBytes()}
    )
    message = refused(
        [part, part], tmp_path / "m.beton", "betonbuild_pointer_columns", custom_handlers={"blob": UndeclaredBytes}
    )
    assert "'blob'" in message and "UndeclaredBytes" in message
    refused([part], tmp_path / "m.beton", r"custom_handlers=\{'blob': YourField\}")
    # The same bytes merge once the class declares its pointer column.
    record = merge_betons([part, part], tmp_path / "m.beton", custom_handlers={"blob": DeclaredBytes})
    assert record["num_samples"] == 2


def test_refuses_bad_pointer_declarations(tmp_path):
    class WrongName(BytesField):
        betonbuild_pointer_columns = ("offset",)

    class WrongType(BytesField):
        betonbuild_pointer_columns = "ptr"

    part = write(tmp_path / "p.beton", [(np.arange(9, dtype=np.uint8),)], {"blob": UndeclaredBytes()})
    refused([part], tmp_path / "m.beton", "'offset' is not in its metadata_type", custom_handlers={"blob": WrongName})
    refused([part], tmp_path / "m.beton", "must be a tuple", custom_handlers={"blob": WrongType})


# ---------------------------------------------------------------------------------------------
# Determinism and the copy methods


@PAGE_SIZES
def test_merge_is_deterministic(merged, tmp_path):
    _, parts, target, _ = merged
    again = tmp_path / "again.beton"
    merge_betons(parts, again)
    assert sha256(again) == sha256(target)
    buffered = merge_betons(parts, tmp_path / "buffered.beton", method="buffered")
    assert buffered["method"] == "buffered"
    assert sha256(tmp_path / "buffered.beton") == sha256(target)


def test_one_worker_writes_are_deterministic(tmp_path, samples):
    a = write(tmp_path / "a.beton", samples[:20], page_size=2 * MiB)
    b = write(tmp_path / "b.beton", samples[:20], page_size=2 * MiB)
    assert sha256(a) == sha256(b)
    merge_betons([a, a], tmp_path / "ma.beton")
    merge_betons([b, b], tmp_path / "mb.beton")
    assert sha256(tmp_path / "ma.beton") == sha256(tmp_path / "mb.beton")


@PAGE_SIZES
def test_copy_methods_give_the_same_bytes(merged, tmp_path, monkeypatch):
    _, parts, target, record = merged
    expected = sha256(target)
    assert record["method"] == "copy_file_range"  # pytest's tmp dir: a local filesystem that accepts it
    assert record["filesystem"] == copy_module.filesystem_type(tmp_path)
    buffered = merge_betons(parts, tmp_path / "buffered.beton", method="buffered")
    assert buffered["method"] == "buffered" and buffered["bytes_copied"] == record["bytes_copied"]
    assert sha256(tmp_path / "buffered.beton") == expected

    real = os.copy_file_range

    def short(src, dst, count, offset_src=None, offset_dst=None):
        return real(src, dst, min(count, 100_003), offset_src, offset_dst)

    monkeypatch.setattr(copy_module.os, "copy_file_range", short)
    record = merge_betons(parts, tmp_path / "short.beton", method="copy_file_range")
    assert record["method"] == "copy_file_range"
    assert sha256(tmp_path / "short.beton") == expected

    calls = []

    def refuse(*args):
        calls.append(args)
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(copy_module.os, "copy_file_range", refuse)
    record = merge_betons(parts, tmp_path / "fallback.beton")
    assert record["method"] == "buffered" and record["method_reason"] == "copy_file_range: EXDEV"
    assert len(calls) == 1  # refused once, then buffered for every part
    assert sha256(tmp_path / "fallback.beton") == expected
    with pytest.raises(OSError):
        merge_betons(parts, tmp_path / "forced.beton", method="copy_file_range")
    assert not (tmp_path / "forced.beton").exists()
