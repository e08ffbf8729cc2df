"""Unit tests of betonbuild.beton.format, the reader: .beton files written by plain ffcv are parsed exactly,
corrupt ones refused."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from beton_files import (
    FIELD_ORDER,
    NUM_SAMPLES,
    PAGE_SIZE,
    TITLES,
    corrupt_copy,
    descriptor_offset,
    metadata_offset,
    set_header,
    write_every_field,
    write_titles,
)
from conftest import ListDataset

from betonbuild.beton.format import (
    ALLOC_TABLE_TYPE,
    ARRAY_TYPE_IDS,
    BUILTIN_POINTER_COLUMNS,
    BYTES_TYPE_ID,
    CUSTOM_TYPE_ID,
    FLOAT_TYPE_ID,
    INT_TYPE_ID,
    JSON_TYPE_ID,
    METADATA_TYPES,
    NDARRAY_TYPE_ID,
    PAYLOAD_TYPE_IDS,
    POINTER_TYPES,
    RGB_IMAGE_TYPE_ID,
    TORCH_TENSOR_TYPE_ID,
    TYPE_NAMES,
    WHOLE_COLUMN,
    BetonFile,
    UnregisteredCustomField,
    page_aligned,
)
from betonbuild.errors import BetonFormatError


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, list[tuple]]:
    return write_every_field(tmp_path_factory.mktemp("beton") / "all_fields.beton")


@pytest.fixture(scope="module")
def beton(written) -> BetonFile:
    return BetonFile(written[0])


# --- a file written by plain ffcv -----------------------------------------------------------------


def test_header_is_parsed(beton: BetonFile, written):
    assert beton.version == 2
    assert beton.num_fields == len(FIELD_ORDER)
    assert beton.page_size == PAGE_SIZE
    assert beton.num_samples == NUM_SAMPLES
    assert beton.size == written[0].stat().st_size
    assert beton.data_start % PAGE_SIZE == 0 and beton.data_start >= beton.metadata_end
    assert beton.data_start <= beton.alloc_table_ptr < beton.size
    assert (beton.size - beton.alloc_table_ptr) % ALLOC_TABLE_TYPE.itemsize == 0


def test_field_descriptors_are_parsed(beton: BetonFile):
    assert [f.name for f in beton.fields] == FIELD_ORDER
    assert [f.type_id for f in beton.fields] == [1, 0, 4, 6, 3, 5, 2, 2]
    assert [f.type_name for f in beton.fields] == [
        "int",
        "float",
        "ndarray",
        "torch_tensor",
        "bytes",
        "json",
        "rgb_image",
        "rgb_image",
    ]
    emb, tens = beton.field("emb"), beton.field("tens")
    assert (emb.dtype, emb.shape, emb.payload_bytes) == (np.dtype("float32"), (3, 4), 48)
    assert (tens.dtype, tens.shape, tens.payload_bytes) == (np.dtype("int16"), (5,), 10)
    assert beton.field("label").payload_bytes == 0


def test_metadata_matches_ffcvs_own_reader(beton: BetonFile, written):
    from ffcv.reader import Reader

    reader = Reader(str(written[0]))
    assert reader.num_samples == beton.num_samples
    assert list(reader.field_names) == FIELD_ORDER
    assert beton.metadata.dtype.itemsize == reader.metadata.dtype.itemsize
    assert beton.metadata.tobytes() == reader.metadata.tobytes()
    assert np.array_equal(np.asarray(beton.alloc_table).view(np.uint8), np.asarray(reader.alloc_table).view(np.uint8))


def test_int_and_float_metadata_are_the_written_values(beton: BetonFile, written):
    samples = written[1]
    assert beton.metadata["label"].tolist() == [s[0] for s in samples]
    assert beton.metadata["score"].tolist() == [s[1] for s in samples]  # exact: stored as <f8


def test_ndarray_column_returns_exactly_what_was_written(beton: BetonFile, written):
    samples = written[1]
    column = beton.ndarray_column("emb")
    assert column.shape == (NUM_SAMPLES, 3, 4) and column.dtype == np.float32
    assert np.array_equal(column, np.stack([s[2] for s in samples]))
    rows = np.array([7, 2])
    assert np.array_equal(beton.ndarray_column("emb", rows), np.stack([samples[7][2], samples[2][2]]))


def test_torch_tensor_column_returns_exactly_what_was_written(beton: BetonFile, written):
    column = beton.ndarray_column("tens")
    assert column.dtype == np.int16
    assert np.array_equal(column, np.stack([s[3].numpy() for s in written[1]]))


def test_bytes_payloads_are_exactly_what_was_written(beton: BetonFile, written):
    for row, sample in enumerate(written[1]):
        assert bytes(beton.variable_payload("blob", row)) == sample[4].tobytes()


def test_every_allocation_is_inside_the_data_region(beton: BetonFile):
    table = beton.alloc_table
    # One allocation per sample for each of emb, tens, blob, meta, raw_img and jpg_img.
    assert len(table) == 6 * NUM_SAMPLES
    assert sorted(np.bincount(table["sample_id"].astype(np.int64)).tolist()) == [6] * NUM_SAMPLES
    assert table["ptr"].min() >= beton.data_start
    assert (table["ptr"] + table["size"]).max() <= beton.alloc_table_ptr


def test_fixed_size_field_has_no_variable_payload(beton: BetonFile):
    with pytest.raises(ValueError, match="fixed-size"):
        beton.variable_payload("emb", 0)


def test_page_aligned_rounds_up_to_the_next_page_boundary():
    assert [page_aligned(n, 4096) for n in (0, 1, 4095, 4096, 4097)] == [0, 4096, 4096, 4096, 8192]


def test_the_named_type_ids_are_ffcvs_own_table():
    from ffcv.types import TYPE_ID_HANDLER

    named = {
        FLOAT_TYPE_ID: "FloatField",
        INT_TYPE_ID: "IntField",
        RGB_IMAGE_TYPE_ID: "RGBImageField",
        BYTES_TYPE_ID: "BytesField",
        NDARRAY_TYPE_ID: "NDArrayField",
        JSON_TYPE_ID: "JSONField",
        TORCH_TENSOR_TYPE_ID: "TorchTensorField",
    }
    assert {t: h.__name__ for t, h in TYPE_ID_HANDLER.items() if h is not None} == named
    assert TYPE_ID_HANDLER[CUSTOM_TYPE_ID] is None and CUSTOM_TYPE_ID == 255  # ffcv's slot for any other class
    assert (ARRAY_TYPE_IDS, PAYLOAD_TYPE_IDS) == ((4, 6), (3, 5))
    assert set(TYPE_NAMES) == {*named, CUSTOM_TYPE_ID}


def test_pointer_columns_name_a_member_of_each_built_in_metadata_type():
    assert set(BUILTIN_POINTER_COLUMNS) == set(METADATA_TYPES) and set(TYPE_NAMES) == {*METADATA_TYPES, 255}
    assert POINTER_TYPES == (2, 3, 4, 5, 6)
    for type_id, columns in BUILTIN_POINTER_COLUMNS.items():
        dtype = METADATA_TYPES[type_id]
        for column in columns:
            pointer = dtype if column == WHOLE_COLUMN else dtype[column]
            assert (pointer.kind, pointer.itemsize) == ("u", 8), (type_id, column)


def test_pointer_column_is_every_samples_payload_pointer(beton: BetonFile):
    for info in beton.fields:
        if info.type_id in POINTER_TYPES:
            pointers = beton.pointer_column(info)
            assert len(pointers) == NUM_SAMPLES and pointers.dtype == np.uint64
            assert (beton.match_allocations(pointers, np.arange(NUM_SAMPLES)) >= 0).all(), info.name


# --- corrupt files --------------------------------------------------------------------------------


def refused(path: Path, match: str) -> BetonFormatError:
    with pytest.raises(BetonFormatError, match=match) as info:
        BetonFile(path)
    assert str(path) in str(info.value)
    return info.value


def test_truncated_to_10_bytes_is_refused(written, tmp_path: Path):
    path = tmp_path / "short.beton"
    path.write_bytes(written[0].read_bytes()[:10])
    refused(path, "10 bytes is too small for a .beton header")


def test_empty_file_is_refused(tmp_path: Path):
    path = tmp_path / "empty.beton"
    path.write_bytes(b"")
    refused(path, "0 bytes is too small")


def test_alloc_table_ptr_zero_is_refused_as_an_unfinished_write(written, tmp_path: Path):
    path = corrupt_copy(written, tmp_path, lambda d: set_header(d, alloc_table_ptr=0))
    refused(path, "allocation table pointer is 0: the writer never finished this file")


def test_alloc_table_ptr_beyond_eof_is_refused(written, tmp_path: Path):
    size = written[0].stat().st_size
    path = corrupt_copy(written, tmp_path, lambda d: set_header(d, alloc_table_ptr=size + 24 * 1000))
    refused(path, f"allocation table pointer {size + 24000} is outside the file \\({size} bytes\\)")


def test_file_cut_before_its_allocation_table_is_refused(written, tmp_path: Path):
    path = tmp_path / "cut.beton"
    data = written[0].read_bytes()
    path.write_bytes(data[: BetonFile(written[0]).alloc_table_ptr - 4096])
    refused(path, "is outside the file")


def test_version_3_is_refused(written, tmp_path: Path):
    path = corrupt_copy(written, tmp_path, lambda d: set_header(d, version=3))
    refused(path, "format version 3, expected 2")


def test_huge_num_samples_is_refused_without_allocating(written, tmp_path: Path):
    path = corrupt_copy(written, tmp_path, lambda d: set_header(d, num_samples=10**12))
    refused(path, "header claims 1000000000000 samples in a")


def test_num_samples_past_the_allocation_table_is_refused(written, tmp_path: Path):
    beton = BetonFile(written[0])
    too_many = beton.alloc_table_ptr // beton.metadata_type.itemsize + 1
    path = corrupt_copy(written, tmp_path, lambda d: set_header(d, num_samples=too_many))
    refused(path, f"metadata for {too_many} samples would end at byte .* past the allocation table")


def test_unknown_type_id_77_is_refused(written, tmp_path: Path):
    def edit(data):
        data[descriptor_offset(2)] = 77

    refused(corrupt_copy(written, tmp_path, edit), r"field 2 \('emb'\) has unknown type id 77")


def test_custom_type_id_255_without_its_class_is_refused_saying_how_to_register_it(written, tmp_path: Path):
    def edit(data):
        data[descriptor_offset(0)] = 255

    error = refused(corrupt_copy(written, tmp_path, edit), r"field\(s\) 'label' are custom fields \(type id 255\)")
    assert isinstance(error, UnregisteredCustomField)
    assert "custom_handlers={'label': Class}" in str(error) and "--custom label=module:Class" in str(error)
    assert error.header["num_samples"] == NUM_SAMPLES and [f.name for f in error.fields] == FIELD_ORDER


@pytest.mark.parametrize("page_size", [0, 3, (1 << 21) + 1])
def test_page_size_not_a_power_of_two_is_refused(written, tmp_path: Path, page_size):
    path = corrupt_copy(written, tmp_path, lambda d: set_header(d, page_size=page_size))
    refused(path, f"page size {page_size} is not a power of two")


def test_zero_fields_is_refused(written, tmp_path: Path):
    refused(corrupt_copy(written, tmp_path, lambda d: set_header(d, num_fields=0)), "header declares no fields")


def test_more_descriptors_than_the_file_holds_is_refused(written, tmp_path: Path):
    def edit(data):
        size = len(data)
        del data[60000:]
        set_header(data, num_fields=65535, alloc_table_ptr=len(data), num_samples=1)
        assert size > len(data)

    refused(corrupt_copy(written, tmp_path, edit), "65535 field descriptors do not fit in the file")


def test_allocation_table_of_partial_entries_is_refused(written, tmp_path: Path):
    refused(
        corrupt_copy(written, tmp_path, lambda d: d.extend(b"\0" * 5)),
        "allocation table size is not a whole number of entries",
    )


def test_non_ascii_field_name_is_refused(written, tmp_path: Path):
    def edit(data):
        data[descriptor_offset(1) + 1] = 0xC3

    refused(corrupt_copy(written, tmp_path, edit), "field 1 name .* is not printable ASCII")


def test_empty_field_name_is_refused(written, tmp_path: Path):
    def edit(data):
        data[descriptor_offset(0) + 1] = 0

    refused(corrupt_copy(written, tmp_path, edit), "field 0 has an empty name")


def test_two_fields_with_one_name_are_refused(written, tmp_path: Path):
    def edit(data):
        start = descriptor_offset(0) + 1
        data[descriptor_offset(1) + 1 : descriptor_offset(1) + 17] = data[start : start + 16]

    refused(corrupt_copy(written, tmp_path, edit), "two fields share a name")


def test_ndarray_dtype_description_too_long_is_refused(written, tmp_path: Path):
    def edit(data):
        type_length_at = descriptor_offset(2) + 17 + 8 * 32
        data[type_length_at : type_length_at + 8] = np.uint64(10**9).tobytes()

    refused(corrupt_copy(written, tmp_path, edit), "field 2 dtype description length 1000000000 is too long")


def test_ndarray_unreadable_dtype_description_is_refused(written, tmp_path: Path):
    def edit(data):
        descr_at = descriptor_offset(2) + 17 + 8 * 33
        data[descr_at : descr_at + 4] = b"}}}}"

    refused(corrupt_copy(written, tmp_path, edit), "field 2 has an unreadable dtype description")


def test_ndarray_shape_larger_than_a_page_is_refused(written, tmp_path: Path):
    def edit(data):
        shape_at = descriptor_offset(2) + 17
        data[shape_at : shape_at + 8] = np.uint64(1 << 40).tobytes()

    refused(corrupt_copy(written, tmp_path, edit), "field 2 shape .* is larger than a page")


def test_random_bytes_are_refused(tmp_path: Path):
    path = tmp_path / "noise.beton"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 1 << 16, dtype=np.uint8).tobytes())
    with pytest.raises(BetonFormatError):
        BetonFile(path)


def test_bytes_pointer_outside_the_data_region_is_refused_on_read(written, tmp_path: Path):
    good = BetonFile(written[0])
    at = metadata_offset(good, "blob", 3, "ptr")
    path = corrupt_copy(written, tmp_path, lambda d: d.__setitem__(slice(at, at + 8), np.uint64(10).tobytes()))
    beton = BetonFile(path)
    with pytest.raises(BetonFormatError, match=r"payload \[10, .*\) lies outside the data region"):
        beton.variable_payload("blob", 3)
    assert bytes(beton.variable_payload("blob", 2)) == written[1][2][4].tobytes()


def test_json_size_past_the_allocation_table_is_refused_on_read(written, tmp_path: Path):
    good = BetonFile(written[0])
    at = metadata_offset(good, "meta", 0, "size")
    path = corrupt_copy(written, tmp_path, lambda d: d.__setitem__(slice(at, at + 8), np.uint64(2**62).tobytes()))
    with pytest.raises(BetonFormatError, match="lies outside the data region"):
        BetonFile(path).variable_payload("meta", 0)


def test_ndarray_pointer_outside_the_data_region_is_refused_on_read(written, tmp_path: Path):
    good = BetonFile(written[0])
    at = metadata_offset(good, "emb", 5)
    path = corrupt_copy(written, tmp_path, lambda d: d.__setitem__(slice(at, at + 8), np.uint64(2**63).tobytes()))
    with pytest.raises(BetonFormatError, match="field 'emb' has a payload .* outside the data region"):
        BetonFile(path).ndarray_column("emb")


def test_jpeg_pointer_missing_from_the_allocation_table_is_refused(written, tmp_path: Path):
    good = BetonFile(written[0])
    at = metadata_offset(good, "jpg_img", 4, "data_ptr")
    moved = int(good.metadata["jpg_img"][4]["data_ptr"]) + 1
    path = corrupt_copy(written, tmp_path, lambda d: d.__setitem__(slice(at, at + 8), np.uint64(moved).tobytes()))
    with pytest.raises(BetonFormatError, match=f"sample 4 pointer {moved} is not in the allocation table"):
        BetonFile(path).variable_payload("jpg_img", 4)


def test_good_file_copy_still_parses(written, tmp_path: Path):
    """The corruption helpers start from a file that parses: each refusal above is due to its one edit."""
    path = tmp_path / "copy.beton"
    shutil.copyfile(written[0], path)
    beton = BetonFile(path)
    assert beton.num_samples == NUM_SAMPLES and [f.name for f in beton.fields] == FIELD_ORDER


# --- hostile values past the header ---------------------------------------------------------------


def test_sixteen_byte_name_without_nul_is_ffcvs_own_encoding_and_reads(tmp_path: Path):
    from ffcv.fields import IntField
    from ffcv.writer import DatasetWriter

    path = tmp_path / "long_name.beton"
    DatasetWriter(str(path), {"exactly_16_bytes": IntField()}, page_size=PAGE_SIZE, num_workers=1).from_indexed_dataset(
        ListDataset([(7,), (8,)])
    )
    beton = BetonFile(path)
    assert beton.fields[0].name == "exactly_16_bytes"
    assert beton.metadata["exactly_16_bytes"].tolist() == [7, 8]


def test_name_without_nul_that_is_not_printable_is_refused(written, tmp_path: Path):
    def edit(data):
        data[descriptor_offset(1) + 1 : descriptor_offset(1) + 17] = bytes(range(1, 17))

    refused(corrupt_copy(written, tmp_path, edit), "field 1 name .* has no NUL terminator and is not printable ASCII")


def test_name_with_bytes_after_its_nul_is_refused(written, tmp_path: Path):
    def edit(data):
        data[descriptor_offset(1) + 15] = ord("x")

    refused(corrupt_copy(written, tmp_path, edit), "field 1 name .* has bytes after its NUL terminator")


def _set_dtype_description(data: bytearray, index: int, text: bytes) -> None:
    at = descriptor_offset(index) + 17 + 8 * 32
    data[at : at + 8] = np.uint64(len(text)).tobytes()
    data[at + 8 : at + 8 + len(text)] = text


@pytest.mark.parametrize(
    "descr, why",
    [
        (b'[["", "|O"]]', "unsupported dtype description"),
        (b'[["", "|V8"]]', "unsupported dtype description"),
        (b'[["", "<f8", [100000000, 100000000, 100000000]]]', "unsupported dtype description|unreadable"),
        (b'[["", "<f8"], ["b", "<f8"]]', "unsupported dtype description"),
        (b'[["", "not a dtype"]]', "unreadable dtype description"),
        (b"[" * 700, "unreadable dtype description"),
    ],
)
def test_ndarray_absurd_dtype_descriptions_are_refused(written, tmp_path: Path, descr, why):
    path = corrupt_copy(written, tmp_path, lambda d: _set_dtype_description(d, 2, descr))
    refused(path, f"field 2 has an ({why})")


def test_ndarray_pointer_near_2_to_the_63_is_refused_not_overflowed(written, tmp_path: Path):
    good = BetonFile(written[0])
    at = metadata_offset(good, "emb", 5)
    path = corrupt_copy(written, tmp_path, lambda d: d.__setitem__(slice(at, at + 8), np.uint64(2**63 - 1).tobytes()))
    with pytest.raises(BetonFormatError, match="outside the data region"):
        BetonFile(path).ndarray_column("emb")


# --- custom fields --------------------------------------------------------------------------------


def test_custom_field_is_read_with_its_registered_class_like_ffcvs_reader(tmp_path: Path):
    from ffcv.reader import Reader

    from betonbuild.custom import FixedUTF8Field

    path = write_titles(tmp_path / "custom.beton")
    titles = TITLES
    beton = BetonFile(path, custom_handlers={"title": FixedUTF8Field})
    info = beton.field("title")
    assert (info.type_id, info.handler.width, info.metadata_type) == (255, 24, np.dtype(("u1", (24,))))
    assert [FixedUTF8Field.to_str(r) for r in beton.metadata["title"]] == titles
    reader = Reader(str(path), custom_handlers={"title": FixedUTF8Field})
    assert beton.metadata.tobytes() == reader.metadata.tobytes()
    assert beton.custom_allocations(0) == []
