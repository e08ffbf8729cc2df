"""A merge part's metadata and allocation table: checked, shifted and written in blocks of rows.

Each part's tables are read twice, ``BLOCK_ROWS`` rows at a time: once to check every pointer before
the merge writes anything, once to shift and write them (checked again, so a part that changed in
between is refused, never merged unchecked). The merge's memory is a few MiB at any size; holding
every part's tables whole, it peaked at 40 bytes a sample (4 GB at 100M rows). Reads are ``pread``s
(``np.fromfile``): a part that shrinks mid-read is a short read and a ``MergeError``, where a memory
map would kill the process with SIGBUS.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from betonbuild.beton.copy import pwrite_all
from betonbuild.beton.format import ALLOC_TABLE_TYPE, FIELD_DESC_TYPE, HEADER_TYPE, WHOLE_COLUMN, page_aligned
from betonbuild.errors import MergeError

BLOCK_ROWS = 1 << 18


@dataclass
class Column:
    """One field's place in the metadata record and which of its sub-columns are file offsets."""

    name: str
    type_id: int
    dtype: np.dtype
    pointers: tuple[str, ...]


@dataclass
class Part:
    index: int
    path: str
    size: int
    version: int
    num_fields: int
    page_size: int
    num_samples: int
    alloc_table_ptr: int
    descriptors: bytes = b""
    num_allocations: int = 0
    data_start: int = 0
    data_end: int = 0
    used_end: int = 0  # where the last allocation's bytes end (ffcv writes its last page whole)

    @property
    def label(self) -> str:
        return f"part {self.index} ({self.path})"

    @property
    def data_bytes(self) -> int:
        return self.data_end - self.data_start

    @property
    def used_bytes(self) -> int:
        """The data region up to its last allocated byte: all a merge copies (the rest stays a hole)."""
        return self.used_end - self.data_start

    @property
    def metadata_start(self) -> int:
        return HEADER_TYPE.itemsize + FIELD_DESC_TYPE.itemsize * self.num_fields


def check_tables(part: Part, record_type: np.dtype, columns: list[Column]) -> None:
    """The part's layout (metadata, data region and table inside the file) and every pointer of its
    metadata and allocation table inside its data region; sets its data region and allocation count."""
    metadata_end = part.metadata_start + record_type.itemsize * part.num_samples
    if not metadata_end <= part.alloc_table_ptr <= part.size:
        raise MergeError(
            f"{part.label}: truncated or corrupt: {part.num_samples} samples of metadata end at byte {metadata_end}, "
            f"the allocation table pointer is {part.alloc_table_ptr}, the file has {part.size} bytes"
        )
    table_bytes = part.size - part.alloc_table_ptr
    if table_bytes % ALLOC_TABLE_TYPE.itemsize:
        raise MergeError(f"{part.label}: allocation table of {table_bytes} bytes is not a whole number of entries")
    part.num_allocations = table_bytes // ALLOC_TABLE_TYPE.itemsize
    part.data_start = page_aligned(metadata_end, part.page_size)
    part.data_end = max(part.data_start, part.alloc_table_ptr)
    part.used_end = part.data_start
    for check in (_check_sample_ids, _check_allocation_pointers):  # every sample id first, as one pass did
        for k, table in _blocks(part, part.alloc_table_ptr, ALLOC_TABLE_TYPE, part.num_allocations):
            check(part, table, k)
    for k, records in _blocks(part, part.metadata_start, record_type, part.num_samples):
        _check_pointers(part, records, columns, k)


def write_metadata(fd: int, part: Part, record_type: np.dtype, columns: list[Column], offset: int, shift: int) -> int:
    """The part's metadata records, pointers shifted by ``shift``, written at ``offset``; returns the bytes written."""
    written = 0
    for k, records in _blocks(part, part.metadata_start, record_type, part.num_samples):
        _check_pointers(part, records, columns, k)
        for i, column in enumerate(columns):
            for sub in column.pointers:
                values = records[f"f{i}"] if sub == WHOLE_COLUMN else records[f"f{i}"][sub]
                values += values.dtype.type(shift)
        pwrite_all(fd, memoryview(records.view(np.uint8)), offset + written)
        written += records.nbytes
    return written


def write_allocations(fd: int, part: Part, offset: int, shift: int, first_sample: int) -> int:
    """The part's allocation table, pointers shifted and sample ids offset, written at ``offset``; returns the bytes."""
    written = 0
    for k, table in _blocks(part, part.alloc_table_ptr, ALLOC_TABLE_TYPE, part.num_allocations):
        _check_sample_ids(part, table, k)
        _check_allocation_pointers(part, table, k)
        table["ptr"] += np.uint64(shift)
        table["sample_id"] += np.uint64(first_sample)
        pwrite_all(fd, memoryview(table.view(np.uint8)), offset + written)
        written += table.nbytes
    return written


def _blocks(part: Part, start: int, dtype: np.dtype, count: int) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, rows) of ``count`` records of ``dtype`` from byte ``start`` of the part, ``BLOCK_ROWS`` at a time."""
    try:
        fh = open(part.path, "rb")
    except OSError as exc:
        raise MergeError(f"{part.label}: cannot read it: {exc.strerror or exc}") from exc
    with fh:
        fh.seek(start)
        for k in range(0, count, BLOCK_ROWS):
            want = min(BLOCK_ROWS, count - k)
            rows = np.fromfile(fh, dtype=dtype, count=want)
            if len(rows) != want or os.fstat(fh.fileno()).st_size != part.size:
                raise MergeError(f"{part.label}: the file changed size while it was being read")
            yield k, rows


def _low_high(part: Part) -> tuple[int, int]:
    # ffcv's allocator gives a size-0 allocation made before a worker's first page the pointer
    # data_start - page_size; such pointers are shifted like the others but are never read.
    return max(0, part.data_start - part.page_size), part.data_end


def _check_sample_ids(part: Part, table: np.ndarray, k0: int) -> None:
    bad = table["sample_id"] >= part.num_samples
    if bad.any():
        k = int(np.argmax(bad))
        raise MergeError(
            f"{part.label}: allocation {k0 + k} names sample {int(table['sample_id'][k])} of {part.num_samples}"
        )


def _check_allocation_pointers(part: Part, table: np.ndarray, k0: int) -> None:
    low, high = _low_high(part)
    sized = table["size"] > 0
    bad = np.where(
        sized,
        (table["ptr"] < part.data_start) | (table["ptr"] + table["size"] > part.data_end),
        (table["ptr"] < low) | (table["ptr"] > high),
    )
    if bad.any():
        k = int(np.argmax(bad))
        raise MergeError(
            f"{part.label}: allocation {k0 + k} [{int(table['ptr'][k])}, +{int(table['size'][k])}) lies outside "
            f"its data region [{part.data_start}, {part.data_end})"
        )
    if sized.any():
        part.used_end = max(part.used_end, int((table["ptr"][sized] + table["size"][sized]).max()))


def _check_pointers(part: Part, records: np.ndarray, columns: list[Column], k0: int) -> None:
    low, high = _low_high(part)
    for i, column in enumerate(columns):
        for sub in column.pointers:
            values = records[f"f{i}"] if sub == WHOLE_COLUMN else records[f"f{i}"][sub]
            bad = (values < low) | (values > high)
            if bad.any():
                k = int(np.argmax(bad))
                label = column.name if sub == WHOLE_COLUMN else f"{column.name}.{sub}"
                raise MergeError(
                    f"{part.label}: sample {k0 + k} field {label!r} points to byte {int(values[k])}, outside its "
                    f"data region [{part.data_start}, {part.data_end})"
                )
