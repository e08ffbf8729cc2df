"""The typed dataset spec: what a validated config entry says (``betonbuild.config.load`` makes it).

Also the two decisions every stage derives from a spec alone: the final sample order
(``resolve_indices``) and the smoke samples' positions in it (``smoke_positions``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any

import numpy as np

from betonbuild.errors import ConfigError

MAX_FIELD_NAME_BYTES = 16  # the descriptor's name slot; ffcv truncates longer names silently
MIN_PAGE_SIZE = 1 << 21
MAX_PAGE_SIZE = 1 << 32  # exclusive: the header stores page_size as <u4
# The smoke stage's pre-flight inspects this many of a dataset's largest samples (where sizes are cheap).
LARGEST_SAMPLES = 8
RANGE_PATTERN = re.compile(r"^\s*(\d*)\s*:\s*(\d*)\s*(?::\s*(\d+)\s*)?$")


@dataclass(frozen=True)
class FieldSpec:
    """One configured field; what its ``type`` means is ``betonbuild.fields.field_kind(spec)``."""

    name: str
    type: str
    options: dict[str, Any] = dc_field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, **self.options}


@dataclass(frozen=True)
class WriterSpec:
    num_workers: int
    page_size: int
    chunksize: int
    indices: list[int] | str | None
    shuffle: bool
    seed: int


@dataclass(frozen=True)
class PartitionSpec:
    """How the file is split into part jobs: ``count`` parts, or parts of ``samples`` samples."""

    count: int | None
    samples: int | None
    keep_parts: bool

    @property
    def partitioned(self) -> bool:
        """Written as parts and merged (else one direct write)."""
        return self.samples is not None or (self.count or 1) > 1


@dataclass(frozen=True)
class BadSamplesSpec:
    """``bad_samples``: fail at the first bad sample, or skip up to ``max`` of them (a count, or a
    fraction of the samples when below 1)."""

    policy: str = "fail"
    max: float = 0.001

    @property
    def skip(self) -> bool:
        return self.policy == "skip"

    def limit(self, total: int) -> int:
        """How many of ``total`` samples may be skipped (0 under ``fail``)."""
        if not self.skip:
            return 0
        return int(self.max) if self.max >= 1 else math.floor(self.max * total + 1e-9)

    def smoke_limit(self, smoke: int, total: int) -> int:
        """The smoke stage's own limit: at most the full write's share of its ``smoke`` samples,
        rounded up, and never all of them (a source bad throughout must not pass the gate)."""
        allowed = self.limit(total)
        if not allowed:
            return 0
        return min(smoke - 1, math.ceil(smoke * allowed / max(total, 1)))

    def to_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "max": self.max}


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    source: dict[str, Any]
    fields: tuple[FieldSpec, ...]
    sample_keys: tuple[Any, ...] | None
    writer: WriterSpec
    smoke_samples: int
    verify: dict[str, Any]
    partitions: PartitionSpec = PartitionSpec(None, None, True)
    bad_samples: BadSamplesSpec = BadSamplesSpec()

    @property
    def field_names(self) -> list[str]:
        return [f.name for f in self.fields]

    def to_dict(self) -> dict[str, Any]:
        """The canonical, JSON-able form: what a rule's params hold, so a change reruns the rule."""
        return {
            "name": self.name,
            "source": self.source,
            "fields": {f.name: f.to_dict() for f in self.fields},
            "sample_keys": list(self.sample_keys) if self.sample_keys is not None else None,
            "writer": {
                "num_workers": self.writer.num_workers,
                "page_size": self.writer.page_size,
                "chunksize": self.writer.chunksize,
                "indices": self.writer.indices,
                "shuffle": self.writer.shuffle,
                "seed": self.writer.seed,
            },
            "partitions": self.partitions.count,
            "samples_per_partition": self.partitions.samples,
            "keep_parts": self.partitions.keep_parts,
            "smoke": {"samples": self.smoke_samples},
            "verify": self.verify,
            # only when not the default: a `fail` dataset's rule params (and so its jobs) stay as they were
            **({"bad_samples": self.bad_samples.to_dict()} if self.bad_samples.skip else {}),
        }


@dataclass(frozen=True)
class Config:
    results: str
    datasets: dict[str, DatasetSpec]


# The sample order in memory: one int64 per sample (resolve_indices builds it in place, no copy).
ORDER_BYTES_PER_SAMPLE = 8


def resolve_indices(writer: WriterSpec, length: int, dataset: str) -> np.ndarray:
    """The dataset's final sample order: ``indices`` (or all), then the SEEDED shuffle.

    Peaks at the order itself (8 bytes a sample): a range is bounds-checked arithmetically, and the
    shuffle is in place (``Generator.shuffle`` of a fresh array is what ``permutation`` does after
    copying it, so the order is the same)."""
    where = f"datasets.{dataset}.writer.indices"
    if writer.indices is None:
        order = np.arange(length, dtype=np.int64)
    elif isinstance(writer.indices, str):
        selected = range(*_range_bounds(writer.indices, length))
        if selected and selected[-1] >= length:
            first_outside = selected[max(0, -(-(length - selected.start) // selected.step))]
            raise ConfigError(where, f"index {first_outside} is outside the source's {length} samples")
        order = np.arange(selected.start, selected.stop, selected.step, dtype=np.int64)
    else:
        order = np.array(writer.indices, dtype=np.int64)
        out_of_range = order[(order < 0) | (order >= length)]
        if out_of_range.size:
            raise ConfigError(where, f"index {int(out_of_range[0])} is outside the source's {length} samples")
    if order.size == 0:
        raise ConfigError(where, "selects no sample; a .beton needs at least one")
    if writer.shuffle:
        np.random.default_rng(writer.seed).shuffle(order)
    return order


def count_indices(writer: WriterSpec, length: int) -> int:
    """How many samples ``resolve_indices`` selects from ``length``, without building the order: for
    estimates before the source is read. A range's stop beyond ``length`` counts to the end (where
    ``resolve_indices`` refuses it), so that an estimate never fails."""
    if writer.indices is None:
        return length
    if isinstance(writer.indices, str):
        start, stop, step = _range_bounds(writer.indices, length)
        return len(range(start, min(stop, length), step))
    return len(writer.indices)


def _range_bounds(indices: str, length: int) -> tuple[int, int, int]:
    """(start, stop, step) of a validated ``"start:stop[:step]"``; an empty stop is ``length``."""
    start, stop, step = RANGE_PATTERN.match(indices).groups()
    return int(start or 0), int(stop) if stop else length, int(step or 1)


def smoke_positions(num_samples: int, k: int, seed: int) -> np.ndarray:
    """Positions (into the final order) of the smoke samples: the first k, then k seeded-random others."""
    first = np.arange(min(k, num_samples))
    rest = num_samples - len(first)
    # the positions after the first, drawn as offsets: Generator.choice of an int draws exactly what it
    # draws from np.arange(len(first), num_samples), without that array (800 MB at 100M samples)
    picked = len(first) + np.random.default_rng(seed).choice(rest, size=min(k, rest), replace=False)
    return np.concatenate([first, np.sort(picked)]).astype(np.int64)
