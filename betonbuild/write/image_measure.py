"""Images measured as they are written, so that the full verification need not read each source
image again: re-encoded ones need no second decode and resize, kept ones no second read of the source.

An ``rgb_image`` field with ``source_jpeg: reencode`` (ffcv's way) is resized here, with ffcv's own
resizer, and handed to ffcv's encode already at its stored size (ffcv then resizes nothing: the bytes
are the ones plain ffcv writes). The payload ffcv just copied into its page is decoded once by ffcv's
own ``imdecode`` (as a Loader decodes it) and compared with the pixels it was encoded from; each
sample's JPEG error and the CRC-32 of its stored bytes go to memory shared with the forked workers.
A JPEG kept as the source had it (``source_jpeg: keep``) is stored by ``fields.kept_jpeg``: its CRC-32
is taken of the bytes stored, and ffcv's ``imdecode`` decodes them once at their stored size, as a
Loader's ``SimpleRGBImageDecoder`` would (the proof that ffcv reads it, which the verification's one
decode of each kept JPEG gave before).
The write record keeps, per field, the error statistics and one SHA-256 over the CRCs in file order.

The full verification reads every stored payload back and computes the same digest
(``betonbuild.verify.measured``): equal, the measured statistics are those of exactly these bytes;
different, or anything not measured, and it compares every image with its source as before.
"""

from __future__ import annotations

import hashlib
import mmap
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from betonbuild._compat.ffcv_ctypes import ffcv_imdecode, libffcv
from betonbuild.beton.format import IMAGE_MODE_RAW
from betonbuild.config.spec import DatasetSpec
from betonbuild.fields.builtin_encoders import ffcv_resizer
from betonbuild.fields.kept_jpeg import KeptJPEG
from betonbuild.fields.reduced_decode import decodes_reduced, was_reduced
from betonbuild.fields.rgb_image import jpeg_error

# ``reduced``: 1 where the image was decoded at libjpeg's reduced scale (``decode: reduced``)
MEASURE = np.dtype([("crc", "<u4"), ("mean", "<f4"), ("worst", "u1"), ("state", "u1"), ("reduced", "u1")])
# ``state``: UNMEASURED where imdecode refused the JPEG; KEPT: a source JPEG stored as it was
NOT_WRITTEN, JPEG, RAW, UNMEASURED, KEPT = 0, 1, 2, 3, 4
DIGEST_BLOCK = 1 << 20  # rows hashed at a time: the summary's memory does not grow with the dataset


def measured_fields(spec: DatasetSpec) -> list[str]:
    """The fields whose images are measured as written: the ``rgb_image`` fields."""
    return [f.name for f in spec.fields if f.type == "rgb_image"]


class ImageMeasure:
    """Per measured field, one ``MEASURE`` row per source index, in memory the workers share."""

    def __init__(self, names: list[str], length: int, reduced: frozenset[str] = frozenset()):
        self.reduced = reduced  # the fields with ``decode: reduced``: their summaries count it
        self.rows = {
            name: np.frombuffer(mmap.mmap(-1, max(length, 1) * MEASURE.itemsize), dtype=MEASURE)[:length]
            for name in names
        }

    def wrap(self, name: str, encoder, max_resolution: int | None, current_index: Callable[[], int | None]):
        """``encoder`` whose encode measures what it stores for the source index being written."""
        encode, rows = encoder.encode, self.rows[name]

        def measured_encode(destination, image, malloc):
            index = current_index()
            kept = isinstance(image, KeptJPEG)
            if not (kept or isinstance(image, np.ndarray)) or index is None or not 0 <= index < len(rows):
                return encode(destination, image, malloc)  # a replayed sample, a value ffcv will refuse
            reduced = was_reduced(image)
            if not kept:
                image = ffcv_resizer(image, max_resolution)  # ffcv's resizer: its own call is then a no-op
            stored: list[np.ndarray] = []

            def remembering_malloc(size: int):
                pointer, storage = malloc(size)
                stored.append(storage)
                return pointer, storage

            encode(destination, image, remembering_malloc)
            row = measure_kept(image, stored[-1]) if kept else measure(destination, image, stored[-1])
            rows[index] = (*row, reduced)

        encoder.encode = measured_encode
        return encoder

    def summary(self, order: np.ndarray) -> dict[str, Any]:
        """Per field, over ``order`` (the source index of each row of the file, in file order): how
        many rows were measured and how, their JPEG error statistics, and ``payload_crc32_sha256``."""
        return {name: _summary(rows, order, name in self.reduced) for name, rows in self.rows.items()}


def measure(destination, image: np.ndarray, payload: np.ndarray) -> tuple:
    """One stored image's ``MEASURE`` row: its CRC-32, and for a JPEG the mean and largest absolute
    pixel error of ffcv's decode of it against ``image``, the pixels it was encoded from."""
    crc = zlib.crc32(payload)
    if destination["mode"] == IMAGE_MODE_RAW:
        return crc, 0.0, 0, RAW  # ffcv copied the pixels themselves
    decoded = _ffcv_decoded(payload, *image.shape[:2])
    if decoded is None:
        return crc, 0.0, 0, UNMEASURED  # the verification compares this field image by image
    return (crc, *jpeg_error(decoded, image), JPEG)


def measure_kept(image: KeptJPEG, payload: np.ndarray) -> tuple:
    """A kept JPEG's ``MEASURE`` row: its CRC-32, and KEPT where ffcv's ``imdecode`` decodes it at the
    frame's size (the stored bytes are the source's: there is no pixel error to measure)."""
    crc = zlib.crc32(payload)
    if _ffcv_decoded(payload, image.height, image.width) is None:
        return crc, 0.0, 0, UNMEASURED  # the verification compares it, and its decoder check names it
    return crc, 0.0, 0, KEPT


def _ffcv_decoded(payload: np.ndarray, height: int, width: int) -> np.ndarray | None:
    """The stored JPEG decoded by ffcv's own ``imdecode`` at ``height`` x ``width``, as a Loader
    decodes it; None where the library is absent or it returns non-zero."""
    decoded = np.empty((height, width, 3), dtype=np.uint8)
    if libffcv() is None or ffcv_imdecode(payload, decoded, height, width) != 0:
        return None
    return decoded


def _summary(rows: np.ndarray, order: np.ndarray, count_reduced: bool = False) -> dict[str, Any]:
    counts = np.zeros(5, dtype=np.int64)
    reduced = 0
    error_sum, error_max, worst = 0.0, 0.0, 0
    digest = hashlib.sha256()
    for start in range(0, len(order), DIGEST_BLOCK):
        block = rows[order[start : start + DIGEST_BLOCK]]
        counts += np.bincount(block["state"], minlength=5)
        reduced += int(np.count_nonzero(block["reduced"]))
        jpeg = block[block["state"] == JPEG]
        if jpeg.size:
            error_sum += float(jpeg["mean"].astype(np.float64).sum())
            error_max = max(error_max, float(jpeg["mean"].max()))
            worst = max(worst, int(jpeg["worst"].max()))
        digest.update(block["crc"].astype("<u4").tobytes())
    summary = {
        "samples": int(len(order)),
        "jpeg": int(counts[JPEG]),
        "raw": int(counts[RAW]),
        "kept": int(counts[KEPT]),
        "unmeasured": int(counts[NOT_WRITTEN] + counts[UNMEASURED]),
        "jpeg_mean_abs_error_sum": error_sum,
        "jpeg_mean_abs_error_max": error_max,
        "jpeg_max_abs_error_max": worst,
        "payload_crc32_sha256": digest.hexdigest(),
    }
    if count_reduced:
        summary["reduced_decode"] = reduced
    return summary


def image_measure(spec: DatasetSpec, length: int) -> ImageMeasure | None:
    names = measured_fields(spec)
    reduced = frozenset(f.name for f in spec.fields if decodes_reduced(f))  # rgb_image fields, all measured
    return ImageMeasure(names, length, reduced) if names else None
