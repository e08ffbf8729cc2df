"""The ``bad_samples: {policy: skip}`` policy: which failures a write may skip, their record, the limit.

How a sample is left out (the choice, and why): ffcv's ``DatasetWriter`` fixes ``num_samples`` and
every sample's metadata row before the first sample is read, so a sample found bad while writing
already has a row. Checking every sample in a pre-pass before the write would read (and decode)
every image twice. Instead the writer's worker (``betonbuild.write.beton_writer``) catches the
sample's failure, takes its allocation records back off the allocator's list (ffcv's own retry does
the same), zeroes its metadata row, reports a ``SkippedSample`` and moves on; its few bytes already
copied into the page stay there, referenced by nothing. Then ``finalize``, which copies the metadata
block and the allocation table into the file anyway, leaves the skipped rows out while it copies
(``kept_blocks``), renumbers the allocations' sample ids (``renumber``) and lowers ``num_samples`` in
the header. No second pass over the data and no rewrite of the file: the cost is what the bad
samples themselves cost. The data region stays where ffcv put it (a reader that computes its start
from the shorter metadata may see one more zero page before it, which nothing references). A
write with nothing skipped, and every write under ``fail``, takes ffcv's path unchanged, byte for byte.

Memory: one record per skipped sample, at most ``limit + 1`` of them (the write stops beyond), and
the compaction streams the allocation table in blocks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from betonbuild.errors import SampleError

SHOWN_IN_MESSAGE = 10  # bad samples an error message lists (skipped.json holds them all)
REPORTED = 20  # bad samples a verification report lists (with their messages)


@dataclass(frozen=True)
class SkippedSample:
    """One sample left out: its position among the write's rows, its source index, what failed."""

    position: int
    index: int
    field: str | None
    message: str
    location: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class TooManyBadSamples(SampleError):
    """More samples were bad than ``bad_samples.max`` allows (or every one was): the write stops."""

    def __init__(self, dataset: str, skipped: list[SkippedSample], limit: int, total: int, stage: str, of: int):
        self.skipped = sorted(skipped, key=lambda s: s.position)
        first = self.skipped[0]
        if len(skipped) >= total:
            why = f"all {total} samples of the {stage} write are bad; no .beton is written"
        else:
            why = (
                f"{len(skipped)} bad samples in the {stage} write, more than bad_samples.max allows "
                f"({limit} of {of}); no .beton is written"
            )
        listed = "; ".join(_line(s) for s in self.skipped[:SHOWN_IN_MESSAGE])
        more = len(skipped) - SHOWN_IN_MESSAGE
        why += f": {listed}" + (f"; and {more} more" if more > 0 else "")
        super().__init__(
            dataset,
            first.field,
            first.index,
            why,
            "repair or remove those samples, or raise bad_samples.max if that many bad samples are expected",
        )

    def __reduce__(self):  # raised in the parent only; never pickled with SampleError's arguments
        raise TypeError("TooManyBadSamples is not sent between processes")


def _line(s: SkippedSample) -> str:
    where = f" ({s.location})" if s.location else ""
    field = f" field '{s.field}'" if s.field else ""
    return f"index {s.index}{field}{where}: {s.message}"


def skipped_from_error(error: SampleError, position: int, index: int, location: str | None) -> SkippedSample:
    return SkippedSample(
        position=int(position),
        index=int(error.index if error.index is not None else index),
        field=error.field,
        message=error.why,
        location=error.location or location,
    )


def sample_location(source, index: int) -> str | None:
    """Where the source keeps sample ``index`` (a file, a shard member), when it can tell cheaply."""
    locate = getattr(source, "sample_location", None)
    try:
        return locate(int(index)) if locate is not None else None
    except Exception:  # noqa: BLE001 - a location is a courtesy; the record stands without it
        return None


@dataclass(frozen=True)
class SkipLimit:
    """A write's bound: at most ``limit`` bad samples (``bad_samples.max`` of the ``of`` samples the
    limit was taken from), and never all of its own ``total``."""

    dataset: str
    limit: int
    total: int
    stage: str
    of: int

    def check(self, skipped: list[SkippedSample]) -> None:
        if skipped and (len(skipped) > self.limit or len(skipped) >= self.total):
            raise TooManyBadSamples(self.dataset, skipped, self.limit, self.total, self.stage, self.of)


def kept_blocks(num_samples: int, skipped_positions: np.ndarray) -> Iterator[tuple[int, int]]:
    """The [start, stop) runs of rows that are kept, in order, around the sorted skipped positions."""
    start = 0
    for position in skipped_positions.tolist():
        if position > start:
            yield start, position
        start = position + 1
    if start < num_samples:
        yield start, num_samples


def renumber(table: np.ndarray, skipped_positions: np.ndarray) -> np.ndarray:
    """Allocation rows with each sample id lowered by the skipped samples before it; rows of a
    skipped sample (the worker took them back: none are expected) are dropped."""
    ids = table["sample_id"]
    before = np.searchsorted(skipped_positions, ids, side="left")
    hit = before < len(skipped_positions)
    hit[hit] = skipped_positions[before[hit]] == ids[hit]
    table = table[~hit] if hit.any() else table.copy()
    table["sample_id"] -= before[~hit].astype(table.dtype["sample_id"])
    return table


def summary(skipped: list[SkippedSample], limit: int, total: int) -> dict[str, Any]:
    """What a report says about the skipped samples: how many, the limit, why (by field), the first few."""
    reasons = Counter(s.field or "(whole sample)" for s in skipped)
    return {
        "count": len(skipped),
        "limit": limit,
        "of": total,
        "by_field": dict(sorted(reasons.items())),
        "samples": [s.to_dict() for s in skipped[:REPORTED]],
    }


def skipped_positions(record: dict[str, Any]) -> np.ndarray:
    """The positions (among the rows written) a write record says were skipped, sorted."""
    samples = (record.get("skipped") or {}).get("samples") or []
    return np.array(sorted(int(s["position"]) for s in samples), dtype=np.int64)


def from_record(record: dict[str, Any]) -> list[SkippedSample]:
    """The skipped samples a write record lists (``{"count", "limit", "samples"}`` under "skipped")."""
    return [SkippedSample(**s) for s in (record.get("skipped") or {}).get("samples") or []]


def record_entry(skipped: list[SkippedSample], limit: int) -> dict[str, Any]:
    """A write record's "skipped": every skipped sample (at most the limit), in position order."""
    return {"count": len(skipped), "limit": limit, "samples": [s.to_dict() for s in skipped]}
