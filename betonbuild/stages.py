"""The workflow's stages as plain functions: what each Snakemake rule (and the CLI) runs.

source manifest -> smoke write -> smoke verify -> full write -> full verify. Each stage reads the
dataset spec and the previous stage's files and writes its outputs atomically.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from .atomic import write_json
from .errors import SampleError, SourceError, VerificationError
from .failure import clear_failure, save_failure
from .preflight import inspect_samples, largest_rows
from .provenance import ffcv_build
from .sources import open_source, source_fingerprint
from .spec import DatasetSpec, resolve_indices, smoke_positions
from .verify import verify_beton
from .write import resolve_workers, write_beton


def _digest(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array, dtype="<i8").tobytes()).hexdigest()


def make_shard_list(spec: DatasetSpec, shard_list_path: str) -> dict[str, Any]:
    """results/{ds}/shards.json of a webdataset source (counts cached beside it, per shard)."""
    from .wds import shard_list

    listing = shard_list(spec, Path(shard_list_path).with_name(".shards-cache.json"))
    write_json(shard_list_path, listing)
    return listing


def make_source_manifest(spec: DatasetSpec, manifest_path: str) -> dict[str, Any]:
    """results/{ds}/source.json: length, final sample order and a fingerprint of the inputs."""
    source = open_source(spec, Path(manifest_path).parent)
    order = resolve_indices(spec.writer, len(source), spec.name)
    manifest = {
        "dataset": spec.name,
        "kind": spec.source["kind"],
        "length": len(source),
        "num_samples": int(len(order)),
        "order_sha256": _digest(order),
        "inputs": source_fingerprint(spec, source),
        "source": spec.source,
    }
    write_json(manifest_path, manifest)
    return manifest


def shard_work_items(source, rows: np.ndarray) -> list | None:
    """For shards: one work item per shard, so each shard is opened and read once, by one worker."""
    if not hasattr(source, "location"):
        return None
    items: dict[int, list[tuple[int, int]]] = {}
    for dest, index in enumerate(rows.tolist()):
        items.setdefault(source.location(index)[0], []).append((dest, index))
    return list(items.values())


def rows_to_write(spec: DatasetSpec, source, manifest_path: str, smoke: bool) -> np.ndarray:
    """Source index of every sample of the file: the final order, or the smoke subset of it."""
    with open(manifest_path) as fh:
        manifest = json.load(fh)
    if len(source) != manifest["length"]:
        raise SourceError(
            spec.name,
            f"the source now has {len(source)} samples but {manifest_path} recorded {manifest['length']}; "
            "it changed during the build: run snakemake again",
        )
    order = resolve_indices(spec.writer, len(source), spec.name)
    if _digest(order) != manifest["order_sha256"]:
        raise SourceError(spec.name, f"the sample order differs from the one recorded in {manifest_path}")
    if smoke:
        return order[smoke_positions(len(order), spec.smoke_samples, spec.writer.seed)]
    return order


def build(spec: DatasetSpec, manifest_path: str, beton_path: str, record_path: str,
          threads: int | None = None, smoke: bool = False, inspect_path: str | None = None,
          log=sys.stderr) -> dict[str, Any]:
    """Writes the smoke or full .beton and a record of the write (its rows and the ffcv build).

    The smoke stage first inspects its samples and the largest ones (``inspect_path``). A bad
    sample is saved under ``results/{ds}/failure/`` for ``betonbuild repro``.
    """
    source = open_source(spec, Path(manifest_path).parent)
    rows = rows_to_write(spec, source, manifest_path, smoke)
    failure_dir = Path(beton_path).parent / "failure"
    stage = "smoke" if smoke else "full"
    try:
        if inspect_path:
            order = rows_to_write(spec, source, manifest_path, smoke=False)
            write_json(inspect_path, inspect_samples(spec, source, np.concatenate([rows, largest_rows(source, order)])))
        # The smoke file is written by one worker: byte-identical across runs, and fastest to fail.
        workers = 1 if smoke else resolve_workers(spec.writer.num_workers, threads)
        record = write_beton(spec, source, rows, beton_path, workers, label=f"{spec.name} ({stage})", log=log,
                             work_items=shard_work_items(source, rows))
    except SampleError as exc:
        saved = save_failure(failure_dir, spec, source, exc, stage)
        exc.args = (f"{exc}\nThe failing sample is saved in {saved}; replay it with: betonbuild repro {saved}",)
        raise
    clear_failure(failure_dir)
    record.update(dataset=spec.name, stage=stage, rows_sha256=_digest(rows), provenance=ffcv_build())
    write_json(record_path, record)
    return record


def verify(spec: DatasetSpec, manifest_path: str, beton_path: str, record_path: str, report_path: str,
           failed_report_path: str, smoke: bool = False, threads: int | None = None) -> dict[str, Any]:
    """Writes the verification report at ``report_path`` if every check passes.

    Otherwise the report is kept at ``failed_report_path`` (Snakemake deletes a failed job's outputs)
    and a VerificationError names the worst finding. ``threads`` (the job's) compare rows in parallel.
    """
    source = open_source(spec, Path(manifest_path).parent)
    rows = rows_to_write(spec, source, manifest_path, smoke)
    with open(record_path) as fh:
        record = json.load(fh)
    if record.get("rows_sha256") != _digest(rows):
        raise VerificationError(f"{record_path} was written for other rows than the manifest now gives")
    report = verify_beton(spec, source, rows, beton_path, record.get("provenance"), every_variable_sample=smoke,
                          threads=threads or 1)
    report["stage"] = "smoke" if smoke else "full"
    report["write"] = {k: record.get(k) for k in ("num_workers", "page_size", "chunksize", "seconds")}
    with open(manifest_path) as fh:
        manifest = json.load(fh)
    # What made the file: the source's fingerprint (the dataset's config is in report["config"]).
    report["source"] = {k: manifest.get(k) for k in ("kind", "length", "num_samples", "order_sha256", "inputs")}
    if not report["ok"]:
        write_json(failed_report_path, report)
        raise VerificationError(
            f"dataset '{spec.name}': verification of {beton_path} failed: {report['worst']} "
            f"(full report kept at {failed_report_path})"
        )
    write_json(report_path, report)
    Path(failed_report_path).unlink(missing_ok=True)  # an earlier failure no longer describes this file
    return report
