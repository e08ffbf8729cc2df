"""The workflow's stages for a one-pass (iterable) source (``Source.one_pass``), called by
``workflow.stages`` where an indexed source would be indexed (docs/iterable-sources.md):

- source manifest: the length is unknown (``length``/``num_samples`` null, or ``source.length``
  when given) and no part is planned; the smoke samples are the first ``smoke.samples`` (one short
  iteration), fingerprinted sample by sample in smoke.json.
- smoke write and its gate: the first samples, held by the opened source, indexed 0..k-1.
- full write: the stream written in one pass into parts and merged (``write.onepass``), resumed
  after the finished parts; the record holds the count found.
- verification: a second iteration, compared with the file sample by sample in stream order (one
  comparing thread, one sample in memory), then checked to end at the count written.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from betonbuild.atomic import write_json
from betonbuild.beton.merge import merge_betons
from betonbuild.config.spec import DatasetSpec
from betonbuild.errors import SampleError, SourceError
from betonbuild.fields.custom import custom_handlers
from betonbuild.sources import open_source, source_fingerprint
from betonbuild.sources.iterable import IterableSource, held_bytes, iterate, starts_itself
from betonbuild.workflow import skipped
from betonbuild.workflow.partitions import plan_smoke, rows_digest
from betonbuild.workflow.skipped import KEPT_FOR_REPRO
from betonbuild.write.failure import clear_failure, save_failure
from betonbuild.write.onepass import part_paths, stream_skips, write_parts, write_plan
from betonbuild.write.skips import TooManyBadSamples, record_entry
from betonbuild.write.writer import resolve_workers


def make_stream_manifest(spec: DatasetSpec, manifest_path: str, smoke_path: str | None, log=sys.stderr) -> dict:
    """results/{ds}/source.json and smoke.json of an iterable: what is known before the write."""
    started = time.monotonic()
    source = open_source(spec)
    inputs = source_fingerprint(spec, source)
    declared = spec.source.get("length")
    manifest = {
        "dataset": spec.name,
        "kind": spec.source["kind"],
        "length": declared,  # the count found is in {ds}.write.json and the verification report
        "num_samples": declared,
        "order_sha256": None,
        "inputs": {k: v for k, v in inputs.items() if k != "file_sha256"},
        "source": spec.source,
        "partitions": [],  # cut during the write, which alone reads the whole stream
        "stream": {
            "first_samples": len(source),
            "samples_per_partition": IterableSource.samples_per_part(spec),
            "factory_starts_itself": starts_itself(spec),
            # the largest of the first samples in memory: the write holds a part of such samples
            "sample_bytes": max(held_bytes(sample) for sample in source.samples),
        },
    }
    write_json(manifest_path, manifest)
    if smoke_path:
        write_json(smoke_path, plan_smoke(spec, source, np.arange(len(source)), inputs))
    print(
        f"{spec.name}: iterable source, length {'unknown' if declared is None else declared}; its first "
        f"{len(source)} samples read for the smoke stage in {time.monotonic() - started:.2f} s",
        file=log,
        flush=True,
    )
    return manifest


def first_rows(spec: DatasetSpec, source, manifest: dict[str, Any], smoke: bool, part: int | None) -> np.ndarray:
    """The smoke stage's rows, and the order its pre-flight surveys: every sample the opened source
    holds (its first samples; the full write and its verification stream instead)."""
    if part is not None:
        raise SourceError(spec.name, "an iterable source is written in one pass, not by index (a betonbuild bug)")
    if len(source) != manifest["stream"]["first_samples"]:
        raise SourceError(
            spec.name,
            f"the iterable now yields {len(source)} first samples, the manifest recorded "
            f"{manifest['stream']['first_samples']}; it changed during the build: run snakemake again",
        )
    return np.arange(len(source), dtype=np.int64)


def parts_dir(spec: DatasetSpec, beton_path: str | os.PathLike) -> Path:
    """Where the parts of the write of ``beton_path`` are kept: results/NAME/parts/ in the workflow (as
    for a partitioned dataset), ``OUTPUT.parts/`` beside any other output (``betonbuild write``)."""
    path = Path(beton_path)
    if path.name == f"{spec.name}.beton" and path.parent.name == spec.name:
        return path.parent / "parts"
    return path.with_name(path.name + ".parts")


def write_stream(
    spec: DatasetSpec,
    manifest_path: str,
    beton_path: str,
    record_path: str,
    threads: int | None = None,
    log=sys.stderr,
) -> dict[str, Any]:
    """The full .beton of an iterable: its parts (resumed where finished) merged, and the write record."""
    started = time.time()
    with open(manifest_path) as fh:
        manifest = json.load(fh)
    directory = parts_dir(spec, beton_path)
    failure_dir = Path(beton_path).parent / "failure"
    plan = write_plan(spec, manifest["inputs"]["adapters_sha256"])
    workers = resolve_workers(spec.writer.num_workers, threads)

    def failed(samples, exc: SampleError) -> None:
        saved = save_failure(failure_dir, spec, samples, exc, "full", started)
        exc.args = (f"{exc}\nThe failing sample is saved in {saved}; replay it with: betonbuild repro {saved}",)

    def kept(samples, skips: list, earlier: int) -> None:  # under skip: the first few, for `betonbuild repro`
        rows = np.arange(samples.start, len(samples), dtype=np.int64)
        skipped.keep_for_repro(
            spec, samples, failure_dir.parent, skips[: max(0, KEPT_FOR_REPRO - earlier)], "full", rows
        )

    # A sample the contract or ffcv's encode refuses is saved for `betonbuild repro` (or, under skip,
    # left out and recorded); an exception of the iterable itself has no sample to save (its message
    # names the position) and is never skipped
    records, resumed = write_parts(spec, directory, plan, workers, failed, log, kept)
    paths = [str(part_paths(directory, r["part"])[0]) for r in records if r.get("written") != 0]
    skips = stream_skips(spec, records)  # positions in the stream; none beyond the limit
    if not paths:  # every part's every sample bad (past the smoke gate): never an empty .beton
        count = sum(r["num_samples"] for r in records)
        raise TooManyBadSamples(spec.name, skips, spec.bad_samples.limit(count), count, "full", count)
    merged = merge_betons(paths, beton_path, custom_handlers=custom_handlers(spec))
    count = sum(r["num_samples"] for r in records)  # the samples the stream yielded; the file: minus skips
    record = {
        "dataset": spec.name,
        "stage": "full",
        "num_samples": merged["num_samples"],
        "num_workers": workers,
        "page_size": spec.writer.page_size,
        "chunksize": spec.writer.chunksize,
        "seconds": round(sum(r["seconds"] for r in records) + merged["seconds"], 3),
        "rows_sha256": rows_digest(np.arange(count, dtype=np.int64)),
        "provenance": records[0]["provenance"],
        "partitions": [
            {k: r.get(k) for k in ("part", "start", "num_samples", "seconds", "samples_sha256")} for r in records
        ],
        "merge": {k: v for k, v in merged.items() if k != "parts"},
        "stream": {"count": count, "parts": len(records), "resumed_parts": resumed},
    }
    if spec.bad_samples.skip:
        record["skipped"] = record_entry(skips, spec.bad_samples.limit(spec.source.get("length") or count))
    write_json(record_path, record)
    clear_failure(failure_dir)
    skipped.publish(spec, failure_dir.parent, record, count)
    if not spec.partitions.keep_parts:
        shutil.rmtree(directory, ignore_errors=True)
    print(
        f"{spec.name}: {count} samples found{f', {len(skips)} bad ones skipped' if skips else ''}, written in "
        f"{len(records)} part(s) ({resumed} finished by an earlier run) and merged in {merged['seconds']:.2f} s",
        file=log,
        flush=True,
    )
    return record


class StreamSource:
    """A second iteration of the source, read forward only: position i is asked for after every
    earlier one it needs (verification's one comparing thread asks in increasing order); one sample is
    kept. Positions the comparison skips are read and dropped."""

    def __init__(self, spec: DatasetSpec, count: int):
        self.spec = spec
        self.count = count
        self.stream = iterate(spec)
        self.position = -1
        self.sample: Any = None
        self.ended_at: int | None = None

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, position: int) -> Any:
        position = int(position)
        if position < self.position:
            raise SourceError(self.spec.name, f"position {position} asked after {self.position} (a betonbuild bug)")
        while self.position < position:
            item = next(self.stream, None)
            if item is None:
                self.ended_at = self.position + 1
                raise SourceError(
                    self.spec.name,
                    f"the iterable's second iteration ended after {self.ended_at} samples; the file holds "
                    f"{self.count}: the source does not yield the same samples each time it is iterated",
                )
            self.position, self.sample = item
        return self.sample

    def fixed_columns(self) -> dict[str, Any]:
        return {}

    def encoded_image(self, index: int) -> None:
        return None

    def some_fields(self, index: int, columns: list[int]) -> None:
        return None  # read forward only: whole samples, in order

    def extra_sample(self) -> bool:
        """Whether the second iteration yields more samples than the file holds."""
        if self.ended_at is not None:
            return False
        while self.position < self.count - 1:
            if next(self.stream, None) is None:
                return False
            self.position += 1
        return next(self.stream, None) is not None


def stream_for_verify(spec: DatasetSpec, record_path: str) -> tuple[StreamSource, np.ndarray]:
    """The second iteration and the stream positions (0..count-1) the write read: the full file holds
    them but for the skipped ones its record lists (``verify_beton(skipped=...)`` leaves those out)."""
    with open(record_path) as fh:
        record = json.load(fh)
    count = int((record.get("stream") or {}).get("count", record["num_samples"]))
    return StreamSource(spec, count), np.arange(count, dtype=np.int64)


def finish_verify(report: dict[str, Any], source: StreamSource) -> None:
    """Adds the check that the second iteration ended at the count written, and the count to the report."""
    extra = source.extra_sample()
    ok = not extra and source.ended_at is None
    detail = (
        f"the second iteration yielded the {source.count} samples the write read, and no more"
        if ok
        else f"the second iteration yielded {'more' if extra else 'fewer'} than the {source.count} samples the "
        "write read"
    )
    report["checks"].append({"name": "stream_length", "ok": ok, "detail": detail})
    if not ok:
        report["ok"] = False
        report["worst"] = report.get("worst") or f"stream_length: {detail}"
    report["source"]["length"] = report["source"]["num_samples"] = source.count
