"""A column of a memory-mapped table read in key order, in bounded windows, without sorting it whole.

ffcv's writer appends each worker's allocations in the order that worker made them, so a file's
allocation table is a few runs (one per worker; a merge of one-worker parts is one run) over which
both the pointer and the sample id never decrease. A k-way merge of those runs, cut into windows of
about ``WINDOW`` rows, gives the rows in key order with a few MiB of temporaries at any size, where
a whole-table argsort held 8 bytes an allocation per sorted column (at 100M allocations, the
structural checks peaked at ~6 GB). A table of more than ``MAX_RUNS`` runs (no file a writer
finished, but a hostile one) returns None from ``SortedRuns.of``: its caller sorts it whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from betonbuild.mapped_pages import release_mapped

MAX_RUNS = 64  # more runs than this: the caller sorts the table whole (a hostile file, never a writer's)
WINDOW = 1 << 18  # rows of one window (and of one block of a streaming pass)
RELEASE_EVERY = 4  # windows / blocks between drops of the mapped pages read (mapped pages count in the RSS)


def blocks(n: int, release: tuple[np.ndarray, ...] = ()) -> Iterator[tuple[int, int]]:
    """[lo, hi) blocks of ``WINDOW`` rows covering ``range(n)``; the mapped pages under ``release``
    dropped every few blocks (a pass over a 100M-row table would otherwise hold it all resident)."""
    for count, lo in enumerate(range(0, n, WINDOW)):
        yield lo, min(n, lo + WINDOW)
        release_every(release, count)


def release_every(arrays: tuple[np.ndarray, ...], count: int) -> None:
    """Drops the mapped pages under ``arrays`` once every ``RELEASE_EVERY`` calls (``count`` is the call's number)."""
    if count % RELEASE_EVERY == RELEASE_EVERY - 1:
        release_mapped(*arrays)


@dataclass(frozen=True)
class SortedRuns:
    """The row ranges [start, stop) of ``key`` over which it never decreases, in row order."""

    key: np.ndarray
    starts: np.ndarray
    stops: np.ndarray

    @classmethod
    def of(cls, key: np.ndarray, max_runs: int | None = None) -> SortedRuns | None:
        """The runs of ``key``, found in one streaming pass; None when there are more than ``max_runs``
        (default ``MAX_RUNS``)."""
        n, max_runs = len(key), MAX_RUNS if max_runs is None else max_runs
        descents: list[np.ndarray] = []
        found = 0
        for lo, hi in blocks(max(n - 1, 0), release=(key,)):
            down = np.flatnonzero(key[lo + 1 : hi + 1] < key[lo:hi])
            found += len(down)
            if found + 1 > max_runs:
                return None
            descents.append(down + (lo + 1))
        cuts = np.concatenate([np.zeros(1, np.int64), *descents, np.full(1, n, np.int64)]).astype(np.int64)
        return cls(key, cuts[:-1], cuts[1:])

    def windows(self, limit: int | None = None) -> Iterator[np.ndarray]:
        """Row indices of ``key`` window by window, in key order (equal keys in row order): every row
        once, every key value in one window, windows in increasing key order; about ``limit`` rows
        each (more only where one key value repeats more often than that, in a hostile file)."""
        cursors, stops, limit = self.starts.copy(), self.stops, limit or WINDOW
        count = 0
        while True:
            active = np.flatnonzero(cursors < stops)
            if not len(active):
                return
            per = max(1, limit // len(active))
            bound = self._bound(cursors, active, per)
            taken = [self._taken(r, int(cursors[r]), per, bound, side="left") for r in active]
            if not sum(len(t) for t in taken):  # the smallest key repeats more than `per` times: take it whole
                smallest = min(self.key[cursors[r]] for r in active)
                taken = [self._taken(r, int(cursors[r]), None, smallest, side="right") for r in active]
            for r, rows in zip(active, taken):
                cursors[r] += len(rows)
            rows = np.concatenate(taken)
            yield rows[np.argsort(self.key[rows], kind="stable")]
            release_every((self.key,), count)
            count += 1

    def _bound(self, cursors: np.ndarray, active: np.ndarray, per: int):
        """The smallest key not taken by some run's next ``per`` rows: every key below it can be taken now
        (None: every active run ends within ``per`` rows, take all of them)."""
        ahead = [self.key[cursors[r] + per] for r in active if cursors[r] + per < self.stops[r]]
        return min(ahead) if ahead else None

    def _taken(self, run: int, cursor: int, per: int | None, bound, side: str) -> np.ndarray:
        """Rows of run ``run`` from ``cursor`` whose key is below ``bound`` (``side="right"``: at most it)."""
        stop = int(self.stops[run])
        if bound is None:
            return np.arange(cursor, stop, dtype=np.int64)
        if per is not None:
            chunk = np.asarray(self.key[cursor : min(stop, cursor + per)])
            return np.arange(cursor, cursor + int(np.searchsorted(chunk, bound, side=side)), dtype=np.int64)
        lo, hi = cursor, stop  # first row past the bound, by bisection on the mapped column (no copy of it)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.key[mid] <= bound if side == "right" else self.key[mid] < bound:
                lo = mid + 1
            else:
                hi = mid
        return np.arange(cursor, lo, dtype=np.int64)


def key_order_windows(key: np.ndarray) -> Iterator[np.ndarray]:
    """``SortedRuns.windows`` of ``key``; a table of more runs than ``MAX_RUNS`` as one window, sorted
    whole (a stable argsort, 8 bytes a row: only a hostile file has that many runs)."""
    runs = SortedRuns.of(key)
    if runs is None:
        yield np.argsort(key, kind="stable")
    else:
        yield from runs.windows()
