"""Pages of a read-only file mapping dropped from the process's RSS (betonbuild.mapped_pages): what
keeps a pass over a 100M-row file or source from holding the whole file resident."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from betonbuild.mapped_pages import release_mapped


def mapped_file_mib() -> float:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("RssFile:")) / 1024


def test_a_column_read_end_to_end_is_unmapped_and_still_reads(tmp_path: Path):
    column = np.arange(16 << 20, dtype=np.int64)  # 128 MiB
    np.save(tmp_path / "x.npy", column)
    mapped = np.load(tmp_path / "x.npy", mmap_mode="r")
    before = mapped_file_mib()
    assert int(mapped[::512].sum()) == int(column[::512].sum())  # one read per 4 KiB page
    read = mapped_file_mib()
    release_mapped(mapped[10:], np.zeros(3))  # a view finds its mapping; an array without one is skipped
    assert read - before > 100 and mapped_file_mib() < before + 16
    assert int(mapped[-1]) == int(column[-1])  # mapped again on the next read


def test_an_arrays_source_read_row_by_row_keeps_few_pages_mapped(tmp_path: Path, monkeypatch):
    """A write's worker reads every row once, across the whole column: the arrays source unmaps
    its columns' pages every RELEASE_EVERY_READS rows, so they do not add up in the worker's RSS."""
    from betonbuild.config.load import load_config  # why: only this test opens a source
    from betonbuild.sources import arrays, open_source

    np.save(tmp_path / "x.npy", np.ones((8 << 20, 4), dtype=np.float32))  # 128 MiB
    entry = {"source": {"kind": "arrays", "columns": {"x": str(tmp_path / "x.npy")}}}
    entry["fields"] = {"x": {"type": "ndarray", "dtype": "float32", "shape": [4]}}
    source = open_source(load_config({"datasets": {"a": entry}}).datasets["a"])
    monkeypatch.setattr(arrays, "RELEASE_EVERY_READS", 1024)
    before = mapped_file_mib()
    assert all(float(source[row][0][0]) == 1.0 for row in range(0, len(source), 256))  # one row a 4 KiB page
    assert mapped_file_mib() < before + 16  # 128 MiB touched, at most 1024 pages (4 MiB) left mapped
