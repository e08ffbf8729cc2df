"""The samples of a write cut into work items, held as numpy arrays: no Python object per sample.

ffcv's ``DatasetWriter.from_indexed_dataset`` turns the order into ``list(enumerate(indices))`` and
puts every chunk on a queue up front: about 130 bytes per sample in the parent, for the whole
write. A ``WorkPlan`` is the order itself (even chunks of ``chunksize`` consecutive positions) or,
for sources read in groups (one item per webdataset shard), two int64 columns and the items'
bounds. The writer's workers inherit it through ``fork`` and take items by number from a shared
counter (``betonbuild.write.beton_writer``), so the work queue holds nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


class WorkPlan:
    """Item k is a (destinations, source indices) pair of equal lengths; items cover every
    destination 0..num_samples-1 once."""

    def __init__(self, sources: np.ndarray, bounds: np.ndarray, destinations: np.ndarray | None = None):
        self.sources = sources  # the source index of each entry, item after item
        self.bounds = bounds  # item k is entries [bounds[k], bounds[k + 1])
        self.destinations = destinations  # None: entry i is sample i (the order's own positions)

    @classmethod
    def even(cls, order: np.ndarray, chunksize: int) -> WorkPlan:
        """Chunks of ``chunksize`` consecutive samples of the order, as ffcv's writer cuts them."""
        if chunksize < 1:
            raise ValueError(f"chunksize must be at least 1, got {chunksize}")
        n = len(order)
        bounds = np.append(np.arange(0, n, chunksize, dtype=np.int64), np.int64(n))
        return cls(np.asarray(order), bounds)

    @classmethod
    def by_group(cls, order: np.ndarray, groups: np.ndarray) -> WorkPlan:
        """One item per distinct value of ``groups`` (the group of each sample of ``order``, e.g. its
        webdataset shard), items in the order their groups first appear, each item's samples in the
        order's order: from arrays (a 10,000-shard source's plan is 16 bytes a sample), no Python
        object per sample."""
        order, groups = np.asarray(order, dtype=np.int64), np.asarray(groups)
        distinct, first, counts = np.unique(groups, return_index=True, return_counts=True)
        by_first = np.argsort(first, kind="stable")
        rank = np.empty(len(distinct), dtype=np.int64)
        rank[by_first] = np.arange(len(distinct), dtype=np.int64)
        destinations = np.argsort(rank[np.searchsorted(distinct, groups)], kind="stable").astype(np.int64)
        bounds = np.concatenate([[0], np.cumsum(counts[by_first])]).astype(np.int64)
        return cls(np.ascontiguousarray(order[destinations]), bounds, destinations)

    @classmethod
    def groups(cls, items: WorkPlan | Iterable[Sequence[tuple[int, int]] | np.ndarray]) -> WorkPlan:
        """One item per group of (destination, source index) pairs, e.g. a webdataset shard's samples;
        a plan a source built itself (``by_group``) as it is."""
        if isinstance(items, WorkPlan):
            return items
        pairs = [np.asarray(item, dtype=np.int64).reshape(-1, 2) for item in items]
        sizes = np.array([len(p) for p in pairs], dtype=np.int64)
        bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        table = np.concatenate(pairs) if pairs else np.empty((0, 2), dtype=np.int64)
        del pairs
        return cls(np.ascontiguousarray(table[:, 1]), bounds, np.ascontiguousarray(table[:, 0]))

    @property
    def num_items(self) -> int:
        return len(self.bounds) - 1

    @property
    def num_samples(self) -> int:
        return int(self.bounds[-1])

    def item(self, k: int) -> tuple[Sequence[int], np.ndarray]:
        """Item k's destinations (a range or an int64 array) and source indices (np.int64 values,
        as ffcv's writer passes them to ``__getitem__``)."""
        start, stop = int(self.bounds[k]), int(self.bounds[k + 1])
        destinations = range(start, stop) if self.destinations is None else self.destinations[start:stop]
        return destinations, self.sources[start:stop]
