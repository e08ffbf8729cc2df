"""Unit tests of betonbuild.beton.runs: a column of sorted runs read in key order, window by window,
gives exactly the stable argsort of the whole column, with every key value in one window."""

from __future__ import annotations

import numpy as np
import pytest

from betonbuild.beton.runs import SortedRuns, key_order_windows


def runs_of(rng, lengths, high):
    """A column of one sorted run per length, values drawn from [0, high) (so with ties)."""
    return np.concatenate([np.sort(rng.integers(0, high, n)).astype(np.uint64) for n in lengths])


@pytest.mark.parametrize("lengths", [[1000], [400, 600], [5, 900, 1, 300], [1] * 40, [0, 50, 0]])
@pytest.mark.parametrize("high", [3, 100, 1 << 60])
@pytest.mark.parametrize("limit", [1, 7, 64, 10_000])
def test_windows_are_the_stable_argsort_cut_at_key_changes(lengths, high, limit):
    key = runs_of(np.random.default_rng(len(lengths) * high + limit), lengths, high)
    runs = SortedRuns.of(key)
    assert runs is not None and len(runs.starts) <= len(lengths)
    windows = list(runs.windows(limit))
    rows = np.concatenate(windows) if windows else np.zeros(0, np.int64)
    assert np.array_equal(rows, np.argsort(key, kind="stable"))
    for before, after in zip(windows, windows[1:]):
        assert key[before[-1]] < key[after[0]]  # no key value is split between two windows
    ties = max(np.unique(key, return_counts=True)[1], default=0)
    assert all(len(w) <= max(limit, ties) + len(lengths) for w in windows)


def test_a_column_of_more_runs_than_allowed_is_sorted_whole():
    key = np.arange(200, dtype=np.uint64)[::-1].copy()  # 200 runs of one row
    assert SortedRuns.of(key, max_runs=64) is None
    windows = list(key_order_windows(key))
    assert len(windows) == 1 and np.array_equal(windows[0], np.argsort(key, kind="stable"))


def test_a_memory_mapped_column_is_read_without_a_copy_of_it(tmp_path):
    table = np.lib.format.open_memmap(tmp_path / "t.npy", mode="w+", dtype=[("a", "<u8"), ("b", "<u8")], shape=(5000,))
    table["a"] = np.r_[np.arange(3000), np.arange(2000)]
    table.flush()
    column = np.load(tmp_path / "t.npy", mmap_mode="r")["a"]
    runs = SortedRuns.of(column)
    assert list(runs.starts) == [0, 3000] and list(runs.stops) == [3000, 5000]
    rows = np.concatenate(list(runs.windows(100)))
    assert np.array_equal(column[rows], np.sort(np.asarray(column), kind="stable"))
