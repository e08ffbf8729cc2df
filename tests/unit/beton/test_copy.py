"""Unit tests of betonbuild.beton.copy: byte ranges copied exactly by either method, a refused
copy_file_range falls back once, a source that ends early is an error naming it."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from betonbuild.beton import copy as copy_module
from betonbuild.beton.copy import BUFFER_SIZE, Copier, filesystem_type, pwrite_all
from betonbuild.errors import MergeError

DATA = bytes(range(256)) * (3 * BUFFER_SIZE // 256 + 7)  # more than one buffer, not a whole number of them


def test_filesystem_type():
    assert filesystem_type("/proc") == "proc"
    assert filesystem_type("/no/such/path") is None


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "source.bin"
    path.write_bytes(DATA)
    return path


def copy_range(copier: Copier, source: Path, target: Path, start: int, length: int, at: int) -> bytes:
    fd = os.open(target, os.O_WRONLY | os.O_CREAT, 0o666)
    try:
        copier.copy("part 0 (source.bin)", str(source), start, length, fd, at)
    finally:
        os.close(fd)
    return target.read_bytes()


@pytest.mark.parametrize("method", ["auto", "copy_file_range", "buffered"])
def test_each_method_copies_the_range_to_its_offset(source: Path, tmp_path: Path, method):
    copier = Copier(method, tmp_path)
    start, length, at = 1000, len(DATA) - 2000, 4096
    written = copy_range(copier, source, tmp_path / "out.bin", start, length, at)
    assert written == bytes(at) + DATA[start : start + length]
    assert copier.bytes_copied == length
    assert copier.method_used == ("buffered" if method == "buffered" else "copy_file_range")
    assert copier.filesystem == filesystem_type(tmp_path)


def test_a_refused_copy_file_range_falls_back_to_the_buffered_loop_once(source, tmp_path, monkeypatch):
    calls = []

    def refuse(*args):
        calls.append(args)
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(copy_module.os, "copy_file_range", refuse)
    copier = Copier("auto", tmp_path)
    assert copy_range(copier, source, tmp_path / "a.bin", 0, len(DATA), 0) == DATA
    assert copy_range(copier, source, tmp_path / "b.bin", 0, len(DATA), 0) == DATA
    assert len(calls) == 1 and copier.method_used == "buffered"
    assert copier.fallback_reason == "copy_file_range: EXDEV" and copier.buffered_bytes == 2 * len(DATA)
    with pytest.raises(OSError):
        copy_range(Copier("copy_file_range", tmp_path), source, tmp_path / "c.bin", 0, len(DATA), 0)


def test_a_source_shorter_than_its_range_is_an_error_naming_it(source, tmp_path):
    with pytest.raises(MergeError, match=r"part 0 \(source.bin\): the file ended at byte"):
        copy_range(Copier("buffered", tmp_path), source, tmp_path / "out.bin", 0, len(DATA) + 10, 0)
    with pytest.raises(MergeError, match=r"part 0 \(source.bin\): copy_file_range stopped at byte"):
        copy_range(Copier("copy_file_range", tmp_path), source, tmp_path / "out.bin", 0, len(DATA) + 10, 0)


def test_pwrite_all_writes_everything_even_when_pwrite_writes_less(tmp_path, monkeypatch):
    real = os.pwrite
    monkeypatch.setattr(copy_module.os, "pwrite", lambda fd, data, offset: real(fd, data[:1000], offset))
    fd = os.open(tmp_path / "out.bin", os.O_WRONLY | os.O_CREAT, 0o666)
    try:
        pwrite_all(fd, DATA[:10_000], 5)
    finally:
        os.close(fd)
    assert (tmp_path / "out.bin").read_bytes() == bytes(5) + DATA[:10_000]
