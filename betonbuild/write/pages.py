"""Data pages as ffcv 1.0.2's writer fills them (``ffcv.memory_allocator.MemoryAllocator`` and
``ffcv.writer.handle_sample``), so that betonbuild's writer lays out a file byte for byte as ffcv's:
with one worker the same file.

Each worker fills one page in memory at a time; the next page number comes from a counter shared by
the workers. A full page is written at its own offset (``os.pwrite``), whatever the other workers'
pages have reached: ffcv appends pages in number order, so its worker with a full page waits for
the pages before it (2-7% of the workers' time in a 2-worker JPEG write, measured at b9f689b). The
file's bytes are the same: the padding before the first page, zeros in ffcv's file, is a hole that
reads as zeros until the metadata table is written over its start. After each page the kernel is
asked to start writing it to disk (``sync_file_range``), so that the fsync before the file is
published (``betonbuild.atomic``) waits for the last pages only, not for all of them (0.15 s per
88 MiB here). A sample's allocations all lie on one page (ffcv's Loader reads a sample
from one page): a sample that does not fit the rest of a page is started again on a fresh one, and
one that does not fit a fresh page fails with ``MemoryError``. Every allocation is recorded as
(sample, pointer, size): the allocation table at the end of the file.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from multiprocessing import Value

import numpy as np

from betonbuild.beton.format import page_aligned

SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writing the dirty pages of a range, do not wait


def _libc_sync_file_range():
    """libc's ``sync_file_range``, or None where there is none (not Linux): nothing is hinted."""
    with contextlib.suppress(OSError, AttributeError):
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
        function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        return function
    return None


SYNC_FILE_RANGE = _libc_sync_file_range()


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Asks the kernel to start writing ``length`` bytes at ``offset`` to disk now, in the
    background; a hint only (its failure changes nothing: the fsync at the end writes them)."""
    if SYNC_FILE_RANGE is not None:
        SYNC_FILE_RANGE(fd, offset, length, SYNC_FILE_RANGE_WRITE)


class PageAllocator:
    """``malloc(size) -> (file offset, writable buffer)`` within the current page; created in the
    parent before the workers fork, so that they share its page counters."""

    def __init__(self, fname: str, data_region_start: int, page_size: int):
        self.fname = fname
        self.offset = page_aligned(data_region_start, page_size)
        self.next_page_allocated = Value(ctypes.c_uint64, 0)
        self.page_size = page_size
        self.page_offset = 0
        self.my_page = -1
        self.page_data = np.zeros(page_size, "<u1")
        self.allocations: list[tuple[int, int, int]] = []
        self.current_sample_id: int | None = None

    def __enter__(self) -> PageAllocator:
        self.fd = os.open(self.fname, os.O_WRONLY)  # closed by __exit__
        return self

    def __exit__(self, *exc_info) -> None:
        self.flush_page()
        os.close(self.fd)

    def space_left_in_page(self) -> int:
        return self.page_size - self.page_offset if self.my_page >= 0 else 0

    def malloc(self, size: int) -> tuple[int, np.ndarray]:
        if size > self.page_size:
            raise ValueError(f"Tried allocating {size} but page size is {self.page_size}")
        if size > self.space_left_in_page():
            self.flush_page()
            with self.next_page_allocated.get_lock():
                self.my_page = self.next_page_allocated.value
                self.next_page_allocated.value = self.my_page + 1
            self.page_offset = 0
            self.page_data.fill(0)
            # The sample's allocations on the page just flushed are given up: it starts again here.
            if self.take_back(self.current_sample_id):
                raise MemoryError("Not enough memory to fit the whole sample")
        previous_offset = self.page_offset
        self.page_offset += size
        ptr = self.offset + self.my_page * self.page_size + previous_offset
        self.allocations.append((self.current_sample_id, ptr, size))
        return ptr, self.page_data[previous_offset : self.page_offset]

    def take_back(self, sample_id: int | None) -> bool:
        """Forgets the allocation records of ``sample_id`` (all at the list's tail: records leave it
        only between samples); whether there were any."""
        found = False
        while self.allocations and self.allocations[-1][0] == sample_id:
            self.allocations.pop()
            found = True
        return found

    def flush_page(self) -> None:
        """Writes this worker's page at its offset in the file, and starts its writeback."""
        if self.my_page < 0:
            return
        start = at = self.offset + self.my_page * self.page_size
        view = memoryview(self.page_data).cast("B")
        while view.nbytes:  # all of it: a write may write less than it is given
            written = os.pwrite(self.fd, view, at)
            view, at = view[written:], at + written
        start_writeback(self.fd, start, self.page_size)


def encode_sample(values: tuple, dest_ix: int, columns: list[np.ndarray], allocator: PageAllocator, fields) -> None:
    """Encodes one sample's ``values`` into its metadata row ``dest_ix`` (``columns``: each field's
    metadata column) and the data pages; a sample that met a full page is encoded again on a new one."""
    for attempt in range(2):
        try:
            allocator.current_sample_id = dest_ix
            for column, field, value in zip(columns, fields, values):
                field.encode(column[dest_ix : dest_ix + 1], value, allocator.malloc)
            return
        except MemoryError:
            if attempt == 1:
                raise
