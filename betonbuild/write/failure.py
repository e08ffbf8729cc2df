"""Failures kept for replay: the failing sample, the exact field mapping and the traceback.

``save_failure`` writes ``results/{ds}/failure/``; ``replay`` (``betonbuild repro DIR``) runs that
one sample, in one process, through the same checks and the ffcv encode, so it can be debugged
with ``python -m pdb -m betonbuild repro DIR``.
"""

from __future__ import annotations

import fcntl
import json
import os
import pickle
import shutil
import tempfile
import traceback
from pathlib import Path
from typing import Any

from betonbuild.atomic import write_json
from betonbuild.config.load import spec_from_dict
from betonbuild.config.spec import DatasetSpec
from betonbuild.errors import SampleError
from betonbuild.fields import build_fields
from betonbuild.sources import open_source
from betonbuild.write.writer import CheckedDataset, measure_allocations, page_fit_error

FAILURE_FILE = "failure.json"
SAMPLE_FILE = "sample.pkl"


def save_failure(
    directory: str | os.PathLike, spec: DatasetSpec, source, error: SampleError, stage: str, started: float = 0.0
) -> Path:
    """Writes the failure record (and the raw sample when it can be read and pickled) into ``directory``.

    Parts of one dataset run side by side and share ``directory``: the record is built in a
    scratch directory and moved into place under a lock, and a record another job saved since
    ``started`` (this job's start) with a smaller sample index is kept instead of this one.
    """
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    try:
        _write_record(staging, directory, spec, source, error, stage)
        with open(directory.parent / f".{directory.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not _kept_instead(directory, error.index, started):
                old = directory.with_name(f"{staging.name}-old")
                if directory.exists():
                    directory.rename(old)
                staging.rename(directory)
                shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory


def _kept_instead(directory: Path, index: int | None, started: float) -> bool:
    """Whether ``directory`` holds a failure saved during this job with a smaller sample index."""
    try:
        if (directory / FAILURE_FILE).stat().st_mtime < started:
            return False
        with open(directory / FAILURE_FILE) as fh:
            theirs = json.load(fh).get("index")
    except (OSError, ValueError):
        return False
    return theirs is not None and index is not None and theirs < index


def _write_record(staging: Path, directory: Path, spec: DatasetSpec, source, error: SampleError, stage: str) -> None:
    record: dict[str, Any] = {
        "dataset": spec.name,
        "stage": stage,
        "field": error.field,
        "index": error.index,
        "message": str(error),
        "fix": error.fix,
        "traceback": getattr(error, "worker_traceback", None) or "".join(traceback.format_exception(error)),
        "working_directory": os.getcwd(),
        "dataset_dir": None,
        "spec": spec.to_dict(),
        "sample_file": None,
    }
    if getattr(error, "skipped", None):  # TooManyBadSamples: every bad sample found before the write stopped
        record["skipped"] = [s.to_dict() for s in error.skipped]
    if getattr(source, "needs_shard_list", False):  # keep the shard list, so the replay finds the same sample
        write_json(staging / "shards.json", {"dataset": spec.name, "shards": source.entries})
        record["dataset_dir"] = str(directory.resolve())
    if error.index is not None:
        try:
            sample = source[error.index]
            with open(staging / SAMPLE_FILE, "wb") as fh:
                # Protocol 5 keeps numpy arrays exactly (protocol 4 turns big-endian into native).
                pickle.dump(sample, fh, protocol=5)
            record["sample_file"] = SAMPLE_FILE
        except Exception as exc:  # noqa: BLE001 - the record is still useful without the sample
            (staging / SAMPLE_FILE).unlink(missing_ok=True)
            record["sample_unavailable"] = f"{type(exc).__name__}: {exc}"
    write_json(staging / FAILURE_FILE, record)


def clear_failure(directory: str | os.PathLike) -> None:
    shutil.rmtree(directory, ignore_errors=True)


def replay(directory: str | os.PathLike) -> tuple[tuple, dict[str, int]]:
    """Re-runs the saved sample through the sample contract and ffcv's encode; raises what it raises.

    Returns the checked values and their allocation sizes when the sample now passes.
    """
    directory = Path(directory)
    with open(directory / FAILURE_FILE) as fh:
        record = json.load(fh)
    spec = spec_from_dict(record["spec"])
    index = record["index"]
    if record.get("sample_file"):
        with open(directory / record["sample_file"], "rb") as fh:
            sample = pickle.load(fh)
        source = {index: sample}
    else:
        os.chdir(record["working_directory"])
        source = open_source(spec, record.get("dataset_dir"))
    values = CheckedDataset(spec, source)[index]
    fields = build_fields(spec)
    sizes = measure_allocations(fields, values)
    if sum(sizes.values()) > spec.writer.page_size:
        raise page_fit_error(spec, fields, values, index)
    return values, sizes
