"""Real bad files for the tests of issue 17: a decompression bomb, a 16-bit PNG, an implausible __len__."""

from __future__ import annotations

import struct
import textwrap
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

HUGE_ADAPTER = textwrap.dedent(
    """
    class Huge:
        def __len__(self):
            return 10**12

        def __getitem__(self, i):
            return (float(i), i)


    class Broken(Huge):
        def __len__(self):
            return 10**30


    def huge():
        return Huge()


    def broken():
        return Broken()
    """
)


def write_bomb_png(path: Path, side: int = 30000) -> None:
    """A real 1-bit PNG of side x side black pixels (~110 KB for 30000), written row by row, so
    that making it never holds the image in memory."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    packer = zlib.compressobj(9)
    row = b"\0" * (1 + (side + 7) // 8)  # filter byte 0, then the row's bits
    compressed = b"".join(packer.compress(row) for _ in range(side)) + packer.flush()
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)  # 1-bit greyscale
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", compressed) + chunk(b"IEND", b""))


def write_16_bit_png(path: Path) -> None:
    """A 12-bit scan stored as a 16-bit greyscale PNG: PIL opens it as mode I;16, values up to 4095."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.arange(4096, dtype=np.uint16).reshape(64, 64)).save(path)
