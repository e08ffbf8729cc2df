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


def test_the_content_digests_blocks_submitted_at_once_keep_few_pages_mapped(tmp_path: Path, monkeypatch):
    """The verification submits every digest block to its pool before anything else runs there
    (``verify.report._submit_leaves``): each ``BLOCKS_IN_FLIGHT``-th block unmaps the file's pages,
    else the whole file stayed mapped until the comparison's first release (4 GB at 100M rows)."""
    from concurrent.futures import ThreadPoolExecutor  # why: only these tests use them

    from betonbuild.beton import digest
    from betonbuild.beton.format import BetonFile
    from betonbuild.config.load import load_config
    from betonbuild.sources import open_source
    from betonbuild.write.writer import write_beton

    rows = 400_000
    np.save(tmp_path / "x.npy", np.ones((rows, 4), dtype=np.float32))
    np.save(tmp_path / "y.npy", np.arange(rows, dtype=np.int64))
    entry = {"source": {"kind": "arrays", "columns": {"x": str(tmp_path / "x.npy"), "y": str(tmp_path / "y.npy")}}}
    entry["fields"] = {"x": {"type": "ndarray", "dtype": "float32", "shape": [4]}, "y": {"type": "int"}}
    spec = load_config({"datasets": {"a": entry}}).datasets["a"]
    with open("/dev/null", "w") as quiet:
        write_beton(spec, open_source(spec), np.arange(rows), tmp_path / "a.beton", 2, log=quiet, measure_images=False)
    monkeypatch.setattr(digest, "BLOCKS_IN_FLIGHT", 8)
    mapped = {}
    for task in (lambda beton, k, a, b: digest.leaf(beton, a, b), digest.leaf_releasing):
        beton = BetonFile(str(tmp_path / "a.beton"))  # its own mapping, nothing of it resident yet
        before = mapped_file_mib()
        with ThreadPoolExecutor(2) as pool:
            spans = digest.blocks(0, rows)
            leaves = [f.result() for f in [pool.submit(task, beton, k, a, b) for k, (a, b) in enumerate(spans)]]
        mapped[task] = mapped_file_mib() - before
        assert digest.range_from_leaves(leaves) == digest.range_digest(beton, 0, rows, 1)
        del beton
    plain, releasing = mapped.values()
    assert plain > 15 and releasing < plain / 2, mapped  # the file's ~24 MiB of rows and tables, or a few blocks' pages
