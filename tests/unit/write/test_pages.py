"""The data pages: each written at its own offset, in whatever order the workers fill them, by a
thread of the worker's own, with O_DIRECT where the file system takes it."""

from __future__ import annotations

import copy
import errno
import fcntl
import os
import threading

import pytest

from betonbuild.write import pages
from betonbuild.write.pages import PageAllocator

PAGE = 1 << 21


def worker_copy(allocator: PageAllocator) -> PageAllocator:
    """What a forked worker holds: the shared page counter, records of its own (its page buffers
    come with its ``__enter__``)."""
    other = copy.copy(allocator)
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


def test_each_buffered_page_has_its_writeback_started_and_a_failing_hint_changes_nothing(tmp_path, monkeypatch):
    asked = []
    hint = lambda fd, offset, length, flags: asked.append((offset, length)) or -1  # noqa: E731 - -1: it failed
    monkeypatch.setattr(pages, "SYNC_FILE_RANGE", hint)
    monkeypatch.setattr(pages, "O_DIRECT", 0)  # through the page cache, as where there is no O_DIRECT
    allocator, path = two_pages(tmp_path)
    with allocator:
        fill(allocator, 0, 5, PAGE - 10)
        fill(allocator, 1, 6, PAGE - 10)  # does not fit the rest of page 0: page 1
    assert asked == [(PAGE, PAGE), (2 * PAGE, PAGE)]
    assert_two_pages_written(path)
    assert [record[0] for record in allocator.allocations] == [0, 1]


def test_libc_has_the_writeback_hint_on_linux():
    assert pages.SYNC_FILE_RANGE is not None


def direct_io_works(directory) -> bool:
    probe = directory / "probe"
    probe.write_bytes(b"")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_DIRECT))
        return True
    except OSError:
        return False


def two_pages(tmp_path) -> tuple[PageAllocator, os.PathLike]:
    path = tmp_path / "file.beton"
    path.write_bytes(b"H" * 100)
    allocator = PageAllocator(str(path), 100, PAGE)
    return allocator, path


def assert_two_pages_written(path) -> None:
    data = path.read_bytes()
    assert len(data) == 3 * PAGE
    assert data[PAGE : 2 * PAGE - 10] == bytes([5]) * (PAGE - 10) and data[2 * PAGE - 10 : 2 * PAGE] == bytes(10)
    assert data[2 * PAGE : 3 * PAGE - 10] == bytes([6]) * (PAGE - 10) and data[3 * PAGE - 10 :] == bytes(10)


def test_pages_go_to_disk_with_o_direct_and_no_writeback_hint(tmp_path, monkeypatch):
    if not direct_io_works(tmp_path):
        pytest.skip("this file system refuses O_DIRECT")
    asked = []
    monkeypatch.setattr(pages, "SYNC_FILE_RANGE", lambda *args: asked.append(args) or 0)
    allocator, path = two_pages(tmp_path)
    with allocator:
        fill(allocator, 0, 5, PAGE - 10)
        fill(allocator, 1, 6, PAGE - 10)
        assert allocator.page_writer.direct
    assert asked == []  # the disk had them already
    assert_two_pages_written(path)


def test_a_file_system_that_refuses_o_direct_writes_gets_them_through_the_page_cache(tmp_path, monkeypatch):
    real_pwrite, refused = os.pwrite, []

    def pwrite(fd, data, offset):
        if fcntl_flags(fd) & pages.O_DIRECT:
            refused.append(offset)
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(pages.os, "pwrite", pwrite)
    allocator, path = two_pages(tmp_path)
    with allocator:
        fill(allocator, 0, 5, PAGE - 10)
        fill(allocator, 1, 6, PAGE - 10)
    assert not allocator.page_writer.direct
    assert refused == ([PAGE] if direct_io_works(tmp_path) else [])  # one refusal, then no O_DIRECT
    assert_two_pages_written(path)


def fcntl_flags(fd: int) -> int:
    return fcntl.fcntl(fd, fcntl.F_GETFL)


def test_the_worker_fills_its_next_page_while_the_last_is_written(tmp_path, monkeypatch):
    real_pwrite, release = os.pwrite, threading.Event()

    def slow_pwrite(fd, data, offset):
        assert release.wait(timeout=30)
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(pages.os, "pwrite", slow_pwrite)
    allocator, path = two_pages(tmp_path)
    with allocator:
        fill(allocator, 0, 5, PAGE - 10)
        fill(allocator, 1, 6, PAGE - 10)  # page 0 handed over; its write has not returned
        assert not release.is_set() and allocator.space_left_in_page() == 10  # page 1 is being filled
        release.set()
    assert_two_pages_written(path)


def test_a_failed_page_write_is_raised_in_the_worker_and_nothing_after_it_is_written(tmp_path, monkeypatch):
    calls = []

    def full_disk(fd, data, offset):
        calls.append(offset)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(pages.os, "pwrite", full_disk)
    allocator, path = two_pages(tmp_path)
    with pytest.raises(OSError) as raised:  # at the next page, or at the exit: whichever comes first
        with allocator:
            for sample in range(4):
                fill(allocator, sample, 5, PAGE - 10)
    assert raised.value.errno == errno.ENOSPC
    assert calls == [PAGE]  # the pages after the failed one are not written
    assert not allocator.page_writer.thread.is_alive()
