"""A dataset's partitions: contiguous slices of its final sample order, each with its own fingerprint.

The source manifest plans them (``plan_partitions``); each part is then one Snakemake job that
writes ``results/{ds}/parts/{i}.beton`` and the merge joins them in order. A part's fingerprint is
a digest of exactly the source content its samples are read from (the source kind's
``part_fingerprint``, and the user's adapter code), so that a change to one part's source (one
shard, one image, some rows of an array) changes that part's fingerprint alone and Snakemake
(which sees it as a rule parameter) rewrites that part alone:

- webdataset: a part is a contiguous group of whole shards; its fingerprint covers their sha256s.
- image folder: the relative path and sha256 of every image file of the part.
- arrays: the part's rows of every column, as bytes.
- python: the adapter code's digest; a factory's samples cannot be hashed without reading them all.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from betonbuild.config.spec import DatasetSpec
from betonbuild.errors import ConfigError, VerificationError
from betonbuild.sources.base import Source


def rows_digest(rows: np.ndarray) -> str:
    # hashed through the buffer: .tobytes() would copy the whole order once more
    return hashlib.sha256(np.ascontiguousarray(rows, dtype="<i8")).hexdigest()


def partition_bounds(
    spec: DatasetSpec, num_samples: int, shard_counts: list[int] | None = None
) -> list[tuple[int, int]]:
    """[(start, stop)] positions into the final order, one per part, covering it in order."""
    wanted = spec.partitions
    if shard_counts is not None:
        return _shard_groups(spec, shard_counts)
    if wanted.samples is not None:
        return [(start, min(start + wanted.samples, num_samples)) for start in range(0, num_samples, wanted.samples)]
    count = wanted.count or 1
    if count > num_samples:
        raise ConfigError(
            f"datasets.{spec.name}.partitions",
            f"{count} partitions for {num_samples} samples: a part needs at least one sample",
        )
    edges = [round(i * num_samples / count) for i in range(count + 1)]
    return list(zip(edges[:-1], edges[1:]))


def _shard_groups(spec: DatasetSpec, counts: list[int]) -> list[tuple[int, int]]:
    """Contiguous groups of whole shards, about equal in samples (a shard is never split)."""
    total = int(sum(counts))
    wanted = spec.partitions
    count = math.ceil(total / wanted.samples) if wanted.samples is not None else (wanted.count or 1)
    count = max(1, count)
    if count > len(counts):
        if wanted.samples is not None:
            count = len(counts)  # a shard holds more than samples_per_partition: one part per shard
        else:
            raise ConfigError(
                f"datasets.{spec.name}.partitions",
                f"{count} partitions for {len(counts)} shards: a part is a group of whole shards",
            )
    ends = np.cumsum(counts)
    cuts = []
    for k in range(1, count):
        # the shard boundary nearest to k/count of the samples, after the previous cut, leaving a
        # shard for every part still to come
        lo = cuts[-1] + 1 if cuts else 1
        hi = len(counts) - (count - k)
        target = k * total / count
        cuts.append(min(range(lo, hi + 1), key=lambda c: abs(int(ends[c - 1]) - target)))
    shard_edges = [0, *cuts, len(counts)]
    starts = np.concatenate([[0], ends])
    return [(int(starts[a]), int(starts[b])) for a, b in zip(shard_edges[:-1], shard_edges[1:])]


def plan_partitions(
    spec: DatasetSpec, source: Source, order: np.ndarray, inputs: dict[str, Any]
) -> list[dict[str, Any]]:
    """One entry per part: its slice of the order, the digest of its rows and of its source content
    (which includes the user's adapter code: an edit there rewrites every part)."""
    bounds = partition_bounds(spec, len(order), source.shard_counts())
    if len(bounds) == 1:
        return [whole_order(order, inputs)]

    def fingerprint(rows: np.ndarray) -> str:
        return _fingerprint(inputs, source.part_fingerprint(rows, inputs))

    # the hashes release the GIL on large buffers: array rows hash on all cores
    with ThreadPoolExecutor(min(len(bounds), os.cpu_count() or 1)) as pool:
        fingerprints = list(pool.map(fingerprint, [order[start:stop] for start, stop in bounds]))
    return [
        _entry(index, start, stop, order[start:stop], fp)
        for index, ((start, stop), fp) in enumerate(zip(bounds, fingerprints))
    ]


def plan_smoke(spec: DatasetSpec, source: Source, rows: np.ndarray, inputs: dict[str, Any]) -> dict[str, Any]:
    """The smoke stage's samples (``rows``: the smoke samples and the largest ones its pre-flight
    inspects) and a fingerprint of exactly their source content, like a part's: the smoke file and
    its gate rerun when one of those samples (or the adapter code) changes, not for any change of
    the source. A webdataset source is fingerprinted sample by sample here, since the smoke
    samples are spread over the shards."""
    return {
        "num_samples": int(len(rows)),
        "samples_sha256": rows_digest(rows),  # of the sorted source indices
        "fingerprint": _fingerprint(inputs, source.smoke_fingerprint(rows, inputs)),
    }


def _fingerprint(inputs: dict[str, Any], content: str) -> str:
    return hashlib.sha256(f"{inputs['adapters_sha256']}\0{content}".encode()).hexdigest()


def whole_order(order: np.ndarray, inputs: dict[str, Any]) -> dict[str, Any]:
    """The one part of a direct write: the whole source's fingerprint says it all."""
    return _entry(0, 0, len(order), order, inputs["sha256"])


def parts_digest(parts: list[dict[str, Any]]) -> str:
    """One digest of every part's rows and source content, in order."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(f"{part['rows_sha256']}\0{part['fingerprint']}\n".encode())
    return digest.hexdigest()


def _entry(index: int, start: int, stop: int, rows: np.ndarray, fingerprint: str) -> dict[str, Any]:
    return {
        "index": index,
        "start": int(start),
        "stop": int(stop),
        "num_samples": int(stop - start),
        "rows_sha256": rows_digest(rows),
        "fingerprint": fingerprint,
    }


def verified_parts(spec: DatasetSpec, manifest: dict[str, Any], part_reports: list[str]) -> list[dict[str, Any]]:
    """The parts' verified content, each checked to be of the partition the manifest now plans."""
    parts, removed = [], 0  # rows of the merged file move up by the samples earlier parts skipped
    for planned, path in zip(manifest["partitions"], part_reports, strict=True):
        with open(path) as fh:
            verified = json.load(fh)
        if (
            not verified.get("ok")
            or verified.get("part", {}).get("fingerprint") != planned["fingerprint"]
            or verified["part"].get("rows_sha256") != planned["rows_sha256"]
        ):
            raise VerificationError(
                f"dataset '{spec.name}': {path} is not a passing report of the part the "
                "manifest now plans; rerun snakemake"
            )
        skips = verified.get("skipped", {}).get("count", 0)
        parts.append(
            {
                "index": planned["index"],
                "start": planned["start"] - removed,
                "stop": planned["stop"] - removed - skips,
                "range_digest": verified["part"]["range_digest"],
            }
        )
        removed += skips
    return parts
