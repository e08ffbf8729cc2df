"""A dataset its smoke file already holds whole: the full write copies that file, and its verification
is the gate's.

``smoke_positions`` takes the first k samples of the final order and k more, so the smoke file of a
dataset of at most 2k samples (a one-image demo, a small table) holds exactly the full file's rows,
in the same order, and the gate has read it back in full (every sample, the ffcv.Loader batch).
Writing the same rows again with more workers and reading them back again would cost two more ffcv
imports (several seconds of a small build) and prove nothing new. So the full write copies the smoke
file (its record says so), and the full verification, after checking that the file is still
byte-for-byte the one the gate verified (sha256) and that the gate checked at least as much as the
full verification would, publishes the gate's findings as the full report. Anything else (another
order, skipped samples, an iterable, a file changed since) is written and verified as usual.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from betonbuild.atomic import atomic_path
from betonbuild.config.spec import DatasetSpec
from betonbuild.sources import sha256_file, source_class
from betonbuild.workflow.partitions import rows_digest

COPIED_FROM = "smoke.beton"  # the full write record's "copied_from" when it is the smoke file


def _json(path: Path) -> dict[str, Any] | None:
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def smoke_record_for(spec: DatasetSpec, dataset_dir: Path, rows: np.ndarray) -> dict[str, Any] | None:
    """The smoke write's record when the smoke file holds exactly ``rows`` (the full file's), in
    order, written under ``bad_samples: fail``; else None."""
    if source_class(spec).one_pass or not (dataset_dir / COPIED_FROM).exists():
        return None
    record = _json(dataset_dir / "smoke.write.json")
    if record is None or record.get("rows_sha256") != rows_digest(rows):
        return None
    if "skipped" in record:
        return None  # under bad_samples: skip the full stage publishes skipped.json: written as usual
    return record


def copy_smoke_file(dataset_dir: Path, beton_path: str, smoke_record: dict[str, Any]) -> dict[str, Any]:
    """The smoke file copied to ``beton_path`` (atomically), and the full write's record of it."""
    with atomic_path(beton_path) as tmp:
        shutil.copyfile(dataset_dir / COPIED_FROM, tmp)
    return {**smoke_record, "stage": "full", "copied_from": COPIED_FROM}


def gate_report_for(
    spec: DatasetSpec, dataset_dir: Path, beton_path: str, record: dict[str, Any], num_samples: int
) -> dict[str, Any] | None:
    """The gate's report, restated for the full file, when that file is the smoke file the gate
    verified and the gate checked at least what the full verification would; else None."""
    if record.get("copied_from") != COPIED_FROM:
        return None
    gate = _json(dataset_dir / "smoke.verify.json")
    if gate is None or not gate.get("ok"):
        return None
    loader_batch = int(gate.get("config", {}).get("verify", {}).get("loader_batch", 0))
    if min(loader_batch, num_samples) < min(int(spec.verify["loader_batch"]), num_samples):
        return None  # the full verification would put more samples through ffcv.Loader
    digest = sha256_file(beton_path)
    if digest != gate["file"]["sha256"]:
        return None  # changed since the gate read it: verified as any other file
    return {
        **gate,
        "file": {**gate["file"], "path": str(beton_path), "sha256": digest},
        "config": spec.to_dict(),
        "verified_as": {
            "file": str(dataset_dir / COPIED_FROM),
            "report": str(dataset_dir / "smoke.verify.json"),
            "detail": "byte-identical (sha256) to the smoke file, which the gate verified in full",
        },
    }
