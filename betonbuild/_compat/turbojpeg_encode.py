"""ffcv's JPEG encode (``cv2.imencode`` of the RGB image turned BGR) done by libturbojpeg straight from
the RGB pixels: the same bytes, without the ``cv2.cvtColor`` copy (4-7% less encode CPU, measured in
an alternating two-process run over benchmark 3's crops at e643e06).

ffcv 1.0.2 encodes with ``cv2.imencode(".jpg", cv2.cvtColor(image, RGB2BGR), [QUALITY, q])``.
opencv-python 5.0.0.93 bundles libjpeg-turbo 3.1.2 and hands it the BGR rows as ``JCS_EXT_BGR``
with libjpeg's defaults: 4:2:0, the accurate integer DCT, standard Huffman tables, a JFIF header.
``tjCompress2`` of the RGB rows (``TJPF_RGB``, ``TJSAMP_420``, ``TJFLAG_ACCURATEDCT``) runs the same
colour conversion and the same encoder: measured byte-identical on the 20,000 crops of benchmark 3
and on scikit-image's photos at every quality (tests/unit/compat/test_turbojpeg_encode.py). The
libturbojpeg is the one ffcv links against (Debian 12's 2.1.5 here), another build than OpenCV's;
so a process proves the equality before it relies on it: ``encode_jpeg`` first encodes a few test
images with libturbojpeg at that quality and compares the bytes with cv2's, and falls back to cv2
for good if any byte differs, or if the library is absent.

cv2's side of the proof is read from ``cv2_jpeg_digests`` (cv2's bytes of the same images at every
quality, recorded with the opencv-python whose version it names) when the installed opencv-python is
that version: a write worker then never imports cv2 (0.13 s of each worker's core, 4-5% of
benchmark 3's write). Any other version: cv2 encodes the images there and then. The verdict is kept
per quality and inherited by forked workers (the writer's parent proves it as it builds the fields,
``prove``); each thread encodes with its own handle and buffer, and a forked child makes its own.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import re
import threading
from functools import cache

import numpy as np

from betonbuild._compat import Checked
from betonbuild._compat.cv2_jpeg_digests import CV2_JPEG_DIGESTS, RECORDED_WITH
from betonbuild._compat.ffcv_ctypes import turbojpeg

CHECKED = (
    Checked(
        "opencv-python",
        "5.0.0.93",
        why="cv2.imencode's JPEG settings (4:2:0, accurate DCT, no Huffman optimisation) equal tjCompress2's "
        "with TJSAMP_420 and TJFLAG_ACCURATEDCT: ffcv's JPEG bytes without cv2.cvtColor's copy, 4-7% of the encode CPU",
    ),
)

TJPF_RGB, TJSAMP_420 = 0, 2  # turbojpeg.h
TJFLAG_NOREALLOC, TJFLAG_ACCURATEDCT = 1024, 4096


def cv2_encode(image: np.ndarray, quality: int) -> np.ndarray | None:
    """ffcv's ``encode_jpeg``: RGB to BGR, then OpenCV's JPEG encoder at ``quality``; None if it failed."""
    import cv2

    success, result = cv2.imencode(
        ".jpg", cv2.cvtColor(image, cv2.COLOR_RGB2BGR), [int(cv2.IMWRITE_JPEG_QUALITY), quality]
    )
    return result.reshape(-1) if success else None


class TurboJPEGEncoder:
    """``tjCompress2`` of HxWx3 uint8 RGB images into one reused buffer; ``encode`` returns a view of
    it, valid until the next call. One per thread of each process (``_proven``'s key): a handle and
    its buffer serve one caller at a time."""

    def __init__(self, lib):
        self.lib = lib
        lib.tjInitCompress.restype = ctypes.c_void_p
        lib.tjBufSize.restype = ctypes.c_ulong
        lib.tjBufSize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.tjCompress2.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.POINTER(ctypes.c_ulong),
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
        ]
        lib.tjDestroy.argtypes = [ctypes.c_void_p]
        self.handle = lib.tjInitCompress()
        self.buffer = np.empty(0, np.uint8)
        self.buffer_address = 0
        self.pointer, self.size = ctypes.c_void_p(), ctypes.c_ulong()

    def __del__(self):
        if getattr(self, "handle", None):
            self.lib.tjDestroy(self.handle)
            self.handle = None

    def encode(self, image: np.ndarray, quality: int) -> np.ndarray | None:
        """The JPEG bytes of ``image`` (RGB) at ``quality``; None if libturbojpeg refused it."""
        height, width = image.shape[:2]
        if image.strides[1:] != (3, 1):
            image = np.ascontiguousarray(image)
        needed = self.lib.tjBufSize(width, height, TJSAMP_420)
        if self.buffer.size < needed:
            self.buffer = np.empty(needed, np.uint8)
            self.buffer_address = self.buffer.ctypes.data  # once: ``.ctypes`` costs ~1.5 us a call
        self.pointer.value, self.size.value = self.buffer_address, self.buffer.size
        failed = self.lib.tjCompress2(
            self.handle,
            image.ctypes.data,
            width,
            image.strides[0],
            height,
            TJPF_RGB,
            ctypes.byref(self.pointer),
            ctypes.byref(self.size),
            TJSAMP_420,
            quality,
            TJFLAG_NOREALLOC | TJFLAG_ACCURATEDCT,
        )
        return None if failed else self.buffer[: self.size.value]


def proof_images() -> list[np.ndarray]:
    """Images that exercise what could differ: noise (every coefficient), a gradient (smooth blocks,
    rounding), odd sizes (edge padding of the 16x16 blocks of 4:2:0), a strided view (the pitch)."""
    rng = np.random.default_rng(18)
    noise = rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)
    y, x = np.mgrid[0:48, 0:71]
    gradient = np.stack([x * 3, y * 5, (x + y) * 2], axis=-1).astype(np.uint8)
    wide = rng.integers(0, 256, (9, 40, 3), dtype=np.uint8)
    return [noise, gradient, wide[:, 5:37], np.zeros((1, 1, 3), np.uint8)]


def proof_digest(encoded: list[np.ndarray]) -> str:
    """One digest of the proof images' JPEG bytes, in order (``cv2_jpeg_digests`` records cv2's)."""
    digest = hashlib.sha256()
    for jpeg in encoded:
        digest.update(len(jpeg).to_bytes(8, "little"))
        digest.update(jpeg.tobytes())
    return digest.hexdigest()[:32]


def installed_opencv_version() -> str | None:
    """The installed cv2's ``opencv_version``, read from its ``version.py`` without importing cv2."""
    spec = importlib.util.find_spec("cv2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(next(iter(spec.submodule_search_locations)), "version.py")
    try:
        with open(path) as fh:
            found = re.search(r'^opencv_version = "([^"]+)"', fh.read(), re.MULTILINE)
    except OSError:
        return None
    return found.group(1) if found else None


def live_cv2_proof_digest(quality: int) -> str:
    """``proof_digest`` of the proof images as the installed cv2 encodes them now ("" if it refused one)."""
    theirs = [cv2_encode(image, quality) for image in proof_images()]
    return "" if any(jpeg is None for jpeg in theirs) else proof_digest(theirs)


def cv2_proof_digest(quality: int) -> str:
    """``proof_digest`` of cv2's bytes of the proof images at ``quality``: recorded for the installed
    opencv-python, else encoded by cv2 now."""
    if installed_opencv_version() == RECORDED_WITH and quality in CV2_JPEG_DIGESTS:
        return CV2_JPEG_DIGESTS[quality]
    return live_cv2_proof_digest(quality)


@cache
def prove(quality: int) -> bool:
    """Whether libturbojpeg gives cv2's bytes of every proof image at ``quality`` in this process (a
    forked child inherits the answer: the same library at the same address)."""
    lib = turbojpeg()
    if lib is None:
        return False
    encoder = TurboJPEGEncoder(lib)
    if not encoder.handle:
        return False
    ours = []
    for image in proof_images():
        jpeg = encoder.encode(image, quality)
        if jpeg is None:
            return False
        ours.append(jpeg.copy())  # the next encode reuses the buffer
    return proof_digest(ours) == cv2_proof_digest(quality)


_threads = threading.local()  # ``encoder``: this thread's TurboJPEGEncoder


def _forget_encoders() -> None:
    global _threads
    _threads = threading.local()  # a forked child makes its own handles and buffers


os.register_at_fork(after_in_child=_forget_encoders)


def encode_jpeg(image: np.ndarray, quality: int) -> np.ndarray:
    """ffcv's JPEG bytes of the RGB ``image``: libturbojpeg's where it is proven to give them, else
    cv2's. The result may be a view of a buffer reused by the next call: copy it before encoding again."""
    encoder = _encoder(quality)
    result = encoder.encode(image, quality) if encoder is not None else None
    if result is None:
        result = cv2_encode(image, quality)
    if result is None:
        raise ValueError("Impossible to encode image in jpeg")
    return result


def encoder_in_use(quality: int = 90) -> str:
    """Which encoder ``encode_jpeg`` uses in this thread (for tests and troubleshooting)."""
    return "libturbojpeg tjCompress2" if _encoder(quality) is not None else "cv2.imencode"


def _encoder(quality: int) -> TurboJPEGEncoder | None:
    """This thread's encoder, if libturbojpeg is proven at ``quality``; else None."""
    if not prove(quality):
        return None
    encoder = getattr(_threads, "encoder", None)
    if encoder is None:
        encoder = _threads.encoder = TurboJPEGEncoder(turbojpeg())
    return encoder if encoder.handle else None


def digests_module(path: str) -> None:
    """Records cv2's proof digests at every quality with the installed cv2 into ``path``
    (``cv2_jpeg_digests.py``): run after the opencv-python pin moves."""
    with open(path) as fh:
        text = fh.read()
    head, _, _ = text.partition("CV2_JPEG_DIGESTS")
    head = re.sub(r'RECORDED_WITH = "[^"]*"', f'RECORDED_WITH = "{installed_opencv_version()}"', head)
    rows = [f'    {quality}: "{live_cv2_proof_digest(quality)}",' for quality in range(1, 101)]
    with open(path, "w") as fh:
        fh.write(head + "CV2_JPEG_DIGESTS: dict[int, str] = {\n" + "\n".join(rows) + "\n}\n")


if __name__ == "__main__":
    digests_module(os.path.join(os.path.dirname(__file__), "cv2_jpeg_digests.py"))
