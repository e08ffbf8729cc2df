"""Decoding images for the comparison: the file's stored images as ffcv's Loader decodes them, and
an image folder's source JPEGs as PIL decodes them (both through ``betonbuild._compat.ffcv_ctypes``)."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as dc_field
from functools import lru_cache

import numpy as np

from betonbuild._compat.ffcv_ctypes import TurboJPEG, ffcv_imdecode, libffcv, libffcv_problem, turbojpeg
from betonbuild.beton.format import IMAGE_MODE_RAW, BetonFile
from betonbuild.beton.payloads import MAX_DECODED_PIXELS, decode_image, jpeg_dimensions


class StoredImages:
    """One chunk's stored images of one field, decoded the way ffcv's Loader decodes them.

    JPEGs go through ffcv's own libjpeg-turbo call (fast DCT, RGB out, GIL released), so the
    reported pixel error is the error a Loader user gets. Where it returns non-zero, or its library
    cannot be loaded, cv2 decodes instead, and ``imdecode`` records it (``count``): the report's
    ``image_decoder`` check says so (``decoder_result``), never silently.
    Pointers, sizes and the JPEG's own dimensions are checked first, as ``beton.decode_image`` does.
    """

    def __init__(self, beton: BetonFile, name: str, start: int, stop: int):
        self.beton, self.name, self.start = beton, name, start
        meta = beton.metadata[name][start:stop]
        self.mode, self.width, self.height, self.ptr = (
            meta[k].tolist() for k in ("mode", "width", "height", "data_ptr")
        )
        self.size = beton.image_sizes(name, np.arange(start, stop)).tolist()
        self.out = np.empty((0, 0, 3), dtype=np.uint8)  # reused: decode overwrites what it last returned
        # position -> imdecode's return code (0: decoded by ffcv), None where its library is not loaded;
        # per position, so a JPEG decoded twice (the fast source path, then the writer's) counts once
        self.imdecode: dict[int, int | None] = {}

    def is_raw(self, position: int) -> bool:
        return self.mode[position - self.start] == IMAGE_MODE_RAW

    def decode(self, position: int) -> np.ndarray:
        """The image at ``position``; a JPEG is decoded into this chunk's one output array (a fresh
        196 KiB array per image costs page faults), so the result is valid until the next call."""
        k = position - self.start
        size, mode, width, height = self.size[k], self.mode[k], self.width[k], self.height[k]
        if size < 0:
            return decode_image(self.beton, self.name, position)  # raises the precise format error
        payload = self.beton.read(self.ptr[k], size)
        if mode == IMAGE_MODE_RAW:
            return np.asarray(payload).reshape(height, width, 3)
        if width * height > MAX_DECODED_PIXELS or jpeg_dimensions_fast(payload) != (width, height):
            return decode_image(self.beton, self.name, position)
        if self.out.shape != (height, width, 3):
            self.out = np.empty((height, width, 3), dtype=np.uint8)
        out = self.out
        code = ffcv_imdecode(payload, out, height, width) if libffcv() is not None else None
        self.imdecode[position] = code
        if code != 0:
            return decode_image(self.beton, self.name, position)  # cv2, reported by ``decoder_result``
        return out

    def count(self) -> DecoderCount:
        rejected = sorted((p, c) for p, c in self.imdecode.items() if c not in (0, None))
        ffcv = sum(c == 0 for c in self.imdecode.values())
        return DecoderCount(ffcv, len(self.imdecode) - ffcv, rejected[:MAX_REJECTED])


MAX_REJECTED = 5  # rejected images named per field and chunk


@dataclass
class DecoderCount:
    """Which decoder decoded one field's stored JPEGs: ffcv's ``imdecode`` or, instead, cv2."""

    ffcv_imdecode: int = 0
    cv2_fallback: int = 0
    rejected: list[tuple[int, int]] = dc_field(default_factory=list)  # (position, imdecode's code)

    def add(self, other: DecoderCount) -> None:
        self.ffcv_imdecode += other.ffcv_imdecode
        self.cv2_fallback += other.cv2_fallback
        self.rejected = sorted(self.rejected + other.rejected)[:MAX_REJECTED]


def decoder_result(dataset: str, counts: dict[str, DecoderCount], indices: np.ndarray) -> tuple[bool, str, dict]:
    """The ``image_decoder`` check: every stored JPEG decoded by ffcv's own ``imdecode``, as a training
    job's Loader decodes it. A JPEG it returned non-zero for fails: ffcv's Loader ignores that code
    and hands the job whatever libjpeg-turbo left in its buffer, which no comparison here has seen.
    When the library cannot be loaded at all, cv2 decodes every JPEG and the check says so and why."""
    fields, failures, notes = {}, [], []
    reason = libffcv_problem()
    for name, count in counts.items():
        fields[name] = {"ffcv_imdecode": count.ffcv_imdecode, "cv2_fallback": count.cv2_fallback}
        if count.cv2_fallback and reason:
            fields[name]["reason"] = reason
            notes.append(f"field '{name}': {count.cv2_fallback} JPEGs decoded by cv2, not by ffcv's imdecode")
        for position, code in count.rejected:
            failures.append(
                f"dataset '{dataset}' field '{name}' sample {position} (source index {int(indices[position])}): "
                f"ffcv's imdecode returned {code} for the stored JPEG (libjpeg-turbo refused it or warned); "
                "cv2 decoded it for the comparison, but ffcv's Loader ignores that code and hands a training "
                "job whatever the decoder left in its buffer"
            )
        if count.rejected:
            fields[name]["reason"] = f"ffcv's imdecode returned non-zero for {count.cv2_fallback} JPEGs"
    if failures:
        target = f"results/{dataset}/{dataset}.verify.json"
        fix = (
            f"rewrite the file (`snakemake --forcerun write write_part --cores 32 {target}`): "
            "ffcv's writer encodes each image with cv2, which ffcv's imdecode decodes"
        )
        return False, "; ".join(failures) + ". Fix: " + fix, {"fields": fields}
    if notes:
        why = f"{reason}; their pixel errors are cv2's, about 1 level from what ffcv's Loader decodes"
        return True, "; ".join(notes) + ": " + why, {"fields": fields}
    total = sum(c.ffcv_imdecode for c in counts.values())
    return (
        True,
        f"all {total} stored JPEGs decoded by ffcv's own imdecode, as ffcv's Loader decodes them",
        {"fields": fields},
    )


def jpeg_dimensions_fast(payload: np.ndarray) -> tuple[int, int] | None:
    """``beton.jpeg_dimensions``, parsing the first 4 KiB (where the SOF marker is) before it copies
    the whole payload: the parse is sequential, so a header found in the prefix is the same."""
    return jpeg_dimensions(payload[:4096]) or (jpeg_dimensions(payload) if payload.size > 4096 else None)


def load_decoders() -> None:
    """The decoders' libraries, loaded once by the main thread before the pool uses them."""
    libffcv()
    turbojpeg()
    cv2_rgb_flag()


@lru_cache(maxsize=1)
def cv2_rgb_flag() -> int:
    import cv2

    return getattr(cv2, "IMREAD_COLOR_RGB", cv2.IMREAD_COLOR)  # OpenCV >= 4.10 decodes straight to RGB


def decode_source_image(jpeg: TurboJPEG, data: np.ndarray) -> np.ndarray | None:
    """A source file's RGB pixels, by libjpeg-turbo directly (JPEG) or cv2; None where neither can.
    A JPEG lands in ``jpeg``'s one output array (valid until its next decode)."""
    import cv2

    try:
        rgb = jpeg.decode_rgb(data, reuse=True) if data[:2].tobytes() == b"\xff\xd8" else None
        if rgb is None and data.size:
            rgb = cv2.imdecode(data, cv2_rgb_flag() | cv2.IMREAD_IGNORE_ORIENTATION)
            if rgb is not None and rgb.ndim == 3 and cv2_rgb_flag() == cv2.IMREAD_COLOR:
                rgb = cv2.cvtColor(rgb, cv2.COLOR_BGR2RGB)
    except (OSError, cv2.error):
        rgb = None
    return rgb
