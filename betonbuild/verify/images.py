"""Decoding images for the comparison: the file's stored images as ffcv's Loader decodes them, and
an image folder's source JPEGs as PIL decodes them (both through ``betonbuild._compat.ffcv_ctypes``)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from betonbuild._compat.ffcv_ctypes import TurboJPEG, ffcv_imdecode, libffcv, turbojpeg
from betonbuild.beton.format import IMAGE_MODE_RAW, BetonFile
from betonbuild.beton.payloads import MAX_DECODED_PIXELS, decode_image, jpeg_dimensions


class StoredImages:
    """One chunk's stored images of one field, decoded the way ffcv's Loader decodes them.

    JPEGs go through ffcv's own libjpeg-turbo call (fast DCT, RGB out, GIL released), so the
    reported pixel error is the error a Loader user gets; should it refuse a payload, cv2 decides.
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
        if ffcv_imdecode(payload, out, height, width) != 0:
            return decode_image(self.beton, self.name, position)
        return out


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
