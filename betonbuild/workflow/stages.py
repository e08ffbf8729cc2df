"""The workflow's stages as plain functions: what each Snakemake rule (and the CLI) runs.

source manifest -> smoke write -> smoke verify -> full write (or part writes and their merge) ->
full verify. Each stage reads the dataset spec and the previous stage's files and writes its outputs
atomically.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from betonbuild.atomic import write_json
from betonbuild.beton.header import read_header, scaled_size
from betonbuild.beton.merge import merge_betons
from betonbuild.config.spec import DatasetSpec, resolve_indices, smoke_positions
from betonbuild.errors import MergeError, SampleError, SourceError, VerificationError
from betonbuild.fields.custom import custom_handlers
from betonbuild.fields.kept_jpeg import sum_keep_counts
from betonbuild.mapped_pages import shared_array
from betonbuild.provenance import ffcv_build
from betonbuild.sources import open_source, source_class, source_fingerprint
from betonbuild.sources.folder_listing import hashing_pool, write_listing
from betonbuild.sources.image_folder import ImageFolderSource
from betonbuild.sources.shards import shard_list
from betonbuild.verify import LoaderProcess, start_loader_process, verify_beton
from betonbuild.workflow import onepass, skipped, smoke_copy, write_evidence
from betonbuild.workflow.partitions import (
    partition_bounds,
    parts_digest,
    plan_partitions,
    plan_smoke,
    rows_digest,
    verified_parts,
    whole_order,
)
from betonbuild.workflow.resources import check_manifest_memory
from betonbuild.write.determinism import SourceNotDeterministic, check_deterministic
from betonbuild.write.failure import clear_failure, save_failure
from betonbuild.write.free_space import check_free_space, estimated_from_smoke
from betonbuild.write.preflight import largest_rows, survey_samples
from betonbuild.write.writer import resolve_workers, write_beton


def make_shard_list(spec: DatasetSpec, shard_list_path: str) -> dict[str, Any]:
    """results/{ds}/shards.json of a webdataset source (counts cached beside it, per shard)."""
    listing = shard_list(spec, Path(shard_list_path).with_name(".shards-cache.json"))
    write_json(shard_list_path, listing)
    return listing


def make_file_list(spec: DatasetSpec, file_list_path: str, processes: int = 1, log=sys.stderr) -> None:
    """results/{ds}/files.npz of an image folder: every file, its stat and sha256 (hashed only where
    it changed since the last listing, in ``processes`` processes)."""
    started = time.monotonic()
    with hashing_pool(processes) as pool:  # forked before the listing exists (folder_listing.hashing_pool)
        listing = ImageFolderSource.scan(spec)
        hashed = write_listing(spec.name, listing, file_list_path, pool=pool)
    seconds = time.monotonic() - started
    print(f"{spec.name}: {len(listing)} files listed, {hashed} hashed (new or changed) in {seconds:.2f} s", file=log)
    log.flush()


def make_source_manifest(
    spec: DatasetSpec,
    manifest_path: str,
    plan_parts: bool = True,
    smoke_path: str | None = None,
    memory_mb: int | None = None,
    log=sys.stderr,
    hash_inputs: bool = True,
) -> dict[str, Any]:
    """results/{ds}/source.json: length, final sample order and a fingerprint of the inputs.

    ``plan_parts=False`` (the CLI, which writes one file) plans the whole order as one part rather
    than fingerprinting each partition's source content. ``smoke_path`` (results/{ds}/smoke.json):
    the smoke samples and a fingerprint of exactly their content, in a file of its own so that a
    change of the smoke settings leaves source.json, and the stages that read it, as they were.
    ``memory_mb``: the job's declared memory (a Snakemake job's mem_mb), checked against the length.
    ``hash_inputs=False`` (the CLI's direct write): the inputs are counted, not hashed (``sha256`` None)."""
    if source_class(spec).one_pass:  # an iterable: nothing to index before its one-pass write
        return onepass.make_stream_manifest(spec, manifest_path, smoke_path, log)
    started = time.monotonic()
    source = open_source(spec, Path(manifest_path).parent)
    if memory_mb is not None:
        check_manifest_memory(spec, len(source), memory_mb)
    order = resolve_indices(spec.writer, len(source), spec.name)
    # A partitioned arrays source is read once, for its parts' row digests, which then make up its
    # fingerprint (hashing the files as well would read every byte twice)
    by_parts = plan_parts and source.fingerprint_from_parts and len(partition_bounds(spec, len(order))) > 1
    inputs = source_fingerprint(spec, source, read_files=hash_inputs and not by_parts)
    parts = plan_partitions(spec, source, order, inputs) if plan_parts else [whole_order(order, inputs)]
    if by_parts:
        inputs["sha256"] = parts_digest(parts)
    manifest = {
        "dataset": spec.name,
        "kind": spec.source["kind"],
        "length": len(source),
        "num_samples": int(len(order)),
        "order_sha256": rows_digest(order),
        "inputs": {k: v for k, v in inputs.items() if k != "file_sha256"},  # per file: too long to keep
        "source": spec.source,
        "partitions": parts,
    }
    write_json(manifest_path, manifest)
    if smoke_path:
        write_json(
            smoke_path, plan_smoke(spec, source, np.unique(np.concatenate(smoke_rows(spec, source, order))), inputs)
        )
    print(
        f"{spec.name}: {manifest['num_samples']} samples; {inputs['files']} input files "
        f"({inputs['bytes'] / 2**20:,.1f} MiB) fingerprinted, {len(manifest['partitions'])} part(s) planned "
        f"in {time.monotonic() - started:.2f} s",
        file=log,
        flush=True,
    )
    return manifest


def smoke_samples(spec: DatasetSpec, order: np.ndarray) -> np.ndarray:
    """Source indices of the smoke file's samples."""
    return order[smoke_positions(len(order), spec.smoke_samples, spec.writer.seed)]


def smoke_rows(spec: DatasetSpec, source, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Source indices of (the smoke samples, the largest samples its pre-flight also inspects)."""
    return smoke_samples(spec, order), largest_rows(source, order)


def rows_to_write(spec: DatasetSpec, source, manifest_path: str, smoke: bool, part: int | None = None) -> np.ndarray:
    """Source index of every sample of the file: the final order, the smoke subset of it, or a part's slice."""
    with open(manifest_path) as fh:
        manifest = json.load(fh)
    if source.one_pass:  # an iterable: the smoke stage reads its first samples (the write streams)
        return onepass.first_rows(spec, source, manifest, smoke, part)
    if len(source) != manifest["length"]:
        raise SourceError(
            spec.name,
            f"the source now has {len(source)} samples but {manifest_path} recorded {manifest['length']}; "
            "it changed during the build: run snakemake again",
        )
    order = resolve_indices(spec.writer, len(source), spec.name)
    if rows_digest(order) != manifest["order_sha256"]:
        raise SourceError(spec.name, f"the sample order differs from the one recorded in {manifest_path}")
    if smoke:
        return smoke_samples(spec, order)
    if part is not None:
        entry = manifest["partitions"][part]
        return order[entry["start"] : entry["stop"]]
    return shared_array(order)  # the writer's forked workers drop their view of it as they go


def build(
    spec: DatasetSpec,
    manifest_path: str,
    beton_path: str,
    record_path: str,
    threads: int | None = None,
    smoke: bool = False,
    survey_path: str | None = None,
    part: int | None = None,
    log=sys.stderr,
    evidence: bool = True,
    started_loader: LoaderProcess | None = None,
    watch: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Writes the smoke or full .beton, or one part of a partitioned one, and a record of the write
    (its rows and the ffcv build). ``started_loader``: the Loader batch's child, if the job script
    started it first thing (``betonbuild.loader_process``). ``watch``: ``write_beton``'s, called
    during the write (the smoke gate's Loader batch, still running: ``workflow.gate``).

    ``evidence``: the record also holds what its verification reuses (``workflow.write_evidence``):
    the measured images and, but for the smoke file, the Loader batch. ``betonbuild write`` passes
    False: its record is bound to no fingerprinted source, so nothing could reuse them.

    The smoke stage first surveys its samples and the largest ones (``survey_path``, inspect.json) and
    reads a few twice (``write.determinism``). A bad sample is saved under ``results/{ds}/failure/``
    for ``betonbuild repro``; under ``bad_samples: {policy: skip}`` it is left out instead, up to the
    limit (``workflow.skipped``).
    """
    one_pass = source_class(spec).one_pass and not smoke  # an iterable: written in one pass, into parts
    # The full file's Loader batch (write_evidence): ffcv imported by a child process during the write
    loader = None
    if evidence and not smoke and part is None and not one_pass:
        loader = start_loader_process(spec, threads or 1, started_loader)
    elif started_loader is not None:
        started_loader.close()  # not needed here after all
    if one_pass:
        return onepass.write_stream(spec, manifest_path, beton_path, record_path, threads, log)
    try:
        paths = (manifest_path, beton_path, record_path, survey_path)
        options = {"threads": threads, "smoke": smoke, "part": part, "log": log, "evidence": evidence, "watch": watch}
        return _write(spec, *paths, **options, loader=loader)
    finally:
        if loader is not None:
            loader.close()


def _write(
    spec, manifest_path, beton_path, record_path, survey_path, *, threads, smoke, part, log, evidence, watch, loader
):
    """``build`` of an indexed source; ``loader``: the child that runs the full file's Loader batch, or None."""
    started = time.time()
    dataset_dir = Path(manifest_path).parent
    source = open_source(spec, dataset_dir)
    rows = rows_to_write(spec, source, manifest_path, smoke, part)
    rows = shared_array(rows) if not smoke and part is None else rows  # workers drop their view as they go
    # results/{ds}/failure/ (a part's file is in results/{ds}/parts/)
    failure_dir = Path(beton_path).parents[0 if part is None else 1] / "failure"
    stage = "smoke" if smoke else "full" if part is None else f"part {part}"
    if not smoke and part is None and (smoke_record := smoke_copy.smoke_record_for(spec, dataset_dir, rows)):
        record = smoke_copy.copy_smoke_file(dataset_dir, beton_path, smoke_record)
        clear_failure(failure_dir)
        write_json(record_path, record)
        return record
    with open(manifest_path) as fh:
        manifest = json.load(fh)
    skip = skipped.write_limit(spec, len(rows), manifest["num_samples"], stage)
    try:
        if survey_path:
            order = rows_to_write(spec, source, manifest_path, smoke=False)
            survey = survey_samples(spec, source, np.concatenate(smoke_rows(spec, source, order)))
            write_json(survey_path, survey)
            # Only the user's code can draw values when it is created: other kinds are not opened twice
            user_code = bool(source_class(spec).adapter_references(spec))
            good = np.setdiff1d(rows, [b["index"] for b in survey.get("bad_samples", [])])  # read twice: good ones
            check_deterministic(spec, source, good, (lambda: open_source(spec, dataset_dir)) if user_code else None)
        if not smoke and part is None:
            check_free_space(spec.name, beton_path, _estimated_size(dataset_dir / "smoke.beton", len(rows)))
        # The smoke file and the parts are written by one worker: byte-identical across runs
        # (a part's parallelism is the other parts' jobs), and the smoke file fails fastest.
        workers = 1 if smoke or part is not None else resolve_workers(spec.writer.num_workers, threads)
        record = write_beton(
            spec,
            source,
            rows,
            beton_path,
            workers,
            label=f"{spec.name} ({stage})",
            log=log,
            work_items=source.work_items(rows),  # shards: each opened and read once, by one worker
            skip=skip,
            measure_images=evidence,
            watch=watch,
        )
    except SourceNotDeterministic:
        raise  # every read passes the contract: there is no failing sample to save and replay
    except SampleError as exc:
        saved = save_failure(failure_dir, spec, source, exc, stage, started)
        exc.args = (f"{exc}\nThe failing sample is saved in {saved}; replay it with: betonbuild repro {saved}",)
        raise
    if part is None:  # a partitioned dataset's failure is cleared by its merge, when every part is written
        clear_failure(failure_dir)
    if skip is not None and not smoke:
        skipped.keep_for_repro(spec, source, failure_dir.parent, skipped.from_record(record), stage, rows)
    if not smoke and part is None:
        skipped.publish(spec, failure_dir.parent, record, len(rows))
    record.update(dataset=spec.name, stage=stage, rows_sha256=rows_digest(rows), provenance=ffcv_build())
    record["source_state"] = write_evidence.source_state(manifest, part)
    if evidence and not smoke and (batch := write_evidence.loader_batch_after_write(spec, beton_path, loader)):
        record["loader_batch"] = batch  # its verification need not import ffcv for this batch
    if part is not None:
        record.update(part=part, fingerprint=manifest["partitions"][part]["fingerprint"])
    write_json(record_path, record)
    return record


def _estimated_size(smoke_beton: Path, samples: int) -> int | None:
    """Bytes of the full file, scaled from the smoke file's own header and allocation table (not
    from the sample order, which would be resolved again); None without a smoke file."""
    try:
        scaled = scaled_size(smoke_beton, samples)
        header = read_header(smoke_beton) if scaled is None else None
    except OSError:
        return None
    if header is not None:  # a file its table cannot describe: scaled whole
        return estimated_from_smoke(smoke_beton, int(header["num_samples"]), samples)
    return scaled


def merge_parts(
    spec: DatasetSpec,
    manifest_path: str,
    part_paths: list[str],
    part_records: list[str],
    beton_path: str,
    record_path: str,
    log=sys.stderr,
) -> dict[str, Any]:
    """Joins the part files in order into the dataset's .beton (``betonbuild.beton.merge``).

    Every part must have been written for the partition the manifest now plans (same rows, same
    source fingerprint) by the same ffcv build: a stale or foreign part is an error, never merged.
    """
    with open(manifest_path) as fh:
        manifest = json.load(fh)
    planned = manifest["partitions"]
    if len(part_paths) != len(planned):
        raise MergeError(
            f"dataset '{spec.name}': {len(part_paths)} part files given, the manifest plans {len(planned)}"
        )
    records = []
    for index, (entry, record_file) in enumerate(zip(planned, part_records)):
        with open(record_file) as fh:
            record = json.load(fh)
        for key in ("rows_sha256", "fingerprint"):
            if record.get(key) != entry[key]:
                raise MergeError(
                    f"dataset '{spec.name}': part {index} ({part_paths[index]}) was written for other "
                    f"{'rows' if key == 'rows_sha256' else 'source content'} than {manifest_path} now plans; "
                    f"rewrite it: snakemake --forcerun write_part (or delete the file)"
                )
        records.append(record)
    builds = {json.dumps(r["provenance"], sort_keys=True) for r in records}
    if len(builds) != 1:
        raise MergeError(f"dataset '{spec.name}': the parts were written by different ffcv builds: {sorted(builds)}")
    check_free_space(spec.name, beton_path, sum(os.path.getsize(path) for path in part_paths))
    order = resolve_indices(spec.writer, manifest["length"], spec.name)
    skips = skipped.combined(spec, records, planned, len(order))  # before the merge: none beyond the limit
    merged = merge_betons(part_paths, beton_path, custom_handlers=custom_handlers(spec))
    record = {
        "dataset": spec.name,
        "stage": "full",
        "num_samples": merged["num_samples"],
        "num_workers": 1,
        "page_size": spec.writer.page_size,
        "chunksize": spec.writer.chunksize,
        "seconds": round(sum(r.get("seconds", 0) for r in records) + merged["seconds"], 3),
        "rows_sha256": rows_digest(order),
        "provenance": records[0]["provenance"],
        "partitions": [{k: r.get(k) for k in ("part", "num_samples", "seconds", "fingerprint")} for r in records],
        "merge": {k: v for k, v in merged.items() if k != "parts"},
        **({"skipped": skips} if skips is not None else {}),
    }
    if any("source_jpeg" in r for r in records):  # ``source_jpeg: keep``: the parts' counts, summed
        record["source_jpeg"] = sum_keep_counts([r.get("source_jpeg", {}) for r in records])
    if record["rows_sha256"] != manifest["order_sha256"]:
        raise MergeError(f"dataset '{spec.name}': the sample order differs from the one recorded in {manifest_path}")
    write_json(record_path, record)
    clear_failure(Path(beton_path).parent / "failure")
    skipped.publish(spec, Path(beton_path).parent, record, len(order))
    print(
        f"{spec.name}: merged {merged['num_parts']} parts, {merged['num_samples']} samples, "
        f"{merged['size'] / 2**20:,.1f} MiB ({merged['method']}) in {merged['seconds']:.2f} s",
        file=log,
        flush=True,
    )
    return record


def verify_dataset(
    spec: DatasetSpec,
    manifest_path: str,
    beton_path: str,
    record_path: str,
    report_path: str,
    failed_report_path: str,
    smoke: bool = False,
    threads: int | None = None,
    part: int | None = None,
    part_reports: list[str] | None = None,
    loader: LoaderProcess | None = None,
    compared: Callable[[bool], None] | None = None,
) -> dict[str, Any]:
    """Writes the verification report at ``report_path`` if every check passes.

    Otherwise the report is kept at ``failed_report_path`` (Snakemake deletes a failed job's outputs)
    and a VerificationError names the worst finding. ``threads`` (the job's) compare rows in parallel.
    A part (``part``) is verified in full; a merged file, given its parts' reports, is proven to hold
    exactly their content, so that a rebuild of one part re-decodes that part alone. ``loader``: a
    ``verify.start_loader_process(spec)`` the caller started earlier (else it starts here); it
    imports ffcv in its own process meanwhile, for the Loader batch. ``compared``: ``verify_beton``'s.
    """
    if not smoke and part is None and (reused := _gate_report(spec, manifest_path, beton_path, record_path)):
        if loader is not None:
            loader.close()
        return _publish_report(reused, report_path, failed_report_path)
    with open(record_path) as fh:
        record = json.load(fh)
    written_batch = write_evidence.written_loader_batch(record)
    if written_batch is None:
        loader = loader or start_loader_process(spec, threads or 1)  # it imports ffcv while the source is opened
    elif loader is not None:
        loader.close()  # the write job read this file through ffcv.Loader already
        loader = None
    streamed = source_class(spec).one_pass and not smoke
    try:
        if streamed:  # an iterable: a second iteration, compared in stream order by one thread
            source, rows = onepass.stream_for_verify(spec, record_path)
            threads = 1
        else:
            source = open_source(spec, Path(manifest_path).parent)
            rows = rows_to_write(spec, source, manifest_path, smoke, part)
        if record.get("rows_sha256") != rows_digest(rows):
            raise VerificationError(f"{record_path} was written for other rows than the manifest now gives")
        with open(manifest_path) as fh:
            manifest = json.load(fh)
        parts = verified_parts(spec, manifest, part_reports) if part_reports else None
        report = verify_beton(
            spec,
            source,
            rows,
            beton_path,
            record.get("provenance"),
            every_variable_sample=smoke or part is not None,
            threads=threads or 1,
            parts=parts,
            loader=loader,
            measured=write_evidence.measured_for(spec, record, manifest, part),
            written_loader_batch=written_batch,
            compared=compared,
            **_skipped_rows(record),
        )
    finally:
        if loader is not None:
            loader.close()
    report["stage"] = "smoke" if smoke else "full" if part is None else f"part {part}"
    report["write"] = {k: record.get(k) for k in ("num_workers", "page_size", "chunksize", "seconds")}
    whole_range = report.pop("range_digest")  # range_digest(file, 0, n), from the content digest's leaves
    if part is not None:
        report["part"] = {**manifest["partitions"][part], "range_digest": whole_range}
    # What made the file: the source's fingerprint (the dataset's config is in report["config"]). The
    # smoke file and a part are rebuilt only when their own samples change: not for every input.
    whole_source = not smoke and part is None
    report["source"] = {
        k: manifest.get(k)
        for k in ("kind", "length", "num_samples", "order_sha256", "inputs")
        if whole_source or k != "inputs"
    }
    if streamed:
        onepass.finish_verify(report, source)
    if not report["ok"]:
        write_json(failed_report_path, report)
        raise VerificationError(
            f"dataset '{spec.name}': verification of {beton_path} failed: {report['worst']} "
            f"(full report kept at {failed_report_path})"
        )
    return _publish_report(report, report_path, failed_report_path)


def _publish_report(report: dict[str, Any], report_path: str, failed_report_path: str) -> dict[str, Any]:
    write_json(report_path, report)
    Path(failed_report_path).unlink(missing_ok=True)  # an earlier failure no longer describes this file
    return report


def _gate_report(spec: DatasetSpec, manifest_path: str, beton_path: str, record_path: str) -> dict[str, Any] | None:
    """The full report of a file that is the smoke file the gate verified (``smoke_copy``), or None."""
    with open(record_path) as fh:
        record = json.load(fh)
    if record.get("copied_from") is None:
        return None
    with open(manifest_path) as fh:
        manifest = json.load(fh)
    source = open_source(spec, Path(manifest_path).parent)
    if record.get("rows_sha256") != rows_digest(rows_to_write(spec, source, manifest_path, smoke=False)):
        return None
    report = smoke_copy.gate_report_for(spec, Path(manifest_path).parent, beton_path, record, manifest["num_samples"])
    if report is not None:
        report["stage"] = "full"
        report["write"] = {k: record.get(k) for k in ("num_workers", "page_size", "chunksize", "seconds")}
        report["source"] = {k: manifest.get(k) for k in ("kind", "length", "num_samples", "order_sha256", "inputs")}
    return report


def _skipped_rows(record: dict[str, Any]) -> dict[str, Any]:
    """verify_beton's ``skipped``/``skip_limit`` from a write record written under ``skip``."""
    if "skipped" not in record:
        return {}
    return {"skipped": skipped.from_record(record), "skip_limit": record["skipped"]["limit"]}
