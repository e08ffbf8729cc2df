"""Greyscale JPEG decoding through the libturbojpeg that ffcv's compiled library links
(``betonbuild._compat.ffcv_ctypes``): straight to one channel (TJPF_GRAY), with the fast DCT
ffcv's own ``imdecode`` uses, so that verification and the Loader's decoder give the same pixels."""

from __future__ import annotations

import ctypes

import numpy as np

from betonbuild._compat.ffcv_ctypes import TJ_DECOMPRESS2_AFTER_HANDLE, turbojpeg

TJPF_GRAY = 6  # libturbojpeg's one-channel pixel format
TJFLAG_FASTDCT = 2048  # the flag ffcv's own imdecode decodes with


def _library():
    lib = turbojpeg()
    if lib is None:
        raise RuntimeError("libturbojpeg (loaded through ffcv's compiled library) is not available")
    return lib


def decode_gray_jpeg(data: np.ndarray, height: int, width: int) -> np.ndarray:
    """A greyscale JPEG payload decoded as the Loader's decoder does, HxWx1 uint8."""
    lib = _library()
    handle = lib.tjInitDecompress()
    try:
        data = np.ascontiguousarray(data, dtype=np.uint8)
        out = np.empty((height, width, 1), np.uint8)
        failed = lib.tjDecompress2(
            handle, data.ctypes.data, data.size, out.ctypes.data, width, width, height, TJPF_GRAY, TJFLAG_FASTDCT
        )
        if failed:
            raise ValueError(f"libturbojpeg could not decode the {width}x{height} greyscale JPEG payload")
        return out
    finally:
        lib.tjDestroy(handle)


def tj_decompress():
    """(the library, tjDecompress2 taking its handle as an integer): callable from numba-compiled code."""
    lib = _library()
    # the handle as an integer: kept in a uint64 array per thread
    prototype = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, *TJ_DECOMPRESS2_AFTER_HANDLE)
    return lib, prototype(ctypes.cast(lib.tjDecompress2, ctypes.c_void_p).value)
