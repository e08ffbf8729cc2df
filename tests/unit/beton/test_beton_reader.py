"""Unit tests of betonbuild.beton.format: .beton files written by plain ffcv are parsed exactly, corrupt ones
refused."""

from __future__ import annotations

import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import ListDataset

from betonbuild.beton.format import (
    ALLOC_TABLE_TYPE,
    FIELD_DESC_TYPE,
    HEADER_TYPE,
    IMAGE_MODE_JPEG,
    IMAGE_MODE_RAW,
    MAX_DECODED_PIXELS,
    BetonFile,
    UnregisteredCustomField,
    bytes_per_field,
    decode_image,
    decode_json,
    describe,
    page_usage,
    structural_checks,
)
from betonbuild.demo import colour_photos
from betonbuild.errors import BetonFormatError

PAGE_SIZE = 1 << 21
NUM_SAMPLES = 10
FIELD_ORDER = ["label", "score", "emb", "tens", "blob", "meta", "raw_img", "jpg_img"]


def make_samples() -> list[tuple]:
    """Real photo crops of varying size, and values that exercise every field."""
    import torch

    photos = colour_photos()
    names = sorted(photos)
    samples = []
    for i in range(NUM_SAMPLES):
        photo = photos[names[i % len(names)]]
        height, width = 24 + 4 * i, 40 - 2 * i
        top, left = 30 + 7 * i, 50 + 3 * i
        image = np.ascontiguousarray(photo[top : top + height, left : left + width, :3])
        samples.append(
            (
                i * 1000 - 4000,  # negative and positive ints
                i / 7 - 0.5,
                (np.arange(12, dtype=np.float32).reshape(3, 4) * (i + 1) - 0.25),
                torch.arange(5, dtype=torch.int16) * (i - 3),
                np.frombuffer(bytes(range(i, i + 3 + 5 * i)), dtype=np.uint8),
                {"index": i, "name": f"crop-{i}", "tags": ["a"] * (i % 3), "nested": {"x": i / 2, "ok": i % 2 == 0}},
                image,
                image,
            )
        )
    return samples


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, list[tuple]]:
    """One .beton written by plain ffcv (1 worker) with int, float, ndarray, torch, bytes, json, raw and jpg images."""
    import torch
    from ffcv.fields import BytesField, FloatField, IntField, JSONField, NDArrayField, RGBImageField, TorchTensorField
    from ffcv.writer import DatasetWriter

    samples = make_samples()
    path = tmp_path_factory.mktemp("beton") / "all_fields.beton"
    fields = {
        "label": IntField(),
        "score": FloatField(),
        "emb": NDArrayField(dtype=np.dtype("float32"), shape=(3, 4)),
        "tens": TorchTensorField(dtype=torch.int16, shape=(5,)),
        "blob": BytesField(),
        "meta": JSONField(),
        "raw_img": RGBImageField(write_mode="raw"),
        "jpg_img": RGBImageField(write_mode="jpg", jpeg_quality=90),
    }
    writer = DatasetWriter(str(path), fields, page_size=PAGE_SIZE, num_workers=1)
    writer.from_indexed_dataset(ListDataset(samples), chunksize=3)
    return path, samples


@pytest.fixture(scope="module")
def beton(written) -> BetonFile:
    return BetonFile(written[0])


# --- a file written by plain ffcv ----------------------------------------------------------------


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


def test_json_payloads_decode_to_what_was_written(beton: BetonFile, written):
    for row, sample in enumerate(written[1]):
        payload = beton.variable_payload("meta", row)
        assert bytes(payload).endswith(b"\0")
        assert decode_json(payload) == sample[5]


def test_raw_images_decode_exactly(beton: BetonFile, written):
    for row, sample in enumerate(written[1]):
        record = beton.metadata["raw_img"][row]
        image = sample[6]
        assert record["mode"] == IMAGE_MODE_RAW
        assert (int(record["height"]), int(record["width"])) == image.shape[:2]
        decoded = decode_image(beton, "raw_img", row)
        assert decoded.dtype == np.uint8
        assert np.array_equal(decoded, image)


def test_jpeg_images_are_ffcvs_encoding_and_decode_in_rgb_order(beton: BetonFile, written):
    for row, sample in enumerate(written[1]):
        image = sample[7]
        record = beton.metadata["jpg_img"][row]
        assert record["mode"] == IMAGE_MODE_JPEG
        assert (int(record["height"]), int(record["width"])) == image.shape[:2]
        # The payload length comes from the allocation table; it must be the exact JPEG ffcv encoded.
        ok, expected = cv2.imencode(".jpg", cv2.cvtColor(image, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 90])
        assert ok
        assert bytes(beton.variable_payload("jpg_img", row)) == expected.tobytes()
        decoded = decode_image(beton, "jpg_img", row)
        assert decoded.shape == image.shape
        assert np.array_equal(decoded, cv2.cvtColor(cv2.imdecode(expected, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB))
        error = np.abs(decoded.astype(np.int16) - image).mean()
        swapped = np.abs(decoded[..., ::-1].astype(np.int16) - image).mean()
        assert error < 8 and error < swapped


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


# --- corrupt files -------------------------------------------------------------------------------


def corrupt_copy(written, tmp_path: Path, edit) -> Path:
    """A copy of the good file with ``edit(bytearray)`` applied."""
    data = bytearray(written[0].read_bytes())
    edit(data)
    path = tmp_path / "corrupt.beton"
    path.write_bytes(bytes(data))
    return path


def set_header(data: bytearray, **values) -> None:
    header = np.frombuffer(data, dtype=HEADER_TYPE, count=1).copy()
    for key, value in values.items():
        header[key] = value
    data[: HEADER_TYPE.itemsize] = header.tobytes()


def descriptor_offset(index: int) -> int:
    return HEADER_TYPE.itemsize + FIELD_DESC_TYPE.itemsize * index


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


def metadata_offset(beton: BetonFile, field: str, row: int, member: str | None = None) -> int:
    offset = beton.metadata_start + beton.metadata_type.itemsize * row + beton.metadata_type.fields[field][1]
    if member is not None:
        offset += beton.metadata_type[field].fields[member][1]
    return offset


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


def test_undecodable_jpeg_payload_is_refused(written, tmp_path: Path):
    good = BetonFile(written[0])
    ptr = int(good.metadata["jpg_img"][1]["data_ptr"])
    size = good.allocation_size(1, ptr)

    def edit(data):
        data[ptr : ptr + size] = b"\0" * size

    path = corrupt_copy(written, tmp_path, edit)
    with pytest.raises(BetonFormatError, match="sample 1 field 'jpg_img' is not a decodable JPEG"):
        decode_image(BetonFile(path), "jpg_img", 1)


def test_good_file_copy_still_parses(written, tmp_path: Path):
    """The corruption helpers start from a file that parses: each refusal above is due to its one edit."""
    path = tmp_path / "copy.beton"
    shutil.copyfile(written[0], path)
    beton = BetonFile(path)
    assert beton.num_samples == NUM_SAMPLES and [f.name for f in beton.fields] == FIELD_ORDER


# --- hostile values past the header --------------------------------------------------------------


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


def test_unknown_image_mode_is_refused(written, tmp_path: Path):
    good = BetonFile(written[0])
    at = metadata_offset(good, "jpg_img", 3, "mode")
    path = corrupt_copy(written, tmp_path, lambda d: d.__setitem__(at, 7))
    with pytest.raises(BetonFormatError, match="sample 3 field 'jpg_img' has unknown image mode 7"):
        decode_image(BetonFile(path), "jpg_img", 3)
    checks = {c["name"]: c for c in structural_checks(BetonFile(path))}
    assert not checks["metadata_pointers"]["ok"] and "unknown image mode 7" in checks["metadata_pointers"]["detail"]


def test_jpeg_whose_header_disagrees_with_the_metadata_is_not_decoded(written, tmp_path: Path):
    good = BetonFile(written[0])
    at = metadata_offset(good, "jpg_img", 2, "width")
    path = corrupt_copy(written, tmp_path, lambda d: d.__setitem__(slice(at, at + 2), np.uint16(9).tobytes()))
    with pytest.raises(BetonFormatError, match="the JPEG is 36x32 but the metadata says 9x32"):
        decode_image(BetonFile(path), "jpg_img", 2)


def test_jpeg_claiming_a_gigantic_image_is_refused_before_decoding(written, tmp_path: Path):
    good = BetonFile(written[0])
    at = metadata_offset(good, "jpg_img", 2, "width")

    def edit(data):
        data[at : at + 4] = np.array([65535, 65535], dtype="<u2").tobytes()

    with pytest.raises(BetonFormatError, match=f"above the {MAX_DECODED_PIXELS}-pixel decode limit"):
        decode_image(BetonFile(corrupt_copy(written, tmp_path, edit)), "jpg_img", 2)


def test_json_payload_that_is_not_json_gives_a_format_error():
    with pytest.raises(BetonFormatError, match="does not decode"):
        decode_json(np.frombuffer(b'{"a": \xff}\0', dtype=np.uint8))
    with pytest.raises(BetonFormatError, match="does not decode"):
        decode_json(np.frombuffer(b"[" * 100_000 + b"\0", dtype=np.uint8))


# --- structural checks ---------------------------------------------------------------------------


def structure(path: Path, **kwargs) -> dict[str, dict]:
    return {c["name"]: c for c in structural_checks(BetonFile(path), **kwargs)}


def test_a_file_written_by_ffcv_passes_every_structural_check(written):
    checks = structure(written[0])
    assert set(checks) == {
        "data_region_aligned",
        "allocations_in_file",
        "allocations_in_one_page",
        "sample_ids",
        "no_overlap",
        "samples_on_one_page",
        "metadata_pointers",
        "no_empty_allocations",
    }
    assert all(c["ok"] for c in checks.values()), checks


def table_offset(beton: BetonFile, entry: int, member: str) -> int:
    return beton.alloc_table_ptr + ALLOC_TABLE_TYPE.itemsize * entry + ALLOC_TABLE_TYPE.fields[member][1]


def test_overlapping_allocations_are_found(written, tmp_path: Path):
    good = BetonFile(written[0])
    order = np.argsort(good.alloc_table["ptr"])
    first = int(order[0])
    at = table_offset(good, first, "size")
    grown = int(good.alloc_table["size"][first]) + 100
    checks = structure(
        corrupt_copy(written, tmp_path, lambda d: d.__setitem__(slice(at, at + 8), np.uint64(grown).tobytes()))
    )
    assert not checks["no_overlap"]["ok"] and "1 allocations overlap" in checks["no_overlap"]["detail"]


def test_allocation_crossing_a_page_and_a_sample_split_over_two_pages_are_found(written, tmp_path: Path):
    good = BetonFile(written[0])
    entry = int(np.argmax(good.alloc_table["ptr"]))
    at = table_offset(good, entry, "ptr")
    moved = good.data_start + PAGE_SIZE - 4  # straddles the end of the first page

    def edit(data):
        data[at : at + 8] = np.uint64(moved).tobytes()
        data.extend(b"\0" * PAGE_SIZE)  # a second page, so the allocation stays inside the file
        table = bytes(data[good.alloc_table_ptr : good.size])
        data[good.alloc_table_ptr : good.alloc_table_ptr + PAGE_SIZE] = b"\0" * PAGE_SIZE
        data[good.alloc_table_ptr + PAGE_SIZE :] = table
        set_header(data, alloc_table_ptr=good.alloc_table_ptr + PAGE_SIZE)

    checks = structure(corrupt_copy(written, tmp_path, edit))
    assert not checks["allocations_in_one_page"]["ok"]
    assert "1 allocations cross a page boundary" in checks["allocations_in_one_page"]["detail"]
    assert not checks["metadata_pointers"]["ok"]  # the metadata still points at the old place


def test_sample_whose_allocations_lie_on_two_pages_is_found(written, tmp_path: Path):
    good = BetonFile(written[0])
    entry = int(np.argmax(good.alloc_table["ptr"]))
    at = table_offset(good, entry, "ptr")

    def edit(data):
        table = bytes(data[good.alloc_table_ptr : good.size])
        data[good.alloc_table_ptr :] = b"\0" * PAGE_SIZE + table
        moved_at = at + PAGE_SIZE
        data[moved_at : moved_at + 8] = np.uint64(good.alloc_table_ptr + 64).tobytes()  # onto the new page
        set_header(data, alloc_table_ptr=good.alloc_table_ptr + PAGE_SIZE)

    checks = structure(corrupt_copy(written, tmp_path, edit))
    assert not checks["samples_on_one_page"]["ok"]
    assert "1 samples have allocations on more than one page" in checks["samples_on_one_page"]["detail"]


def test_metadata_pointer_of_another_sample_is_found(written, tmp_path: Path):
    good = BetonFile(written[0])
    at = metadata_offset(good, "blob", 4, "ptr")
    other = good.metadata["blob"][5]["ptr"]
    checks = structure(
        corrupt_copy(written, tmp_path, lambda d: d.__setitem__(slice(at, at + 8), np.uint64(other).tobytes()))
    )
    detail = checks["metadata_pointers"]["detail"]
    assert not checks["metadata_pointers"]["ok"] and "field 'blob': sample 4's" in detail


def test_size_zero_allocations_are_flagged_and_fail_unless_their_field_allows_empty(tmp_path: Path):
    from ffcv.fields import BytesField, IntField
    from ffcv.writer import DatasetWriter

    path = tmp_path / "empty.beton"
    samples = [(np.frombuffer(b"ab" if i % 3 else b"", dtype=np.uint8), i) for i in range(6)]
    DatasetWriter(
        str(path), {"blob": BytesField(), "n": IntField()}, page_size=PAGE_SIZE, num_workers=1
    ).from_indexed_dataset(ListDataset(samples))
    strict = structure(path)["no_empty_allocations"]
    assert not strict["ok"] and strict["flagged"] == 2 and "2 size-0 allocations ('blob': 2)" in strict["detail"]
    assert "ffcv's Loader mis-reads them" in strict["detail"]
    allowed = structure(path, allow_empty=("blob",))["no_empty_allocations"]
    assert allowed["ok"] and allowed["flagged"] == 2 and "allowed by allow_empty" in allowed["detail"]
    assert structure(path)["metadata_pointers"]["ok"]  # the colliding pointers are still told apart


# --- custom fields, description ------------------------------------------------------------------


def test_custom_field_is_read_with_its_registered_class_like_ffcvs_reader(tmp_path: Path):
    from ffcv.fields import IntField
    from ffcv.reader import Reader
    from ffcv.writer import DatasetWriter

    from betonbuild.custom import FixedUTF8Field

    path = tmp_path / "custom.beton"
    titles = ["crème brûlée", "", "日本語テキスト", "x" * 20]
    DatasetWriter(
        str(path), {"title": FixedUTF8Field(24), "n": IntField()}, page_size=PAGE_SIZE, num_workers=1
    ).from_indexed_dataset(ListDataset([(t, i) for i, t in enumerate(titles)]))
    beton = BetonFile(path, custom_handlers={"title": FixedUTF8Field})
    info = beton.field("title")
    assert (info.type_id, info.handler.width, info.metadata_type) == (255, 24, np.dtype(("u1", (24,))))
    assert [FixedUTF8Field.to_str(r) for r in beton.metadata["title"]] == titles
    reader = Reader(str(path), custom_handlers={"title": FixedUTF8Field})
    assert beton.metadata.tobytes() == reader.metadata.tobytes()
    assert describe(beton, samples=1)["samples"][0]["fields"]["title"] == repr(titles[0])
    assert beton.custom_allocations(0) == []


def test_describe_reports_pages_fill_ratio_and_bytes_per_field(beton: BetonFile, written):
    info = describe(beton, samples=2)
    usage = page_usage(beton)
    assert usage["pages"] == 1 and usage["pages_used"] == 1 and usage["allocations"] == 6 * NUM_SAMPLES
    assert usage["allocated_bytes"] == int(beton.alloc_table["size"].sum())
    assert usage["fill_ratio"] == round(usage["allocated_bytes"] / PAGE_SIZE, 4)
    per_field = bytes_per_field(beton)
    assert per_field["emb"] == {"metadata": 8 * NUM_SAMPLES, "data": 48 * NUM_SAMPLES}
    assert per_field["blob"]["data"] == sum(s[4].size for s in written[1])
    assert per_field["raw_img"]["data"] == sum(s[6].size for s in written[1])
    assert sum(v["data"] for v in per_field.values()) == usage["allocated_bytes"]
    assert info["structure_ok"] and [f["name"] for f in info["fields"]] == FIELD_ORDER
    assert info["fields"][2]["arguments"] == {"dtype": "<f4", "shape": [3, 4]}
    assert info["fields"][7]["image_modes"] == {"jpeg": NUM_SAMPLES, "raw": 0}
    first = info["samples"][0]["fields"]
    assert (
        first["label"] == -4000
        and first["meta"] == '{"index":0,"name":"crop-0","tags":[],"nested":{"x":0.0,"ok":true}}'
    )
    assert first["raw_img"] == "raw 40x24, 2880 bytes" and first["blob"].startswith("3 bytes: 00 01 02")
