"""The data pages: each written at its own offset, in whatever order the workers fill them."""

from __future__ import annotations

import copy
import threading

import numpy as np

from betonbuild.write import pages
from betonbuild.write.pages import PageAllocator

PAGE = 1 << 21


def worker_copy(allocator: PageAllocator) -> PageAllocator:
    """What a forked worker holds: the shared page counter, a page buffer and records of its own."""
    other = copy.copy(allocator)
    other.page_data = np.zeros_like(allocator.page_data)
    other.allocations = []
    return other


def fill(allocator: PageAllocator, sample: int, value: int, size: int = 1000) -> int:
    allocator.current_sample_id = sample
    pointer, buffer = allocator.malloc(size)
    buffer[:] = value
    return pointer


def test_a_later_page_is_written_before_an_earlier_one_without_waiting(tmp_path):
    path = tmp_path / "file.beton"
    path.write_bytes(b"H" * 100)  # header and descriptors: the data region starts on the next page
    first = PageAllocator(str(path), 100, PAGE)
    second = worker_copy(first)
    with first, second:
        early = fill(first, 0, 7)  # page 0
        late = fill(second, 1, 9)  # page 1
        writing = threading.Thread(target=second.flush_page)
        writing.start()
        writing.join(timeout=10)
        waited = writing.is_alive()  # before: page 1 polled until page 0 was in the file
        first.flush_page()
        writing.join()
        first.my_page = second.my_page = -1  # both written: their exits have nothing left to write
    assert not waited, "page 1 waited for page 0"
    data = path.read_bytes()
    assert len(data) == 3 * PAGE  # the padding page, page 0, page 1: whole pages, as ffcv writes them
    assert (early, late) == (PAGE, 2 * PAGE)
    assert data[:100] == b"H" * 100 and data[100:PAGE] == bytes(PAGE - 100)  # the padding reads as zeros
    assert data[early : early + 1000] == bytes([7]) * 1000 and data[late : late + 1000] == bytes([9]) * 1000
    assert data[early + 1000 : late] == bytes(PAGE - 1000)


def test_each_written_page_has_its_writeback_started_and_a_failing_hint_changes_nothing(tmp_path, monkeypatch):
    asked = []
    hint = lambda fd, offset, length, flags: asked.append((offset, length)) or -1  # noqa: E731 - -1: it failed
    monkeypatch.setattr(pages, "SYNC_FILE_RANGE", hint)
    path = tmp_path / "file.beton"
    path.write_bytes(b"H" * 100)
    allocator = PageAllocator(str(path), 100, PAGE)
    with allocator:
        fill(allocator, 0, 5, PAGE - 10)
        fill(allocator, 1, 6, PAGE - 10)  # does not fit the rest of page 0: page 1
    assert asked == [(PAGE, PAGE), (2 * PAGE, PAGE)]
    data = path.read_bytes()
    assert data[PAGE : 2 * PAGE - 10] == bytes([5]) * (PAGE - 10)
    assert data[2 * PAGE : 3 * PAGE - 10] == bytes([6]) * (PAGE - 10)
    assert [record[0] for record in allocator.allocations] == [0, 1]


def test_libc_has_the_writeback_hint_on_linux():
    assert pages.SYNC_FILE_RANGE is not None
