"""A .beton's header read from the file's first bytes, without ``BetonFile`` (which checks the
whole file before anything is read): the format version a report checks before the reader
refuses another one, and the size of a file that is only measured (the smoke file, whose bytes
per sample estimate the full file's size)."""

from __future__ import annotations

import os

import numpy as np

from betonbuild.beton.format import ALLOC_TABLE_TYPE, FIELD_DESC_TYPE, HEADER_TYPE


def read_header(path: str | os.PathLike) -> np.void | None:
    """The header record (``HEADER_TYPE``); None for a file too short to hold one. OSError as open raises it."""
    with open(path, "rb") as fh:
        head = fh.read(HEADER_TYPE.itemsize)
    if len(head) < HEADER_TYPE.itemsize:
        return None
    return np.frombuffer(head, dtype=HEADER_TYPE)[0]


MAX_SCALED_TABLE = 64 << 20  # bytes of allocation table read to scale a file (a smoke file's is a few KiB)
RECORD_BOUND = 16  # bytes of metadata per field and sample: ffcv's built-in records are at most 16


def scaled_size(path: str | os.PathLike, samples: int) -> int | None:
    """Bytes of a file like ``path`` holding ``samples`` samples: its payloads and allocation records
    per sample (from its allocation table) scaled, its header, descriptors and two pages (the padding
    before the data pages, a last page's unused end) not: a smoke file of a few tiny samples is
    mostly one 8 MiB page, which scaled per sample would be many times any disk. None when the file
    cannot say (no header, a table not of whole records or larger than ``MAX_SCALED_TABLE``)."""
    header = read_header(path)
    if header is None:
        return None
    table_bytes = os.path.getsize(path) - int(header["alloc_table_ptr"])
    if not 0 <= table_bytes <= MAX_SCALED_TABLE or table_bytes % ALLOC_TABLE_TYPE.itemsize:
        return None
    with open(path, "rb") as fh:
        fh.seek(int(header["alloc_table_ptr"]))
        table = np.frombuffer(fh.read(table_bytes), dtype=ALLOC_TABLE_TYPE)
    num_fields = int(header["num_fields"])
    per_sample = (table_bytes + int(table["size"].sum())) / max(1, int(header["num_samples"]))
    fixed = HEADER_TYPE.itemsize + FIELD_DESC_TYPE.itemsize * num_fields + 2 * int(header["page_size"])
    return int(fixed + samples * (per_sample + RECORD_BOUND * num_fields))
