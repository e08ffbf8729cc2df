"""Data pages as ffcv 1.0.2's writer fills them (``ffcv.memory_allocator.MemoryAllocator`` and
``ffcv.writer.handle_sample``), so that betonbuild's writer lays out a file byte for byte as ffcv's:
with one worker the same file.

Each worker fills one page in memory at a time; the next page number comes from a counter shared by
the workers, and pages reach the file strictly in number order (a worker whose page is full waits
for the pages before it). A sample's allocations all lie on one page (ffcv's Loader reads a sample
from one page): a sample that does not fit the rest of a page is started again on a fresh one, and
one that does not fit a fresh page fails with ``MemoryError``. Every allocation is recorded as
(sample, pointer, size): the allocation table at the end of the file.
"""

from __future__ import annotations

import ctypes
import os
import time
from multiprocessing import Value

import numpy as np

from betonbuild.beton.format import page_aligned

PAGE_TURN_POLL_SECONDS = 0.001  # ffcv's: a worker waiting for its page's turn to be written


class PageAllocator:
    """``malloc(size) -> (file offset, writable buffer)`` within the current page; created in the
    parent before the workers fork, so that they share its page counters."""

    def __init__(self, fname: str, data_region_start: int, page_size: int):
        self.fname = fname
        self.offset = page_aligned(data_region_start, page_size)
        self.next_page_allocated = Value(ctypes.c_uint64, 0)
        self.next_page_written = Value(ctypes.c_uint64, 0)
        self.page_size = page_size
        self.page_offset = 0
        self.my_page = -1
        self.page_data = np.zeros(page_size, "<u1")
        self.allocations: list[tuple[int, int, int]] = []
        self.current_sample_id: int | None = None

    def __enter__(self) -> PageAllocator:
        self.fp = open(self.fname, "ab", buffering=0)  # noqa: SIM115 - closed by __exit__, as ffcv's
        return self

    def __exit__(self, *exc_info) -> None:
        self.flush_page()
        self.fp.close()

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
        """Appends this worker's page to the file once every page before it is there."""
        if self.my_page < 0:
            return
        while self.next_page_written.value != self.my_page:
            time.sleep(PAGE_TURN_POLL_SECONDS)
        if self.my_page == 0:  # the padding between the metadata table and the first page
            self._append(bytes(self.offset - self.fp.seek(0, os.SEEK_END)))
        self._append(self.page_data)  # the file is opened to append: the page lands at its offset
        with self.next_page_written.get_lock():
            self.next_page_written.value += 1

    def _append(self, data) -> None:
        """All of ``data`` written (an unbuffered write may write less than it is given)."""
        view = memoryview(data).cast("B")
        while view.nbytes:
            view = view[self.fp.write(view) :]


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
