"""``source_jpeg: keep``: an ``rgb_image`` stores a source JPEG's bytes unchanged where nothing in it
needs changing, instead of decoding and encoding it again (ffcv's way, which costs most of the write
and loses quality a second time).

A JPEG is kept when ffcv's own decoder reads it as the re-encoded image would be read: 8-bit
Huffman (baseline, extended or progressive), YCbCr or greyscale (greyscale only with ``image_mode:
convert``, as PIL's ``.convert("RGB")`` would make of it), its marker structure clean to a final EOI
(a cut file never is), within ``max_resolution``. Its width and height come from the frame header.
Everything else is decoded and encoded as before, and the reason is counted in the write record.
"""

from __future__ import annotations

import io
import mmap
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from betonbuild.beton.format import IMAGE_MODE_JPEG
from betonbuild.beton.jpeg_frame import JpegFrame, jpeg_frame
from betonbuild.config.spec import FieldSpec
from betonbuild.errors import SampleError
from betonbuild.fields.reduced_decode import decoded_reduced, reduces, unloaded_jpeg_file

KEPT = "kept"
# Why an image was re-encoded; the order is the code stored per sample while writing (0: not read)
REASONS = (
    KEPT,
    "not_jpeg",
    "truncated_or_unusual_markers",
    "arithmetic_or_lossless",
    "not_8_bit",
    "cmyk_or_ycck",
    "rgb_colour_space",
    "unusual_components",
    "greyscale_with_image_mode_strict",
    "larger_than_max_resolution",
    "above_pil_pixel_limit",
    "pixels_from_source",  # the source gave decoded pixels, not a JPEG's bytes
)


@dataclass(frozen=True)
class KeptJPEG:
    """A source JPEG stored as it is: its bytes and its frame header's size."""

    data: bytes
    width: int
    height: int
    file: str = field(default="", compare=False)  # where it was read, for messages


@dataclass
class Reencode:
    """A source image that is decoded and encoded again (``image``: what the source decoded), and why."""

    image: Any
    reason: str


def keeps_source_jpeg(field_spec: FieldSpec) -> bool:
    return field_spec.options.get("source_jpeg") == "keep"


def keep_or_reason(field_spec: FieldSpec, data: bytes, file: str = "") -> KeptJPEG | str:
    """``data`` as a ``KeptJPEG`` if it can be stored unchanged, else the reason (one of ``REASONS``)."""
    frame = jpeg_frame(data)
    if isinstance(frame, str):
        return frame
    reason = _frame_reason(field_spec, frame)
    return KeptJPEG(bytes(data), frame.width, frame.height, file) if reason is None else reason


def _frame_reason(field_spec: FieldSpec, frame: JpegFrame) -> str | None:
    from PIL import Image

    count = len(frame.component_ids)
    if frame.precision != 8:
        return "not_8_bit"
    if count == 4:
        return "cmyk_or_ycck"
    if count not in (1, 3):
        return "unusual_components"
    if count == 3 and (frame.adobe_transform == 0 or frame.component_ids == b"RGB"):
        return "rgb_colour_space"  # libjpeg would not convert from YCbCr
    if count == 1 and field_spec.options.get("image_mode") != "convert":
        return "greyscale_with_image_mode_strict"  # decoded, it fails the contract as before
    if not frame.height or not frame.width:
        return "truncated_or_unusual_markers"  # the height comes from a DNL marker
    limit = field_spec.options.get("max_resolution")
    if limit and max(frame.height, frame.width) > limit:
        return "larger_than_max_resolution"
    if Image.MAX_IMAGE_PIXELS and frame.height * frame.width > Image.MAX_IMAGE_PIXELS:
        return "above_pil_pixel_limit"  # decoded, PIL's decompression-bomb check speaks as before
    return None


def resolve_source_jpeg(field_spec: FieldSpec, value: Any, fail) -> Any:
    """For a keeping field: JPEG bytes, or a PIL JPEG opened from a file and not yet loaded, become a
    ``KeptJPEG`` or a ``Reencode`` of the decoded image; any other value is returned as it is."""
    from PIL import Image

    if isinstance(value, (bytes, bytearray, memoryview)):
        from betonbuild.sources.jpeg import decode_rgb8  # not at the top: betonbuild.sources imports this module

        data = bytes(value)
        kept = keep_or_reason(field_spec, data)
        if isinstance(kept, KeptJPEG):
            return kept
        try:  # as the sources' reencode decodes: libjpeg-turbo directly where it gives PIL's pixels
            if reduces(field_spec, data):  # decode: reduced
                image = decoded_reduced(field_spec, data)
            else:
                image = decode_rgb8(data, _pil_loaded, components=(3,))
        except (OSError, Image.UnidentifiedImageError, Image.DecompressionBombError) as exc:
            raise fail(f"cannot decode the image's {len(data)} bytes: {exc}", "return valid image bytes") from None
        return Reencode(image, kept)
    if unloaded_jpeg_file(value):
        try:
            with open(value.filename, "rb") as fh:
                data = fh.read()
        except OSError:
            return value  # decoded from the open file as before
        kept = keep_or_reason(field_spec, data, value.filename)
        if isinstance(kept, KeptJPEG) and (kept.width, kept.height) == value.size:
            return kept
        return Reencode(value, kept if isinstance(kept, str) else "truncated_or_unusual_markers")
    return value


def _pil_loaded(data: bytes):
    from PIL import Image

    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def reason_of(raw: Any, checked: Any) -> str:
    """Why the checked value of a keeping field was stored as it was."""
    if isinstance(checked, KeptJPEG):
        return KEPT
    if isinstance(raw, Reencode):
        return raw.reason
    return "pixels_from_source"


def keeping_encode(encoder):
    """``encoder`` (an ``RGBImageEncoder``, whose class gives the descriptor's type id, so it stays
    one) whose ``encode`` stores a ``KeptJPEG`` as it is: mode JPEG, the frame's width and height."""
    encode = encoder.encode

    def encode_kept(destination, image, malloc):
        if not isinstance(image, KeptJPEG):
            return encode(destination, image, malloc)
        destination["mode"] = IMAGE_MODE_JPEG
        destination["height"], destination["width"] = image.height, image.width
        destination["data_ptr"], storage = malloc(len(image.data))
        storage[:] = np.frombuffer(image.data, dtype=np.uint8)

    encoder.encode = encode_kept
    return encoder


class KeepTally:
    """Per keeping field, the reason code of every source index written, in memory shared with the
    writer's forked workers (one byte a sample), summed up for the write record."""

    def __init__(self, names: list[str], length: int):
        self.codes = {name: np.frombuffer(mmap.mmap(-1, max(length, 1)), dtype=np.uint8)[:length] for name in names}

    def record(self, name: str, index: int, reason: str) -> None:
        codes = self.codes[name]
        if 0 <= index < len(codes):  # a replayed sample (``betonbuild repro``) comes from a one-sample dict
            codes[index] = REASONS.index(reason) + 1

    def summary(self, order: np.ndarray) -> dict[str, Any]:
        """``{field: {"kept": n, "reencoded": m, "reencoded_because": {reason: count}}}`` over ``order``."""
        result = {}
        for name, codes in self.codes.items():
            counts = np.bincount(codes[order], minlength=len(REASONS) + 1)
            because = {r: int(counts[i + 1]) for i, r in enumerate(REASONS) if r != KEPT and counts[i + 1]}
            result[name] = {"kept": int(counts[1]), "reencoded": sum(because.values()), "reencoded_because": because}
        return result


def sum_keep_counts(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The write records' ``source_jpeg`` counts of several parts, added up per field."""
    total: dict[str, Any] = {}
    for part in parts:
        for name, counts in part.items():
            mine = total.setdefault(name, {"kept": 0, "reencoded": 0, "reencoded_because": {}})
            mine["kept"] += counts["kept"]
            mine["reencoded"] += counts["reencoded"]
            for reason, n in counts["reencoded_because"].items():
                mine["reencoded_because"][reason] = mine["reencoded_because"].get(reason, 0) + n
    return total


def keep_tally(spec, length: int) -> KeepTally | None:
    names = [f.name for f in spec.fields if keeps_source_jpeg(f)]
    return KeepTally(names, length) if names else None


def keep_failure(dataset: str, field_name: str, index: int):
    """The ``fail`` of the sample contract, for resolving a value before ``check_sample``."""

    def fail(why: str, fix: str = "") -> SampleError:
        return SampleError(dataset, field_name, index, why, fix)

    return fail
