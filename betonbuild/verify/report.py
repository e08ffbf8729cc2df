"""The read-back report: proves a .beton holds its source's data, written by this ffcv build.

Every report has the structural checks (``beton.structural_checks``), the fixed-size fields of
EVERY sample (vectorised over a memmap of the file), the variable-size and custom fields of every
sample (``mode: full``) or of a seeded sample of them (``mode: sample``), which decoder decoded the
stored JPEGs, one batch through the real ``ffcv.Loader``, and the writer's vs the reader's ffcv
build. Every check can fail. The content digest is a value of the report (``content_digest``), not a
check: it appears in ``checks`` only when it could not be computed; it covers what the file holds.
Samples the write skipped (``bad_samples: {policy: skip}``, listed in its record) are left out of
the rows the file is compared with, exactly those: a recorded one that is present, or a missing
one that is not recorded, fails ``num_samples`` or the content checks. The content comparisons
(``betonbuild.verify.content``) run on a thread pool over chunks of file positions (cv2, numpy and
hashlib release the GIL).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from betonbuild.beton.digest import blocks, content_from_leaves, leaf_releasing, range_from_leaves
from betonbuild.beton.format import BetonFile
from betonbuild.config.spec import DatasetSpec
from betonbuild.errors import BetonbuildError
from betonbuild.fields.custom import custom_handlers
from betonbuild.provenance import build_differences, ffcv_build
from betonbuild.sources import sha256_file
from betonbuild.verify.content import Context, fixed_result, run_content, variable_result
from betonbuild.verify.images import decoder_result, load_decoders
from betonbuild.verify.loader import LoaderProcess, check_loader_batch, import_ffcv, start_loader_process
from betonbuild.verify.measured import accepted_measurements
from betonbuild.verify.structure import allowed_empty, check_fields, check_format_version, check_structure
from betonbuild.write.skips import SkippedSample, summary


class Report:
    def __init__(self):
        self.checks: list[dict[str, Any]] = []

    def check(self, name: str, ok: bool, detail: str, **extra) -> bool:
        self.checks.append({"name": name, "ok": bool(ok), "detail": detail, **extra})
        return bool(ok)

    def run(self, name: str, fn: Callable[[], tuple[bool, str] | tuple[bool, str, dict]]) -> bool:
        try:
            ok, detail, *extra = fn()
        except Exception as exc:  # noqa: BLE001 - a check that crashes is a failed check, reported
            return self.check(name, False, f"{type(exc).__name__}: {exc}")
        return self.check(name, ok, detail, **(extra[0] if extra else {}))

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c["ok"] for c in self.checks)

    def worst(self) -> str | None:
        failed = [c for c in self.checks if not c["ok"]]
        return f"{failed[0]['name']}: {failed[0]['detail']}" if failed else None


def resolve_mode(spec: DatasetSpec, num_samples: int, every_variable_sample: bool = False) -> str:
    """full or sample: ``verify.mode``, where auto means full up to ``verify.full_max_samples`` samples."""
    if every_variable_sample:
        return "full"
    mode = spec.verify.get("mode", "auto")
    if mode == "auto":
        return "full" if num_samples <= int(spec.verify.get("full_max_samples", 100_000)) else "sample"
    return mode


def verify_beton(
    spec: DatasetSpec,
    source,
    indices: np.ndarray,
    path: str,
    writer_build: dict | None,
    every_variable_sample: bool = False,
    threads: int = 1,
    parts: list[dict] | None = None,
    loader: LoaderProcess | None = None,
    skipped: list[SkippedSample] | None = None,
    skip_limit: int | None = None,
    measured: dict[str, Any] | None = None,
    written_loader_batch: dict[str, Any] | None = None,
    compared: Callable[[bool], None] | None = None,
) -> dict[str, Any]:
    """``indices[i]`` is the source index that sample i of ``path`` must hold, but for the positions
    ``skipped`` lists (the write record's skipped samples): the file holds the others, in order.

    ``every_variable_sample`` (the smoke gate, a part) forces full mode. ``threads`` is the pool size.
    ``parts`` (a merged file): ``{index, start, stop, range_digest}`` of part files that were each
    verified in full; the file must hold exactly their content at those rows (check ``parts``), and
    with ``mode: auto`` its own comparison with the source is then a seeded sample.
    ``loader``: what ``start_loader_process(spec)`` returned, if the caller started it earlier (it
    is then already importing ffcv); verify_beton starts one itself otherwise, and ends it either way.
    ``measured``: the write record's ``measured_images``, when it was written from this source as it
    is now (``verify.measured`` decides, per field, whether they describe this file).
    ``written_loader_batch``: the passed ``loader_batch`` the write job ran ({ok, detail, sha256},
    ``workflow.write_evidence``): ffcv is then not imported here at all, and the check passes if
    this file's SHA-256 is the one the write job read.
    ``compared``: called with whether every check so far passed, before the Loader batch's answer
    is awaited (the smoke gate then starts the full write: ``workflow.gate``).
    """
    started = time.monotonic()
    threads = max(1, int(threads or 1))
    report = Report()
    planned = len(indices)
    if skipped is not None:
        indices = _without_skipped(indices, skipped, skip_limit, report)
    mode = resolve_mode(spec, len(indices), every_variable_sample)
    if parts and spec.verify.get("mode", "auto") == "auto":
        mode = "sample"
    reader_build = ffcv_build()
    result: dict[str, Any] = {
        "dataset": spec.name,
        "file": {"path": path, "bytes": os.path.getsize(path), "sha256": None},
        "ok": False,
        "mode": mode,
        "threads": threads,
        "num_samples": {"expected": int(len(indices)), "found": None},
        "fields": [],
        "content_digest": None,
        "range_digest": None,
        "checks": report.checks,
        "provenance": {"writer": writer_build, "reader": reader_build},
        "config": spec.to_dict(),
    }
    if skipped is not None:
        result["num_samples"]["planned"] = planned
        result["skipped"] = summary(sorted(skipped, key=lambda s: s.position), skip_limit or 0, planned)
    if written_loader_batch is None:
        loader = loader or start_loader_process(spec, threads)
    with ThreadPoolExecutor(threads) as pool:
        file_hash = pool.submit(sha256_file, path)
        try:
            _verify_file(
                spec,
                source,
                indices,
                path,
                mode,
                pool,
                threads,
                report,
                result,
                parts,
                loader,
                measured,
                written_loader_batch and _Answered(written_loader_batch, file_hash),
                compared,
            )
        finally:
            result["file"]["sha256"] = file_hash.result()
            if loader is not None:
                loader.close()
    check_build(spec, writer_build, reader_build, report)
    result["seconds"] = round(time.monotonic() - started, 3)
    return _finish(result, report)


def _verify_file(
    spec: DatasetSpec,
    source,
    indices: np.ndarray,
    path: str,
    mode: str,
    pool: ThreadPoolExecutor,
    threads: int,
    report: Report,
    result: dict,
    parts: list[dict] | None,
    child: LoaderProcess | None,
    measured: dict[str, Any] | None,
    written_batch: _Answered | None,
    compared: Callable[[bool], None] | None,
) -> None:
    version = check_format_version(path)
    if version is not None and not report.check("format_version", *version):
        return  # the reader refuses any other version: nothing more can be read
    try:
        beton = BetonFile(path, custom_handlers=custom_handlers(spec))
    except BetonbuildError as exc:
        report.check("format", False, str(exc))
        return
    result["num_samples"]["found"] = beton.num_samples
    result["fields"] = [{"name": f.name, "type": f.type_name, "type_id": f.type_id} for f in beton.fields]
    if not report.check(
        "num_samples", beton.num_samples == len(indices), f"file has {beton.num_samples}, expected {len(indices)}"
    ):
        return
    if not report.run("fields", lambda: check_fields(beton, spec)):
        return
    structure_ok = report.run("allocations", lambda: check_structure(beton, allowed_empty(spec)))
    load_decoders()
    # ffcv's Loader does not bounds-check, so it only reads a file whose structure is sound.
    # Importing ffcv (torch) and numba's compilation are ~2 s of one core that hold the GIL: in a
    # thread they would starve the comparing threads, which need the GIL between decodes. When the
    # comparisons need none of ffcv's modules, the child process (``start_loader_process``) runs the
    # Loader batch meanwhile, and this one never imports ffcv.
    if written_batch is not None:
        loader = written_batch if structure_ok else None
    elif child is None:
        import_ffcv()  # here, before the pool runs: the comparisons or the Loader batch need ffcv's modules
        loader = pool.submit(check_loader_batch, beton, spec) if structure_ok else None
    else:
        loader = child.request(path, spec) if structure_ok else None
    # The block hashes of the content digest first (short tasks), then the chunks of positions.
    leaves = _submit_leaves(pool, beton, 0, beton.num_samples)
    part_leaves = [_submit_leaves(pool, beton, p["start"], p["stop"]) for p in parts or []]
    tolerance = float(spec.verify["jpeg_mean_abs_error"])
    accepted, refused = (
        ({}, {}) if not structure_ok else accepted_measurements(beton, measured, len(indices), tolerance, pool)
    )
    context = Context.build(beton, spec, source, indices, mode, threads, accepted)
    try:
        tally = run_content(context, pool)
        context.add_measured(tally, refused)
    except Exception as exc:  # noqa: BLE001 - a comparison that crashes is a failed check, reported
        report.check("content", False, f"comparing the file with its source failed: {type(exc).__name__}: {exc}")
        tally = None
    if tally is not None and context.fixed:
        report.run("fixed_fields", lambda: fixed_result(context, tally))
    for check in context.variable_checks() if tally is not None else []:
        report.run(check, lambda check=check: variable_result(context, tally, check))
    if tally is not None and tally.decoders:
        report.run("image_decoder", lambda: decoder_result(spec.name, tally.decoders, indices))
    try:
        _record_digests(beton, leaves, result)
    except Exception as exc:  # noqa: BLE001 - a digest that cannot be computed is a failed check, reported
        report.check("content_digest", False, f"computing the content digest failed: {type(exc).__name__}: {exc}")
    if parts:
        report.run("parts", lambda: _parts_result(parts, part_leaves, beton.num_samples))
    if compared is not None:
        compared(report.ok)
    if loader is None:
        report.check(
            "loader_batch",
            False,
            "not run: the structural checks failed, and ffcv's Loader reads "
            "pointers without bounds checks (it could crash on this file)",
        )
    else:
        report.run("loader_batch", loader.result)


class _Answered:
    """The write job's Loader batch, where the Future of a batch run here would be: its answer holds
    for this file when the file's SHA-256 (``file_hash``) is the one the write job took."""

    def __init__(self, batch: dict[str, Any], file_hash: Future):
        self.batch, self.file_hash = batch, file_hash

    def result(self) -> tuple[bool, str]:
        if self.file_hash.result() != self.batch["sha256"]:
            return False, (
                "the file changed since the write job read it through ffcv.Loader (its SHA-256 differs); "
                "rewrite it: `snakemake --forcerun write` for this dataset"
            )
        return True, f"{self.batch['detail']} (run by the write job on this file: the same SHA-256)"


def _without_skipped(
    indices: np.ndarray, skipped: list[SkippedSample], limit: int | None, report: Report
) -> np.ndarray:
    """The rows the file must hold: ``indices`` minus the recorded skipped positions (check
    ``skipped_samples``: each names a planned row and its source index, once, within the limit)."""
    positions = np.array([s.position for s in skipped], dtype=np.int64)
    named = np.array([s.index for s in skipped], dtype=np.int64)
    inside = (positions >= 0) & (positions < len(indices))
    problems = []
    if not inside.all():
        problems.append(f"positions {positions[~inside][:5].tolist()} are not rows of this write")
    elif (indices[positions] != named).any():
        wrong = np.flatnonzero(indices[positions] != named)[:5]
        problems.append(f"rows {positions[wrong].tolist()} hold other source indices than the record names")
    if len(np.unique(positions)) != len(positions):
        problems.append("a position is recorded twice")
    if limit is not None and len(skipped) > limit:
        problems.append(f"{len(skipped)} recorded, more than bad_samples.max allows ({limit})")
    report.check(
        "skipped_samples",
        not problems,
        "; ".join(problems)
        if problems
        else f"{len(skipped)} of {len(indices)} planned samples skipped as recorded; the rest is compared",
        count=len(skipped),
    )
    return np.delete(indices, positions[inside]) if not problems else indices


def check_build(spec: DatasetSpec, writer_build: dict | None, reader_build: dict, report: Report) -> None:
    if writer_build is None:
        report.check("same_ffcv_build", False, "no record of the writer's ffcv build")
        return
    diffs = build_differences(writer_build, reader_build)
    report.check(
        "same_ffcv_build",
        not diffs,
        "writer and reader use the same ffcv build"
        if not diffs
        else "the file was written by another ffcv build (" + "; ".join(diffs) + "); rewrite the files with "
        "`snakemake --forcerun smoke write write_part --cores 32 all` (only dataset "
        f"'{spec.name}': its results/{spec.name}/smoke.verify.json and results/{spec.name}/{spec.name}.verify.json "
        "as the targets; or the software-env trigger under --sdm conda)",
    )


def _finish(result: dict, report: Report) -> dict:
    result["ok"] = report.ok
    result["worst"] = report.worst()
    return result


def _parts_result(parts: list[dict], futures: list, num_samples: int) -> tuple[bool, str, dict]:
    """Every sample of the merged file belongs to one part, and holds what that part held when verified."""
    covered = [(p["start"], p["stop"]) for p in parts]
    contiguous = (
        covered[0][0] == 0 and covered[-1][1] == num_samples and all(a[1] == b[0] for a, b in zip(covered, covered[1:]))
    )
    differing = [
        p["index"]
        for p, leaves in zip(parts, futures)
        if range_from_leaves([f.result() for f in leaves]) != p["range_digest"]
    ]
    if not contiguous:
        return False, f"the parts cover rows {covered}, not 0..{num_samples} in order", {}
    if differing:
        return (
            False,
            (
                f"the rows of part(s) {differing} differ from the part files verified in full "
                f"(results/{{ds}}/parts/{{i}}.verify.json)"
            ),
            {"differing": differing},
        )
    return (
        True,
        (
            f"rows of every one of the {len(parts)} parts hold exactly the content of that part's file, "
            "which was verified in full against its source"
        ),
        {"parts": len(parts)},
    )


def _submit_leaves(pool: ThreadPoolExecutor, beton: BetonFile, start: int, stop: int) -> list[Future]:
    """The digest leaves of samples [start, stop), one pool task per block (betonbuild.beton.digest)."""
    return [pool.submit(leaf_releasing, beton, k, a, b) for k, (a, b) in enumerate(blocks(start, stop))]


def _record_digests(beton: BetonFile, futures: list[Future], result: dict) -> None:
    """The content digest (a value: the samples' content, independent of page layout and worker
    count), and from the same leaves the whole file's range digest: what a part's report records
    (``range_digest(part, 0, n)``), so that nothing hashes the file a second time."""
    leaves = [f.result() for f in futures]
    result["content_digest"] = content_from_leaves(beton, leaves)
    result["range_digest"] = range_from_leaves(leaves)
