"""A .beton's header read from the file's first bytes, without ``BetonFile`` (which checks the
whole file before anything is read): the format version a report checks before the reader
refuses another one, and the sample count of a file that is only measured (the smoke file, whose
bytes per sample estimate the full file's size)."""

from __future__ import annotations

import os

import numpy as np

from betonbuild.beton.format import HEADER_TYPE


def read_header(path: str | os.PathLike) -> np.void | None:
    """The header record (``HEADER_TYPE``); None for a file too short to hold one. OSError as open raises it."""
    with open(path, "rb") as fh:
        head = fh.read(HEADER_TYPE.itemsize)
    if len(head) < HEADER_TYPE.itemsize:
        return None
    return np.frombuffer(head, dtype=HEADER_TYPE)[0]
