"""The stages' side of ``bad_samples: {policy: skip}``: each write's limit, ``results/{ds}/skipped.json``,
the first few skipped samples kept for ``betonbuild repro``, and the parts' skips combined by the merge.

The write record (``{ds}.write.json``, ``parts/{i}.write.json``, ``smoke.write.json``) is what
verification reads: its ``skipped`` lists every sample left out by its position among the write's
rows. ``skipped.json`` is the same list for people: source index, field, message and the file or
shard member, for the dataset's whole file.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

from betonbuild.atomic import write_json
from betonbuild.config.spec import DatasetSpec
from betonbuild.errors import SampleError
from betonbuild.write.failure import save_failure
from betonbuild.write.skips import SkipLimit, SkippedSample, from_record, record_entry, summary

SKIPPED_FILE = "skipped.json"
REPRO_DIR = "skipped"  # results/{ds}/skipped/<source index>/: a replayable record per kept sample
KEPT_FOR_REPRO = 3


def write_limit(spec: DatasetSpec, rows: int, total: int, stage: str) -> SkipLimit | None:
    """The write's limit: ``bad_samples.max`` of the dataset's ``total`` samples (a part's too: the
    merge checks the parts' sum), the smoke stage's share of it; None under ``fail``. ``total`` None
    (an iterable source of unknown length): the smoke stage's own ``rows`` stand for it."""
    policy = spec.bad_samples
    if not policy.skip:
        return None
    if total is None:  # an iterable of unknown length (its max is then a count): the smoke samples alone
        total = rows
    if stage == "smoke":
        return SkipLimit(spec.name, policy.smoke_limit(rows, total), rows, stage, rows)
    return SkipLimit(spec.name, policy.limit(total), rows, stage, total)


def keep_for_repro(
    spec: DatasetSpec, source, dataset_dir: Path, skipped: list[SkippedSample], stage: str, rows
) -> None:
    """Saves the first few skipped samples under results/{ds}/skipped/<index>/ (replaced: the records
    of this write's rows that an earlier write left are removed first)."""
    root = dataset_dir / REPRO_DIR
    if root.is_dir():
        names = [p for p in root.iterdir() if p.name.isdigit()]
        stale = np.isin(np.array([int(p.name) for p in names], dtype=np.int64), np.asarray(rows))
        for path, old in zip(names, stale):
            if old:
                shutil.rmtree(path, ignore_errors=True)
    for sample in skipped[:KEPT_FOR_REPRO]:
        error = SampleError(spec.name, sample.field, sample.index, sample.message, location=sample.location)
        save_failure(root / str(sample.index), spec, source, error, stage)


def publish(spec: DatasetSpec, dataset_dir: Path, record: dict[str, Any], planned: int) -> None:
    """results/{ds}/skipped.json for the dataset's file (or its removal under ``fail``)."""
    path = dataset_dir / SKIPPED_FILE
    if "skipped" not in record:
        path.unlink(missing_ok=True)
        shutil.rmtree(dataset_dir / REPRO_DIR, ignore_errors=True)
        return
    skipped = from_record(record)
    repro = dataset_dir / REPRO_DIR
    write_json(
        path,
        {
            "dataset": spec.name,
            "policy": spec.bad_samples.to_dict(),
            **summary(skipped, record["skipped"]["limit"], planned),
            "written": record["num_samples"],
            "repro": [f"betonbuild repro {repro / str(s.index)}" for s in skipped if (repro / str(s.index)).is_dir()],
            "samples": [s.to_dict() for s in skipped],
        },
    )


def combined(
    spec: DatasetSpec, records: list[dict[str, Any]], planned: list[dict[str, Any]], total: int
) -> dict | None:
    """The parts' skipped samples as one record entry, positions among the whole order; raises
    TooManyBadSamples when together they exceed the dataset's limit. None under ``fail``."""
    limit = write_limit(spec, total, total, "merge")
    if limit is None:
        return None
    everything = [
        SkippedSample(**{**s.to_dict(), "position": s.position + int(entry["start"])})
        for record, entry in zip(records, planned)
        for s in from_record(record)
    ]
    limit.check(everything)
    return record_entry(everything, limit.limit)
