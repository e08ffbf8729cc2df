"""Data pages as ffcv 1.0.2's writer fills them (``ffcv.memory_allocator.MemoryAllocator`` and
``ffcv.writer.handle_sample``), so that betonbuild's writer lays out a file byte for byte as ffcv's:
with one worker the same file.

Each worker fills one page in memory at a time; the next page number comes from a counter shared by
the workers. A full page is written at its own offset (``os.pwrite``), whatever the other workers'
pages have reached: ffcv appends pages in number order, so its worker with a full page waits for
the pages before it (2-7% of the workers' time in a 2-worker JPEG write, measured at b9f689b). The
file's bytes are the same: the padding before the first page, zeros in ffcv's file, is a hole that
reads as zeros until the metadata table is written over its start. A worker's pages are written by
a thread of its own (``PageWriter``) while it fills the next one, with O_DIRECT where the file
system takes it, so that the copy into the page cache does not take the encoder's core. Through the
page cache, the kernel is asked to start writing each page to disk (``sync_file_range``), so that
the fsync before the file is published (``betonbuild.atomic``) waits for the last pages only, not
for all of them (0.15 s per 88 MiB here). A sample's allocations all lie on one page (ffcv's
Loader reads a sample from one page): a sample that does not fit the rest of a page is started
again on a fresh one, and one that does not fit a fresh page fails with ``MemoryError``. Every
allocation is recorded as (sample, pointer, size): the allocation table at the end of the file.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import queue
import threading
from multiprocessing import Value

import numpy as np

from betonbuild.beton.format import page_aligned

PAGE_BUFFERS = 2  # per worker: one filled by the worker, one written by its thread
O_DIRECT = getattr(os, "O_DIRECT", 0)  # none on macOS: pages then go through the page cache
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
        self.page_data: np.ndarray | None = None  # the page being filled, a PageWriter's buffer
        self.allocations: list[tuple[int, int, int]] = []
        self.current_sample_id: int | None = None

    def __enter__(self) -> PageAllocator:
        self.page_writer = PageWriter(self.fname, self.page_size)  # in the worker: its thread is its own
        return self

    def __exit__(self, exc_type, *exc_info) -> None:
        try:
            if exc_type is None:  # a failed write is discarded: its last page is not written
                self.flush_page()
        finally:
            self.page_writer.close()

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
            self.page_data = self.page_writer.free_page()
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
        """Hands this worker's page to its writer, to be written at the page's offset in the file."""
        if self.my_page < 0:
            return
        self.page_writer.write(self.page_data, self.offset + self.my_page * self.page_size)
        self.my_page, self.page_data = -1, None


class PageWriter:
    """A worker's full pages written by a thread of its own while the worker fills the next one,
    ``O_DIRECT`` where the file system takes it, from one of two page buffers.

    Buffered, the kernel copies each page into the page cache in the worker's time; with O_DIRECT
    the disk reads it from the buffer and the worker's core goes on encoding (benchmark 3's 380 MB
    JPEG write, 2 workers: system time 1.11-1.19 s at 7e28817, 0.53-0.60 s at 4bc13a5). Pages are
    aligned as O_DIRECT needs: their offsets and lengths are multiples of the page size (2 MiB or
    more), their buffers anonymous maps. A file system that refuses O_DIRECT (at open or at the
    first write, ``EINVAL``) is written through the page cache, each page's writeback started. A
    write error is raised in the worker at its next page, or at ``close``.
    """

    def __init__(self, fname: str, page_size: int):
        self.fname, self.page_size = fname, page_size
        self.direct = O_DIRECT != 0
        self.fd = self._open()  # closed by close
        self.free: queue.SimpleQueue = queue.SimpleQueue()
        for _ in range(PAGE_BUFFERS):
            self.free.put(np.frombuffer(mmap.mmap(-1, page_size), dtype="<u1"))
        self.full: queue.SimpleQueue = queue.SimpleQueue()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="betonbuild-page-writer", daemon=True)
        self.thread.start()

    def _open(self) -> int:
        if self.direct:
            try:
                return os.open(self.fname, os.O_WRONLY | O_DIRECT)
            except OSError:
                self.direct = False
        return os.open(self.fname, os.O_WRONLY)

    def free_page(self) -> np.ndarray:
        """A zeroed page buffer; waits while both are still being written."""
        page = self.free.get()
        self._raise()
        page.fill(0)
        return page

    def write(self, page: np.ndarray, at: int) -> None:
        """Hands ``page`` to the thread, to be written at file offset ``at``."""
        self._raise()
        self.full.put((page, at))

    def close(self) -> None:
        """Waits for the pages handed over to be written; raises the first write error."""
        self.full.put(None)
        self.thread.join()
        os.close(self.fd)
        self._raise()

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        while (job := self.full.get()) is not None:
            page, at = job
            try:
                if self.error is None:  # after an error the worker stops: nothing more is written
                    self._pwrite(page, at)
            except BaseException as exc:  # noqa: BLE001 - raised in the worker's own thread
                self.error = exc
            self.free.put(page)

    def _pwrite(self, page: np.ndarray, at: int) -> None:
        start, view = at, memoryview(page).cast("B")
        while view.nbytes:  # all of it: a write may write less than it is given
            try:
                written = os.pwrite(self.fd, view, at)
            except OSError as exc:
                if not self.direct or exc.errno != errno.EINVAL:
                    raise
                os.close(self.fd)  # O_DIRECT refused for this file: through the page cache
                self.direct = False
                self.fd = self._open()
                continue
            view, at = view[written:], at + written
        if not self.direct:
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
