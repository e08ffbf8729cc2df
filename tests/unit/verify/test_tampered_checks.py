"""Every check of a verification report can fail (issue 17, items 8 and 9): a real .beton is written
once, and each test flips, in a copy, exactly the bytes one check covers (offsets from the format's
layout constants and ``BetonFile``), then asserts that this check, and only the checks the report's
order makes depend on it, fail, with a message naming the sample (and field)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from report_checks import ALL_CHECKS

from betonbuild._compat import ffcv_ctypes
from betonbuild.beton.format import (
    ALLOC_TABLE_TYPE,
    FIELD_DESC_TYPE,
    HEADER_TYPE,
    NDARRAY_ARGS_TYPE,
    BetonFile,
)
from betonbuild.config.load import load_config
from betonbuild.custom import FixedUTF8Field
from betonbuild.provenance import ffcv_build
from betonbuild.sources import open_source
from betonbuild.verify import verify_beton
from betonbuild.write.writer import write_beton

# numba's dispatcher finalizer raises KeyError when ffcv.Loader objects are collected (ffcv 1.0.2, harmless).

N = 12
ADAPTER = textwrap.dedent(
    """
    import numpy as np
    from betonbuild.demo import colour_photos

    PHOTO = colour_photos()["astronaut"]


    def make(n):
        rows = []
        for i in range(n):
            rng = np.random.default_rng(i)
            crop = np.ascontiguousarray(PHOTO[9 * i :][:24, 7 * i :][:, :32])
            rows.append({
                "title": f"sample {i}",
                "x": rng.standard_normal(6).astype(np.float32),
                "label": i % 4,
                "blob": bytes(range(i + 3)),
                "meta": {"i": i, "tags": ["a"] * (i % 3)},
                "photo": crop,
                "image": crop,
            })
        return rows
    """
)
FIELDS = {
    "title": {"type": "custom", "class": "betonbuild.custom:FixedUTF8Field", "args": {"width": 16}},
    "x": {"type": "ndarray", "dtype": "float32", "shape": [6]},
    "label": {"type": "int"},
    "blob": {"type": "bytes"},
    "meta": {"type": "json"},
    "photo": {"type": "rgb_image", "write_mode": "raw"},
    "image": {"type": "rgb_image", "write_mode": "jpg"},
}
HANDLERS = {"title": FixedUTF8Field}


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple:
    """(spec, source, rows, path) of one real file, written once for the module."""
    folder = tmp_path_factory.mktemp("tampered")
    (folder / "bb_tampered_adapter.py").write_text(ADAPTER)
    sys.path.insert(0, str(folder))
    entry = {
        "source": {"kind": "python", "factory": "bb_tampered_adapter:make", "args": {"n": N}},
        "fields": FIELDS,
        "verify": {"mode": "full"},
    }
    spec = load_config({"datasets": {"tampered": entry}}).datasets["tampered"]
    source = open_source(spec)
    rows = np.arange(len(source))
    with open(os.devnull, "w") as quiet:
        write_beton(spec, source, rows, folder / "good.beton", 1, log=quiet)
    yield spec, source, rows, folder / "good.beton"
    sys.path.remove(str(folder))
    sys.modules.pop("bb_tampered_adapter", None)


@pytest.fixture
def copy(written, tmp_path: Path) -> Path:
    path = tmp_path / "copy.beton"
    shutil.copyfile(written[3], path)
    return path


def verify(written, path: Path, **kwargs) -> dict:
    spec, source, rows, _ = written
    return verify_beton(spec, source, rows, str(path), ffcv_build(), **kwargs)


def failed(report: dict) -> list[str]:
    return [c["name"] for c in report["checks"] if not c["ok"]]


def check(report: dict, name: str) -> dict:
    return next(c for c in report["checks"] if c["name"] == name)


def overwrite(path: Path, offset: int, new: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(new)


def descriptor_offset(path: Path, name: str, member: str) -> int:
    """Where member (type_id, name, arguments) of field ``name``'s descriptor starts in the file."""
    index = [f.name for f in BetonFile(path, HANDLERS).fields].index(name)
    return HEADER_TYPE.itemsize + FIELD_DESC_TYPE.itemsize * index + FIELD_DESC_TYPE.fields[member][1]


def record_offset(path: Path, name: str, row: int) -> int:
    beton = BetonFile(path, HANDLERS)
    return beton.metadata_start + beton.metadata_type.itemsize * row + beton.metadata_type.fields[name][1]


def test_the_untampered_file_passes_every_check(written):
    report = verify(written, written[3])
    assert report["ok"], report["worst"]
    assert [c["name"] for c in report["checks"]] == ALL_CHECKS
    assert len(report["content_digest"]) == 64  # a value of the report, not a check


def test_another_format_version_fails_format_version_naming_both_versions(written, copy: Path):
    overwrite(copy, HEADER_TYPE.fields["version"][1], np.uint16(3).astype("<u2").tobytes())
    report = verify(written, copy)
    assert failed(report) == ["format_version"]
    assert [c["name"] for c in report["checks"]] == ["format_version", "same_ffcv_build"]  # nothing else is readable
    assert "the header says format version 3, expected 2" in check(report, "format_version")["detail"]
    assert report["worst"].startswith("format_version: ")


def test_a_header_the_reader_refuses_fails_format(written, copy: Path):
    overwrite(copy, HEADER_TYPE.fields["alloc_table_ptr"][1], np.uint64(0).astype("<u8").tobytes())
    report = verify(written, copy)
    assert failed(report) == ["format"]
    assert "allocation table pointer is 0: the writer never finished this file" in check(report, "format")["detail"]


def test_a_header_with_one_sample_less_fails_num_samples(written, copy: Path):
    overwrite(copy, HEADER_TYPE.fields["num_samples"][1], np.uint64(N - 1).astype("<u8").tobytes())
    report = verify(written, copy)
    assert failed(report) == ["num_samples"]
    assert check(report, "num_samples")["detail"] == f"file has {N - 1}, expected {N}"
    assert report["num_samples"] == {"expected": N, "found": N - 1}


def test_a_renamed_field_fails_fields_naming_it(written, copy: Path):
    overwrite(copy, descriptor_offset(copy, "label", "name"), b"lobel")
    report = verify(written, copy)
    assert failed(report) == ["fields"]
    assert check(report, "fields")["detail"].startswith(
        "field 2 is 'lobel' (ffcv type id 1) in the file, 'label' (ffcv type id 1) in the config"
    )


def test_another_type_id_fails_fields_naming_the_field(written, copy: Path):
    overwrite(copy, descriptor_offset(copy, "label", "type_id"), bytes([0]))  # int -> float: same 8-byte record
    report = verify(written, copy)
    assert failed(report) == ["fields"]
    assert check(report, "fields")["detail"].startswith(
        "field 2 is 'label' (ffcv type id 0) in the file, 'label' (ffcv type id 1) in the config"
    )


def ndarray_arguments(path: Path, name: str) -> tuple[int, list]:
    """(offset of the dtype description, the description) in field ``name``'s descriptor."""
    start = descriptor_offset(path, name, "arguments")
    raw = path.read_bytes()[start : start + FIELD_DESC_TYPE.fields["arguments"][0].itemsize]
    length = int(np.frombuffer(raw[: NDARRAY_ARGS_TYPE.itemsize], NDARRAY_ARGS_TYPE)[0]["type_length"])
    at = start + NDARRAY_ARGS_TYPE.itemsize
    return at, json.loads(raw[NDARRAY_ARGS_TYPE.itemsize :][:length])


def test_another_stored_dtype_fails_fields_naming_the_field(written, copy: Path):
    at, descr = ndarray_arguments(copy, "x")
    assert descr == [["", "<f4"]]
    overwrite(copy, at, json.dumps([["", "<i4"]]).encode())  # same length: the description's length stays valid
    report = verify(written, copy)
    assert failed(report) == ["fields"]
    assert check(report, "fields")["detail"] == "field 'x' stores int32[6], config says float32[6]"


def test_another_stored_shape_fails_fields_naming_the_field(written, copy: Path):
    shape_at = descriptor_offset(copy, "x", "arguments") + NDARRAY_ARGS_TYPE.fields["shape"][1]
    overwrite(copy, shape_at, np.uint64(3).astype("<u8").tobytes())
    report = verify(written, copy)
    assert failed(report) == ["fields"]
    assert check(report, "fields")["detail"] == "field 'x' stores float32[3], config says float32[6]"


def test_changed_custom_arguments_fail_fields_naming_the_field(written, copy: Path):
    # a byte past the width FixedUTF8Field.from_binary reads: the file still parses, its arguments differ
    overwrite(copy, descriptor_offset(copy, "title", "arguments") + 100, b"\x01")
    report = verify(written, copy)
    assert failed(report) == ["fields"]
    assert check(report, "fields")["detail"] == (
        "field 'title': the descriptor's arguments differ from "
        "betonbuild.custom:FixedUTF8Field(**{'width': 16}).to_binary()"
    )


def test_an_allocation_filed_under_another_sample_fails_allocations_and_the_loader_is_not_run(written, copy: Path):
    beton = BetonFile(copy, HANDLERS)
    ptr = int(beton.metadata["x"][3])
    entry = int(np.flatnonzero(beton.alloc_table["ptr"] == ptr)[0])
    offset = beton.alloc_table_ptr + ALLOC_TABLE_TYPE.itemsize * entry + ALLOC_TABLE_TYPE.fields["sample_id"][1]
    overwrite(copy, offset, np.uint64(4).astype("<u8").tobytes())
    report = verify(written, copy)
    assert failed(report) == ["allocations", "loader_batch"]
    assert "metadata_pointers: field 'x': sample 3's pointer" in check(report, "allocations")["detail"]
    assert check(report, "loader_batch")["detail"].startswith("not run: the structural checks failed")


def test_a_changed_int_fails_fixed_fields_naming_field_and_sample(written, copy: Path):
    overwrite(copy, record_offset(copy, "label", 5), np.int64(99).astype("<i8").tobytes())
    report = verify(written, copy)
    assert failed(report) == ["fixed_fields"]
    assert check(report, "fixed_fields")["detail"] == (
        f"field 'label': 1 of {N} samples differ from the source (first: sample 5, source index 5)"
    )


def test_a_changed_ndarray_byte_fails_fixed_fields_naming_field_and_sample(written, copy: Path):
    ptr = int(BetonFile(copy, HANDLERS).metadata["x"][7])
    overwrite(copy, ptr + 2, bytes([copy.read_bytes()[ptr + 2] ^ 0x10]))
    report = verify(written, copy)
    assert failed(report) == ["fixed_fields"]
    assert (
        "field 'x': 1 of 12 samples differ from the source (first: sample 7" in check(report, "fixed_fields")["detail"]
    )


def test_a_changed_raw_image_byte_fails_variable_fields_naming_field_and_sample(written, copy: Path):
    ptr = int(BetonFile(copy, HANDLERS).metadata["photo"][4]["data_ptr"])
    overwrite(copy, ptr + 100, bytes([copy.read_bytes()[ptr + 100] ^ 0xFF]))
    report = verify(written, copy)
    assert failed(report) == ["variable_fields"]
    assert check(report, "variable_fields")["detail"] == (
        "field 'photo' sample 4 (source index 4): raw image pixels differ"
    )
    assert check(report, "variable_fields")["fields"]["photo"]["mismatches"] == 1


def test_a_changed_json_byte_fails_variable_fields_naming_field_and_sample(written, copy: Path):
    record = BetonFile(copy, HANDLERS).metadata["meta"][6]
    payload = copy.read_bytes()[int(record["ptr"]) :][: int(record["size"])]
    assert payload.startswith(b'{"i": 6')
    overwrite(copy, int(record["ptr"]) + payload.index(b"6"), b"7")
    report = verify(written, copy)
    assert failed(report) == ["variable_fields"]
    assert check(report, "variable_fields")["detail"] == (
        "field 'meta' sample 6 (source index 6): stored {'i': 7, 'tags': []} != source"
    )


def test_a_changed_bytes_byte_fails_variable_fields_naming_field_and_sample(written, copy: Path):
    ptr = int(BetonFile(copy, HANDLERS).metadata["blob"][9]["ptr"])
    overwrite(copy, ptr + 1, b"\xee")
    report = verify(written, copy)
    assert failed(report) == ["variable_fields"]
    assert check(report, "variable_fields")["detail"] == "field 'blob' sample 9 (source index 9): bytes differ"


def test_a_changed_custom_record_fails_custom_fields_naming_field_and_sample(written, copy: Path):
    overwrite(copy, record_offset(copy, "title", 2), b"X")
    report = verify(written, copy)
    assert failed(report) == ["custom_fields"]
    assert check(report, "custom_fields")["detail"].startswith(
        "field 'title' sample 2 (source index 2): the metadata record differs from the re-encoded source value"
    )


def loader_reads_label_plus_one_at(monkeypatch, position: int) -> None:
    """ffcv's Loader, patched in-process to hand back sample ``position``'s label plus one."""
    import ffcv.loader

    real = ffcv.loader.Loader

    class Disagreeing(real):
        def __iter__(self):
            label = list(FIELDS).index("label")  # every field is in the batch (the images have one size)
            for batch in super().__iter__():
                batch = list(batch)
                batch[label] = np.array(batch[label])  # a copy, whatever the array type
                batch[label][position] += 1
                yield tuple(batch)

    monkeypatch.setattr(ffcv.loader, "Loader", Disagreeing)


def test_a_loader_that_disagrees_with_the_file_fails_loader_batch_naming_field_and_sample(written, monkeypatch):
    loader_reads_label_plus_one_at(monkeypatch, 3)
    report = verify(written, written[3], threads=1)  # one thread: the Loader batch runs in this process
    assert failed(report) == ["loader_batch"]
    assert check(report, "loader_batch")["detail"].startswith(
        "field 'label' sample 3: ffcv.Loader and the file disagree"
    )


def test_a_comparison_that_crashes_fails_content(written, monkeypatch):
    import betonbuild.verify.report as report_module

    def crashing(context, pool):
        raise RuntimeError("simulated crash of the comparison")

    monkeypatch.setattr(report_module, "run_content", crashing)
    report = verify(written, written[3])
    assert failed(report) == ["content"]
    assert check(report, "content")["detail"] == (
        "comparing the file with its source failed: RuntimeError: simulated crash of the comparison"
    )


def test_parts_whose_content_differs_or_leaves_a_gap_fail_parts(written):
    good = verify(written, written[3])
    halves = [{"index": 0, "start": 0, "stop": 6}, {"index": 1, "start": 6, "stop": N}]
    from betonbuild.beton.digest import range_digest

    beton = BetonFile(written[3], HANDLERS)
    parts = [{**p, "range_digest": range_digest(beton, p["start"], p["stop"])} for p in halves]
    assert check(verify(written, written[3], parts=parts), "parts")["ok"]
    parts[1]["range_digest"] = range_digest(beton, 0, 6)
    report = verify(written, written[3], parts=parts)
    assert failed(report) == ["parts"] and check(report, "parts")["differing"] == [1]
    assert "the rows of part(s) [1] differ from the part files verified in full" in check(report, "parts")["detail"]
    gap = [{**parts[0], "stop": 5}, {**parts[1], "range_digest": range_digest(beton, 6, N)}]
    report = verify(written, written[3], parts=gap)
    assert failed(report) == ["parts"]
    assert check(report, "parts")["detail"] == f"the parts cover rows [(0, 5), (6, {N})], not 0..{N} in order"
    assert good["content_digest"] == report["content_digest"]


def jpeg_with_extraneous_bytes(payload: bytes) -> bytes:
    """The same JPEG without its JFIF APP0 segment and with two stray bytes before its SOS marker,
    padded to the same length: libjpeg-turbo decodes the same pixels with a warning ("2 extraneous
    bytes before marker 0xda"), for which tjDecompress2, and so ffcv's imdecode, returns -1."""
    assert payload[2:4] == b"\xff\xe0"
    without_app0 = payload[:2] + payload[4 + int.from_bytes(payload[4:6], "big") :]
    sos = without_app0.index(b"\xff\xda")
    changed = without_app0[:sos] + b"\0\0" + without_app0[sos:]
    return changed + bytes(len(payload) - len(changed))  # after EOI: read by no decoder


def test_a_stored_jpeg_ffcvs_imdecode_rejects_fails_image_decoder_naming_dataset_field_and_sample(written, copy: Path):
    import cv2
    from ffcv.libffcv import imdecode

    beton = BetonFile(copy, HANDLERS)
    record = beton.metadata["image"][8]
    ptr, height, width = int(record["data_ptr"]), int(record["height"]), int(record["width"])
    stored = bytes(beton.variable_payload("image", 8))
    changed = np.frombuffer(jpeg_with_extraneous_bytes(stored), dtype=np.uint8)
    # ffcv's own decoder refuses it; cv2 decodes exactly the pixels of the untampered JPEG
    out = np.zeros((height, width, 3), dtype=np.uint8)
    assert imdecode(changed, out, height, width, height, width, 0, 0, 1, 1, False, False) == -1
    original = np.frombuffer(stored, dtype=np.uint8)
    assert np.array_equal(cv2.imdecode(changed, cv2.IMREAD_COLOR), cv2.imdecode(original, cv2.IMREAD_COLOR))
    overwrite(copy, ptr, changed.tobytes())
    report = verify(written, copy)
    assert failed(report) == ["image_decoder"]
    decoder = check(report, "image_decoder")
    assert decoder["detail"].startswith(
        "dataset 'tampered' field 'image' sample 8 (source index 8): ffcv's imdecode returned -1 for the stored JPEG"
    )
    assert "ffcv's Loader ignores that code" in decoder["detail"] and ". Fix: rewrite the file" in decoder["detail"]
    assert decoder["fields"]["image"]["ffcv_imdecode"] == N - 1 and decoder["fields"]["image"]["cv2_fallback"] == 1
    assert decoder["fields"]["photo"] == {"ffcv_imdecode": 0, "cv2_fallback": 0}  # raw: no decoder
    assert check(report, "variable_fields")["ok"]  # cv2's pixels are the untampered JPEG's


@pytest.fixture
def libffcv_unloadable(monkeypatch):
    """ffcv's compiled library cannot be loaded by ctypes (as with a broken build); ffcv itself is
    imported first, so the Loader batch still has the library it loaded."""
    import ctypes

    import ffcv.libffcv  # noqa: F401

    real = ctypes.CDLL

    def refusing(name, *args, **kwargs):
        if "_libffcv" in str(name):
            raise OSError(f"{name}: cannot open shared object file (simulated)")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(ctypes, "CDLL", refusing)
    ffcv_ctypes._load_libffcv.cache_clear()
    ffcv_ctypes.turbojpeg.cache_clear()
    yield
    monkeypatch.undo()
    ffcv_ctypes._load_libffcv.cache_clear()
    ffcv_ctypes.turbojpeg.cache_clear()


def test_an_unloadable_ffcv_library_is_reported_with_the_decoder_used_and_why(written, libffcv_unloadable):
    report = verify(written, written[3])
    assert report["ok"], report["worst"]
    decoder = check(report, "image_decoder")
    assert decoder["fields"]["image"]["ffcv_imdecode"] == 0 and decoder["fields"]["image"]["cv2_fallback"] == N
    reason = decoder["fields"]["image"]["reason"]
    assert reason.startswith("loading ffcv's compiled library ") and "(simulated)" in reason
    assert decoder["detail"] == (
        f"field 'image': {N} JPEGs decoded by cv2, not by ffcv's imdecode: {reason}; "
        "their pixel errors are cv2's, about 1 level from what ffcv's Loader decodes"
    )
