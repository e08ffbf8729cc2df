"""The report's histograms counted block by block equal numpy's whole-array histogram."""

from __future__ import annotations

import numpy as np
import pytest

import betonbuild.report as report


@pytest.mark.parametrize(
    "values",
    [
        np.random.default_rng(0).integers(0, 1000, 10_000),  # labels
        np.random.default_rng(1).normal(size=7_001).astype(np.float32),
        np.full(500, 3, dtype=np.int64),  # one value: numpy widens the range by 0.5 each side
        np.array([], dtype=np.int64),
    ],
)
def test_block_histogram_equals_numpys(values, monkeypatch):
    monkeypatch.setattr(report, "HISTOGRAM_BLOCK", 1000)  # several blocks, the last one partial
    counts, edges = report.block_histogram(values, 50)
    expected_counts, expected_edges = np.histogram(values, 50)
    assert counts.tolist() == expected_counts.tolist()
    assert np.array_equal(edges, expected_edges)


def test_block_histogram_reads_a_memory_mapped_column_in_place(tmp_path):
    path = tmp_path / "labels.npy"
    np.save(path, np.arange(5000, dtype=np.int64) % 7)
    mapped = np.load(path, mmap_mode="r")
    counts, _ = report.block_histogram(mapped, 7)
    assert counts.tolist() == [715, 715, 714, 714, 714, 714, 714]
