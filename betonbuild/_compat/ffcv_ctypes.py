"""ctypes bindings to ffcv's compiled ``_libffcv`` (its ``imdecode``) and to the libturbojpeg it links.

Verification decodes every stored JPEG the way ffcv's Loader decodes it, and the source JPEGs of
an image folder the way PIL does, without importing the ffcv package: importing it imports torch
(~1 s of one core), and numba's compilation holds the GIL that the decoding threads need. The
argument types are ffcv 1.0.2's (``ffcv/libffcv.py``); a changed signature would crash, so the
version is pinned here and checked by ``tests/unit/compat``.
"""

from __future__ import annotations

import ctypes
import os
from functools import lru_cache

import numpy as np

from betonbuild._compat import Checked
from betonbuild.beton.payloads import MAX_DECODED_PIXELS

CHECKED = (
    Checked(
        "ffcv",
        "1.0.2",
        why="imdecode's argument types, and _libffcv*.so loading libturbojpeg.so.0: stored JPEGs decoded "
        "through ffcv's own C call without importing ffcv (torch, ~1 s of one core) in the verifying process, "
        "and source JPEGs 1.5-3x faster than PIL",
    ),
)


def libffcv():
    """ffcv's compiled extension through ctypes, as ``ffcv.libffcv`` loads it (``CDLL(_libffcv.__file__)``),
    found without importing the ffcv package (which imports torch: ~1 s of one core); None if absent
    (``libffcv_problem`` says why)."""
    return _load_libffcv()[0]


def libffcv_problem() -> str | None:
    """Why ffcv's compiled library could not be loaded, or None when it was."""
    return _load_libffcv()[1]


@lru_cache(maxsize=1)
def _load_libffcv():
    """(the library, None), or (None, why not): verification reports which decoder it used and why."""
    import ctypes
    import glob
    import importlib.util

    found = importlib.util.find_spec("ffcv")
    if found is None or not found.submodule_search_locations:
        return None, "the ffcv package is not installed"
    folder = list(found.submodule_search_locations)[0]
    paths = sorted(glob.glob(os.path.join(folder, "_libffcv*.so")))
    if not paths:
        return None, f"ffcv's compiled library _libffcv*.so is not in {folder}"
    try:
        lib = ctypes.CDLL(paths[0])
    except OSError as exc:
        return None, f"loading ffcv's compiled library {paths[0]} failed: {exc}"
    c = ctypes
    lib.imdecode.argtypes = [
        c.c_void_p,
        c.c_uint64,
        c.c_uint32,
        c.c_uint32,
        c.c_void_p,
        c.c_uint32,
        c.c_uint32,
        c.c_uint32,
        c.c_uint32,
        c.c_uint32,
        c.c_uint32,
        c.c_bool,
        c.c_bool,
    ]  # as ffcv.libffcv
    lib.imdecode.restype = c.c_int
    return lib, None


# tjDecompress2's arguments after its handle: the JPEG (pointer, size), the output, width, pitch,
# height, pixel format and flags; gray_jpeg's numba-callable prototype passes the handle as an integer.
TJ_DECOMPRESS2_AFTER_HANDLE = (
    ctypes.c_void_p,
    ctypes.c_ulong,
    ctypes.c_void_p,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
)


@lru_cache(maxsize=1)
def turbojpeg():
    if libffcv() is None:  # loading it loads the libturbojpeg that _libffcv links against
        return None
    try:
        lib = ctypes.CDLL("libturbojpeg.so.0")
    except OSError:
        return None
    lib.tjInitDecompress.restype = ctypes.c_void_p
    lib.tjDestroy.argtypes = [ctypes.c_void_p]
    int_p = ctypes.POINTER(ctypes.c_int)
    lib.tjDecompressHeader3.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ulong, int_p, int_p, int_p, int_p]
    lib.tjDecompress2.argtypes = [ctypes.c_void_p, *TJ_DECOMPRESS2_AFTER_HANDLE]
    return lib


def ffcv_imdecode(payload: np.ndarray, out: np.ndarray, height: int, width: int) -> int:
    """``ffcv.libffcv.imdecode(payload, out, height, width, height, width, 0, 0, 1, 1, False, False)``:
    the same C function of ffcv's compiled library, with the same arguments (no crop, no flip: one
    tjDecompress2 with TJFLAG_FASTDCT), called without importing the ffcv package."""
    lib = libffcv()
    if lib is None:
        return -1
    return lib.imdecode(
        payload.ctypes.data, payload.size, height, width, out.ctypes.data, height, width, 0, 0, 1, 1, False, False
    )


class TurboJPEG:
    """libjpeg-turbo's default decode (integer IDCT, fancy upsampling: what PIL and cv2 do), via the
    libturbojpeg that ffcv itself links against; one handle per chunk, so per thread.
    ``decode_rgb`` returns None for anything it does not handle (CMYK, warnings, no library).
    """

    def __init__(self):
        self.lib = turbojpeg()
        self.handle = self.lib.tjInitDecompress() if self.lib is not None else None
        self.out: np.ndarray | None = None

    def decode_rgb(self, data: np.ndarray, reuse: bool = False) -> np.ndarray | None:
        """The RGB pixels; with ``reuse``, in this decoder's one output array (valid until the next call)."""
        import ctypes

        if not self.handle:
            return None
        width, height, subsampling, colorspace = (ctypes.c_int() for _ in range(4))
        if self.lib.tjDecompressHeader3(
            self.handle,
            data.ctypes.data,
            data.size,
            ctypes.byref(width),
            ctypes.byref(height),
            ctypes.byref(subsampling),
            ctypes.byref(colorspace),
        ):
            return self._renewed()
        if colorspace.value not in (0, 1, 2) or not 0 < width.value * height.value <= MAX_DECODED_PIXELS:
            return None  # CMYK / YCCK: the writer's path decides
        shape = (height.value, width.value, 3)
        out = self.out if reuse and self.out is not None and self.out.shape == shape else np.empty(shape, np.uint8)
        if reuse:
            self.out = out
        if self.lib.tjDecompress2(
            self.handle, data.ctypes.data, data.size, out.ctypes.data, width.value, 0, height.value, 0, 0
        ):  # pixel format 0 = RGB, flags 0 = the library defaults
            return self._renewed()
        return out

    def _renewed(self) -> None:
        """None, with a new handle: Debian 12's libturbojpeg 2.1.5 leaves a handle whose header read
        failed (e.g. "Unsupported JPEG process: SOF type 0xcf") failing every later JPEG with that
        error, so one damaged file would send the rest of a worker's images the slow way."""
        self.close()
        self.handle = self.lib.tjInitDecompress()
        return None

    def close(self) -> None:
        if self.handle:
            self.lib.tjDestroy(self.handle)
            self.handle = None
