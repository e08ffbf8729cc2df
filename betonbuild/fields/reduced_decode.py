"""``decode: reduced``: decoding a JPEG at the size needed, for every source that hands an
``rgb_image`` field a JPEG to decode.

A JPEG that ``max_resolution`` shrinks 2x or more is decoded at libjpeg's reduced DCT scale (PIL
``draft``: 1/2, 1/4 or 1/8, never below the size ffcv stores) and resized the rest of the way
(INTER_AREA, as ffcv resizes) to exactly the size plain ffcv stores. The JPEGs: an image folder's
files, webdataset members decoded as rgb8, a Parquet image column's bytes, a python source's JPEG
bytes (with ``source_jpeg: keep``) or its PIL JPEGs opened from a file and not yet loaded. Anything
else (not a JPEG, a cut one, one shrunk less than 2x) is decoded in full, as before. The pixels
differ slightly from a full decode's; docs/images.md gives the measured differences.

A decode at the reduced scale gives ``ReducedPixels`` (an ndarray, so marked): the write's measurements
and the verification count them, so that the report says how many images took it.

A python source's PIL image is not drafted in place (the source may hand the same object out
again): its file's bytes are decoded instead.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from betonbuild.beton.jpeg_frame import jpeg_frame
from betonbuild.config.spec import FieldSpec
from betonbuild.fields.builtin_encoders import ffcv_target_size


class ReducedPixels(np.ndarray):
    """An RGB array decoded at libjpeg's reduced scale and resized to ffcv's size: an ordinary array,
    marked so that the images that took the reduced decode can be counted (``was_reduced``)."""


def was_reduced(value: Any) -> bool:
    return isinstance(value, ReducedPixels)


def decodes_reduced(field: FieldSpec) -> bool:
    return field.type == "rgb_image" and field.options.get("decode") == "reduced"


def reduces(field: FieldSpec, data: bytes) -> bool:
    """Whether ``decode: reduced`` decodes ``data`` at a reduced scale: a JPEG whose frame header
    (its marker structure clean to the final EOI) says that ``max_resolution`` shrinks it 2x or more."""
    if not decodes_reduced(field) or not data.startswith(b"\xff\xd8"):
        return False
    frame = jpeg_frame(data)
    return not isinstance(frame, str) and _target(field, frame.width, frame.height) is not None


def decoded_reduced(field: FieldSpec, data: bytes, file: str = "", convert: bool | None = None) -> Any:
    """``data`` (a JPEG that ``reduces``) decoded at the reduced scale: an RGB array of ffcv's size.
    PIL's errors propagate: the caller names the sample. ``convert``: to RGB whatever ``image_mode``
    says (webdataset's rgb8 does); by default only under ``image_mode: convert``, other modes left to
    the field, which refuses them."""
    from PIL import Image

    image = Image.open(io.BytesIO(data))
    if file:
        image.filename = file  # the field's messages name the file
    return load_reduced(field, image, convert)


def load_reduced(field: FieldSpec, image, convert: bool | None = None) -> Any:
    """A PIL image opened and not yet loaded, loaded: at the reduced scale and then resized to ffcv's
    size where ``decode: reduced`` applies to it (an RGB array, or an image of another mode the field
    refuses); else in full (the image itself)."""
    size = _target(field, *image.size) if decodes_reduced(field) and image.format == "JPEG" else None
    if size is not None:
        image.draft(None, size)  # libjpeg's DCT scaling, never below ``size``
    image.load()
    return image if size is None else _resized(field, image, size, convert)


def reduced_pil_file(field: FieldSpec, image) -> Any:
    """A python source's PIL JPEG opened from a file and not yet loaded, decoded reduced from the
    file's bytes where that applies; else the image as it is. OSError if the file cannot be read."""
    if not (decodes_reduced(field) and unloaded_jpeg_file(image)):
        return image
    with open(image.filename, "rb") as fh:
        data = fh.read()
    return decoded_reduced(field, data, image.filename) if reduces(field, data) else image


def unloaded_jpeg_file(value: Any) -> bool:
    """A PIL JPEG opened from a file whose pixels nobody can have changed: not loaded yet (``tile``
    is cleared by ``load``, which every pixel access calls) and not drafted to another size."""
    return (
        type(value).__name__ == "JpegImageFile"
        and getattr(value, "format", None) == "JPEG"
        and bool(getattr(value, "filename", ""))
        and bool(getattr(value, "tile", None))
        and getattr(value, "decoderconfig", ()) in ((), None)
    )


def _target(field: FieldSpec, width: int, height: int) -> tuple[int, int] | None:
    """The size ffcv's resizer makes of a ``width`` x ``height`` image, if that shrinks it 2x or more."""
    target = ffcv_target_size(width, height, field.options.get("max_resolution"))
    return target if target and 2 * max(target) <= max(width, height) else None


def _resized(field: FieldSpec, image, size: tuple[int, int], convert: bool | None):
    """The drafted image resized the rest of the way to exactly ``size`` (INTER_AREA, as ffcv
    resizes); an image of another mode than RGB that is not to be converted is left to the field."""
    import cv2

    if image.mode != "RGB":
        if not (convert if convert is not None else field.options.get("image_mode") == "convert"):
            return image
        image = image.convert("RGB")
    return cv2.resize(np.asarray(image), size, interpolation=cv2.INTER_AREA).view(ReducedPixels)
