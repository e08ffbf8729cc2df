"""Decoding of stored values: a JPEG's dimensions from its header, images, JSON payloads.

Kept apart from the reader (``betonbuild.beton.format``), which hands out raw payload bytes; the
decoders refuse what a hostile file could use to make them allocate without bound.
"""

from __future__ import annotations

import json

import numpy as np

from betonbuild.beton.format import IMAGE_MODE_RAW, BetonFile
from betonbuild.errors import BetonFormatError

MAX_DECODED_PIXELS = 1 << 28  # decode_image refuses larger images (a hostile JPEG header could claim 4 G pixels)


def jpeg_dimensions(payload) -> tuple[int, int] | None:
    """(width, height) from a JPEG's SOF marker, or None if the bytes are not a readable JPEG header."""
    data = bytes(payload[:65536]) if len(payload) > 65536 else bytes(payload)
    if data[:2] != b"\xff\xd8":
        return None
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        if length < 2:
            return None
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if i + 9 > len(data):
                return None
            height = int.from_bytes(data[i + 5 : i + 7], "big")
            width = int.from_bytes(data[i + 7 : i + 9], "big")
            return width, height
        i += 2 + length
    return None


def decode_image(beton: BetonFile, name: str, row: int, bgr: bool = False) -> np.ndarray:
    """The RGB (or, with ``bgr``, BGR) image of one sample as HxWx3 uint8; JPEG decoded with cv2.

    The JPEG's own dimensions must equal the metadata's, and images above MAX_DECODED_PIXELS are
    refused, so a hostile header cannot make the decoder allocate gigabytes.
    """
    import cv2

    record = beton.metadata[name][row]
    width, height = int(record["width"]), int(record["height"])
    payload = beton.variable_payload(name, row)
    if record["mode"] == IMAGE_MODE_RAW:
        image = np.asarray(payload).reshape(height, width, 3)
        return image[..., ::-1] if bgr else image
    where = f"{beton.path}: sample {row} field '{name}'"
    if width * height > MAX_DECODED_PIXELS:
        raise BetonFormatError(f"{where}: {width}x{height} is above the {MAX_DECODED_PIXELS}-pixel decode limit")
    dims = jpeg_dimensions(payload)
    if dims is None:
        raise BetonFormatError(f"{where} is not a decodable JPEG")
    if dims != (width, height):
        raise BetonFormatError(f"{where}: the JPEG is {dims[0]}x{dims[1]} but the metadata says {width}x{height}")
    try:
        image = cv2.imdecode(np.asarray(payload), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
    except cv2.error:
        image = None
    if image is None or image.shape != (height, width, 3):
        raise BetonFormatError(f"{where} is not a decodable JPEG")
    return image if bgr else cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


def decode_json(payload: np.ndarray):
    """JSONField stores UTF-8 JSON followed by a NUL byte."""
    raw = bytes(payload)
    end = raw.find(b"\0")
    try:
        return json.loads(raw[: end if end >= 0 else len(raw)].decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise BetonFormatError(
            f"JSON payload of {len(raw)} bytes does not decode: {type(exc).__name__}: {exc}"
        ) from None
