"""Unit tests of betonbuild.beton.payloads: images and JSON decode to exactly what ffcv stored; hostile
payloads are refused before anything large is allocated."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from beton_files import corrupt_copy, metadata_offset, write_every_field

from betonbuild.beton.checks import structural_checks
from betonbuild.beton.format import IMAGE_MODE_JPEG, IMAGE_MODE_RAW, BetonFile
from betonbuild.beton.payloads import MAX_DECODED_PIXELS, decode_image, decode_json, jpeg_dimensions
from betonbuild.errors import BetonFormatError


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, list[tuple]]:
    return write_every_field(tmp_path_factory.mktemp("beton") / "all_fields.beton")


@pytest.fixture(scope="module")
def beton(written) -> BetonFile:
    return BetonFile(written[0])


# --- what ffcv stored -----------------------------------------------------------------------------


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


def test_jpeg_dimensions_come_from_the_sof_marker(beton: BetonFile, written):
    for row, sample in enumerate(written[1]):
        height, width = sample[7].shape[:2]
        assert jpeg_dimensions(beton.variable_payload("jpg_img", row)) == (width, height)


@pytest.mark.parametrize("data", [b"", b"\xff\xd8", b"\x89PNG\r\n\x1a\n" + b"\0" * 32, b"\xff\xd8\xff\xe0\x00\x01"])
def test_jpeg_dimensions_of_bytes_that_are_no_jpeg_header_are_none(data):
    assert jpeg_dimensions(np.frombuffer(data, dtype=np.uint8)) is None


# --- hostile payloads -----------------------------------------------------------------------------


def test_undecodable_jpeg_payload_is_refused(written, tmp_path: Path):
    good = BetonFile(written[0])
    ptr = int(good.metadata["jpg_img"][1]["data_ptr"])
    size = good.allocation_size(1, ptr)

    def edit(data):
        data[ptr : ptr + size] = b"\0" * size

    path = corrupt_copy(written, tmp_path, edit)
    with pytest.raises(BetonFormatError, match="sample 1 field 'jpg_img' is not a decodable JPEG"):
        decode_image(BetonFile(path), "jpg_img", 1)


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
