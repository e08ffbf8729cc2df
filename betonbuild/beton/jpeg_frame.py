"""A JPEG's marker structure read without decoding it: its frame header (size, precision,
components), its Adobe colour transform, and whether the markers run cleanly from SOI to a final EOI.

Shared by the cv2 fast path of webdataset decoding (``betonbuild.sources.jpeg``) and ``source_jpeg:
keep`` (``betonbuild.fields.kept_jpeg``), which stores a JPEG unchanged only when this says it may.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SOF_PLAIN = (0xC0, 0xC1, 0xC2)  # Huffman baseline, extended sequential, progressive
SOF_OTHER = (0xC3, 0xC5, 0xC6, 0xC7, 0xC8, 0xC9, 0xCA, 0xCB, 0xCC, 0xCD, 0xCE, 0xCF)  # lossless, arithmetic, ...
SKIPPED = (0xC4, 0xDB, *range(0xE0, 0xF0), 0xFE)  # Huffman and quantisation tables, APPn, comments
SCAN_MARKER = re.compile(rb"\xff[^\x00]")


def scan_end(data: bytes, pos: int, restarts: bool) -> int | None:
    """Where the entropy-coded data from ``pos`` ends: at the first marker that is not a restart
    marker in sequence (FF 00 is a stuffed FF); None if it does not end in a marker."""
    expected = 0xD0
    for match in SCAN_MARKER.finditer(data, pos):
        if not (restarts and data[match.start() + 1] == expected):
            return match.start()
        expected = 0xD0 + (expected - 0xCF) % 8
    return None


@dataclass(frozen=True)
class JpegFrame:
    """A JPEG's frame header (SOFn) and its Adobe colour transform, as ``jpeg_frame`` found them."""

    marker: int
    precision: int
    height: int
    width: int
    component_ids: bytes
    adobe_transform: int | None = None


def jpeg_frame(data: bytes) -> JpegFrame | str:
    """The frame of a JPEG whose marker structure is clean from SOI to a final EOI (``jpeg_kind``'s rule:
    a cut or damaged file never passes), or why not: ``not_jpeg``, ``arithmetic_or_lossless`` or
    ``truncated_or_unusual_markers``. Nothing is decoded: the entropy-coded data is only scanned for markers."""
    if not data.startswith(b"\xff\xd8"):
        return "not_jpeg"
    pos, frame, adobe, restarts, scans = 2, None, None, False, 0
    while pos + 2 <= len(data) and data[pos] == 0xFF:
        marker = data[pos + 1]
        if marker == 0xD9:
            if frame is None or not scans or pos + 2 != len(data):
                break
            return JpegFrame(**{**frame.__dict__, "adobe_transform": adobe})
        length = int.from_bytes(data[pos + 2 : pos + 4], "big")
        segment, end = data[pos + 4 : pos + 2 + length], pos + 2 + length
        if length < 2 or end > len(data):
            break
        if marker in SOF_OTHER:
            return "arithmetic_or_lossless"
        if marker in SOF_PLAIN:
            count = segment[5] if len(segment) >= 6 else 0
            if frame is not None or not count or len(segment) < 6 + 3 * count:
                break
            height, width = int.from_bytes(segment[1:3], "big"), int.from_bytes(segment[3:5], "big")
            frame = JpegFrame(marker, segment[0], height, width, bytes(segment[6 : 6 + 3 * count : 3]))
        elif marker == 0xDA and frame is not None:
            end = scan_end(data, end, restarts)
            if end is None:
                break
            scans += 1
        elif marker == 0xDD:
            restarts = segment[:2] != b"\0\0"
        elif marker == 0xEE and segment.startswith(b"Adobe") and len(segment) >= 12:
            adobe = segment[11]
        elif marker not in SKIPPED:
            break
        pos = end
    return "truncated_or_unusual_markers"
