"""The read-back report: proves a .beton holds its source's data, written by this ffcv build.

Every report has the structural checks (``beton.structural_checks``), the fixed-size fields of
EVERY sample (vectorised over a memmap of the file), the variable-size and custom fields of every
sample (``mode: full``) or of a seeded sample of them (``mode: sample``), a content digest, one
batch through the real ``ffcv.Loader``, and the writer's vs the reader's ffcv build. The content
comparisons run on a thread pool over chunks of rows (cv2, numpy and hashlib release the GIL).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from dataclasses import field as dc_field
from functools import lru_cache
from typing import Any

import numpy as np

from betonbuild.beton.checks import structural_checks
from betonbuild.beton.digest import blocks, content_from_leaves, leaf, range_from_leaves
from betonbuild.beton.format import IMAGE_MODE_RAW, BetonFile
from betonbuild.beton.payloads import MAX_DECODED_PIXELS, decode_image, decode_json, jpeg_dimensions
from betonbuild.config.load import spec_from_dict
from betonbuild.config.spec import DatasetSpec
from betonbuild.errors import BetonbuildError, BetonFormatError
from betonbuild.fields import TYPE_IDS, custom
from betonbuild.provenance import build_differences, ffcv_build
from betonbuild.sources import sha256_file, source_class
from betonbuild.write.contract import check_sample, check_value

CHUNK_ROWS = 4096  # rows compared at once: bounds the memory of the vectorised comparison
MIN_TASK_ROWS, MAX_TASK_ROWS = 16, 256  # rows per pool task when every row is decoded
LOADER_JPEG_MEAN_ERROR = 4.0  # two JPEG decoders of one file; a different image differs by ~50+
MAX_PROBLEMS = 5
BYTES_LOADER_NOTE = (
    "ffcv's BytesDecoder pads every item of a batch to the batch's largest item; the exact length of "
    "sample i is the field's metadata size: ffcv.reader.Reader(path).metadata['{column}']['size'][i]"
)


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


def resolve_mode(spec: DatasetSpec, num_rows: int, every_variable_sample: bool = False) -> str:
    """full or sample: ``verify.mode``, where auto means full up to ``verify.full_max_samples`` samples."""
    if every_variable_sample:
        return "full"
    mode = spec.verify.get("mode", "auto")
    if mode == "auto":
        return "full" if num_rows <= int(spec.verify.get("full_max_samples", 100_000)) else "sample"
    return mode


def verify_beton(
    spec: DatasetSpec,
    source,
    rows: np.ndarray,
    path: str,
    writer_build: dict | None,
    every_variable_sample: bool = False,
    threads: int = 1,
    parts: list[dict] | None = None,
    loader: LoaderProcess | None = None,
) -> dict[str, Any]:
    """``rows[i]`` is the source index that sample i of ``path`` must hold.

    ``every_variable_sample`` (the smoke gate, a part) forces full mode. ``threads`` is the pool size.
    ``parts`` (a merged file): ``{index, start, stop, range_digest}`` of part files that were each
    verified in full; the file must hold exactly their content at those rows (check ``parts``), and
    with ``mode: auto`` its own comparison with the source is then a seeded sample.
    ``loader``: what ``start_loader_process(spec)`` returned, if the caller started it earlier (it
    is then already importing ffcv); verify_beton starts one itself otherwise, and ends it either way.
    """
    started = time.monotonic()
    threads = max(1, int(threads or 1))
    mode = resolve_mode(spec, len(rows), every_variable_sample)
    if parts and spec.verify.get("mode", "auto") == "auto":
        mode = "sample"
    report = Report()
    reader_build = ffcv_build()
    result: dict[str, Any] = {
        "dataset": spec.name,
        "file": {"path": path, "bytes": os.path.getsize(path), "sha256": None},
        "ok": False,
        "mode": mode,
        "threads": threads,
        "num_samples": {"expected": int(len(rows)), "found": None},
        "fields": [],
        "content_digest": None,
        "range_digest": None,
        "checks": report.checks,
        "provenance": {"writer": writer_build, "reader": reader_build},
        "config": spec.to_dict(),
    }
    loader = loader or start_loader_process(spec, threads)
    with ThreadPoolExecutor(threads) as pool:
        file_hash = pool.submit(sha256_file, path)
        try:
            _verify_file(spec, source, rows, path, mode, pool, threads, report, result, parts, loader)
        finally:
            result["file"]["sha256"] = file_hash.result()
            if loader is not None:
                loader.close()
    _check_build(spec, writer_build, reader_build, report)
    result["seconds"] = round(time.monotonic() - started, 3)
    return _finish(result, report)


def _verify_file(
    spec: DatasetSpec,
    source,
    rows: np.ndarray,
    path: str,
    mode: str,
    pool: ThreadPoolExecutor,
    threads: int,
    report: Report,
    result: dict,
    parts: list[dict] | None,
    child: LoaderProcess | None,
) -> None:
    try:
        beton = BetonFile(path, custom_handlers=custom.handlers(spec))
    except BetonbuildError as exc:
        report.check("format", False, str(exc))
        return
    result["num_samples"]["found"] = beton.num_samples
    result["fields"] = [{"name": f.name, "type": f.type_name, "type_id": f.type_id} for f in beton.fields]
    report.check("format_version", beton.version == 2, f"version {beton.version}, page size {beton.page_size}")
    if not report.check(
        "num_samples", beton.num_samples == len(rows), f"file has {beton.num_samples}, expected {len(rows)}"
    ):
        return
    if not report.run("fields", lambda: _check_fields(beton, spec)):
        return
    allow_empty = tuple(f.name for f in spec.fields if f.type == "bytes" and f.options.get("allow_empty"))
    structure_ok = report.run("allocations", lambda: _check_structure(beton, allow_empty))
    _load_decoders()
    # ffcv's Loader does not bounds-check, so it only reads a file whose structure is sound.
    # Importing ffcv (torch) and numba's compilation are ~2 s of one core that hold the GIL: in a
    # thread they would starve the row threads, which need the GIL between decodes. When the rows
    # need none of ffcv's modules, the child process (``start_loader_process``) runs the Loader
    # batch meanwhile, and this one never imports ffcv.
    if child is None:
        _import_ffcv()  # here, before the pool runs: the comparisons or the Loader batch need ffcv's modules
        loader = pool.submit(_check_loader_batch, beton, spec) if structure_ok else None
    else:
        loader = child.request(path, spec) if structure_ok else None
    # The block hashes of the content digest first (short tasks), then the row chunks.
    leaves = _submit_leaves(pool, beton, 0, beton.num_samples)
    part_leaves = [_submit_leaves(pool, beton, p["start"], p["stop"]) for p in parts or []]
    context = _Context.build(beton, spec, source, rows, mode, threads)
    try:
        tally = _run_content(context, pool)
    except Exception as exc:  # noqa: BLE001 - a comparison that crashes is a failed check, reported
        report.check("content", False, f"comparing the file with its source failed: {type(exc).__name__}: {exc}")
        tally = None
    if tally is not None and context.fixed:
        report.run("fixed_fields", lambda: _fixed_result(context, tally))
    if tally is not None and any(f.type != "custom" for _, f in context.variable):
        report.run("variable_fields", lambda: _variable_result(context, tally, custom_fields=False))
    if tally is not None and any(f.type == "custom" for _, f in context.variable):
        report.run("custom_fields", lambda: _variable_result(context, tally, custom_fields=True))
    report.run("content_digest", lambda: _digest_result(beton, leaves, result))
    if parts:
        report.run("parts", lambda: _parts_result(parts, part_leaves, beton.num_samples))
    if loader is None:
        report.check(
            "loader_batch",
            False,
            "not run: the structural checks failed, and ffcv's Loader reads "
            "pointers without bounds checks (it could crash on this file)",
        )
    else:
        report.run("loader_batch", loader.result)


def _check_build(spec: DatasetSpec, writer_build: dict | None, reader_build: dict, report: Report) -> None:
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
    """Every row of the merged file belongs to one part, and holds what that part held when verified."""
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
    return [pool.submit(leaf, beton, a, b) for a, b in blocks(start, stop)]


def _digest_result(beton: BetonFile, futures: list[Future], result: dict) -> tuple[bool, str]:
    """The content digest, and from the same leaves the whole file's range digest: what a part's
    report records (``range_digest(part, 0, n)``), so that nothing hashes the file a second time."""
    leaves = [f.result() for f in futures]
    digest = content_from_leaves(beton, leaves)
    result["content_digest"] = digest
    result["range_digest"] = range_from_leaves(leaves)
    return True, f"sha256 {digest} over the samples' content (independent of page layout and worker count)"


# --- header-level checks ---------------------------------------------------------------------------


def _check_fields(beton: BetonFile, spec: DatasetSpec) -> tuple[bool, str, dict]:
    expected = [(f.name, TYPE_IDS[f.type]) for f in spec.fields]
    found = [(f.name, f.type_id) for f in beton.fields]
    arguments = {f.name: f.describe_arguments() for f in beton.fields if f.describe_arguments()}
    if found != expected:
        return False, f"file has {found}, config says {expected}", {"arguments": arguments}
    problems = []
    for field, info in zip(spec.fields, beton.fields):
        if field.type in ("ndarray", "torch_tensor"):
            from betonbuild.fields import sample_dtype

            want = (sample_dtype(field), tuple(field.options["shape"]))
            if (info.dtype, info.shape) != want:
                problems.append(
                    f"field '{field.name}' stores {info.dtype}{list(info.shape)}, config says {want[0]}{list(want[1])}"
                )
        elif field.type == "custom":
            if info.arguments != custom.argument_bytes(custom.build(field)):
                problems.append(
                    f"field '{field.name}': the descriptor's arguments differ from "
                    f"{field.options['class']}(**{field.options['args']!r}).to_binary()"
                )
    detail = "; ".join(problems) or f"{len(found)} fields in config order with ffcv type ids {[t for _, t in found]}"
    return not problems, detail, {"arguments": arguments}


def _check_structure(beton: BetonFile, allow_empty: tuple[str, ...]) -> tuple[bool, str, dict]:
    checks = structural_checks(beton, allow_empty)
    failed = [c for c in checks if not c["ok"]]
    flagged = [c for c in checks if c["ok"] and c.get("flagged")]
    if failed:
        detail = "; ".join(f"{c['name']}: {c['detail']}" for c in failed)
    else:
        detail = (
            f"{len(beton.alloc_table)} allocations inside the page-aligned data region, one page each, "
            "no overlap, each sample on one page, every metadata pointer an allocation of its sample"
        )
        detail += "".join(f"; flagged: {c['detail']}" for c in flagged)
    return not failed, detail, {"structure": checks}


# --- content: fixed and variable fields ------------------------------------------------------------


@dataclass
class _Context:
    beton: BetonFile
    spec: DatasetSpec
    source: Any
    rows: np.ndarray
    mode: str
    fixed: list[tuple[int, Any]]
    variable: list[tuple[int, Any]]  # rgb_image, bytes, json and custom fields
    columns: dict[str, Any]  # fixed-field values read vectorised from the source
    selected: np.ndarray  # rows whose variable fields are compared
    task_rows: int
    tolerance: float
    instances: dict[str, Any]

    @classmethod
    def build(cls, beton, spec, source, rows, mode, threads) -> _Context:
        fixed = [(i, f) for i, f in enumerate(spec.fields) if f.is_fixed_size]
        variable = [(i, f) for i, f in enumerate(spec.fields) if not f.is_fixed_size]
        selected = np.zeros(len(rows), dtype=bool)
        if variable:
            selected[_sampled_rows(spec, len(rows), mode == "full")] = True
        heavy = variable and mode == "full"
        task_rows = int(np.clip(len(rows) // (threads * 8), MIN_TASK_ROWS, MAX_TASK_ROWS)) if heavy else CHUNK_ROWS
        return cls(
            beton,
            spec,
            source,
            rows,
            mode,
            fixed,
            variable,
            source.fixed_columns(),
            selected,
            task_rows,
            float(spec.verify["jpeg_mean_abs_error"]),
            {f.name: custom.build(f) for f in spec.fields if f.type == "custom"},
        )


def _sampled_rows(spec: DatasetSpec, n_rows: int, every: bool) -> np.ndarray:
    k = n_rows if every else min(spec.verify["samples"], n_rows)
    if k == n_rows:
        return np.arange(n_rows)
    return np.sort(np.random.default_rng(spec.writer.seed).choice(n_rows, size=k, replace=False))


@dataclass
class _Tally:
    """What one chunk of rows found; tallies of all chunks are merged in row order."""

    images: dict[str, _StoredImages] = dc_field(default_factory=dict)  # this chunk's stored images
    jpeg: _TurboJPEG | None = None  # this chunk's (so this thread's) source JPEG decoder
    fixed: dict[str, list[int]] = dc_field(default_factory=dict)  # name -> [compared, mismatches, first]
    variable: dict[str, dict[str, Any]] = dc_field(default_factory=dict)
    problems: list[tuple[int, str, str]] = dc_field(default_factory=list)  # (row, field, text)

    def stats(self, name: str) -> dict[str, Any]:
        return self.variable.setdefault(name, {"compared": 0, "mismatches": 0})

    def problem(self, row: int, field: str, text: str) -> None:
        if len(self.problems) < MAX_PROBLEMS * 4:
            self.problems.append((row, field, text))

    def merge(self, other: _Tally) -> None:
        for name, (compared, mismatches, first) in other.fixed.items():
            mine = self.fixed.setdefault(name, [0, 0, -1])
            mine[0] += compared
            mine[1] += mismatches
            if mine[2] < 0:
                mine[2] = first
        for name, theirs in other.variable.items():
            mine = self.stats(name)
            for key, value in theirs.items():
                if key.endswith("_max"):
                    mine[key] = max(mine.get(key, value), value)
                else:
                    mine[key] = mine.get(key, 0) + value
        self.problems.extend(other.problems)


def _run_content(ctx: _Context, pool: ThreadPoolExecutor) -> _Tally:
    starts = range(0, len(ctx.rows), ctx.task_rows)
    futures = [pool.submit(_compare_chunk, ctx, s, min(s + ctx.task_rows, len(ctx.rows))) for s in starts]
    total = _Tally()
    for future in futures:
        total.merge(future.result())
    return total


def _compare_chunk(ctx: _Context, start: int, stop: int) -> _Tally:
    tally = _Tally(
        images={
            f.name: _StoredImages(ctx.beton, f.name, start, stop) for _, f in ctx.variable if f.type == "rgb_image"
        },
        jpeg=_TurboJPEG(),
    )
    try:
        return _compare_rows(ctx, start, stop, tally)
    finally:
        tally.jpeg.close()


def _compare_rows(ctx: _Context, start: int, stop: int, tally: _Tally) -> _Tally:
    positions = np.arange(start, stop)
    fetched_fixed = [(i, f) for i, f in ctx.fixed if f.name not in ctx.columns]
    expected: dict[str, list] = {f.name: [] for _, f in fetched_fixed}
    failed: list[int] = []
    to_visit = positions if fetched_fixed else positions[ctx.selected[start:stop]]
    for pos in to_visit:
        pos = int(pos)
        index = int(ctx.rows[pos])
        selected = bool(ctx.selected[pos])
        if not fetched_fixed and selected and _fast_image_rows(ctx, pos, index, tally):
            continue
        try:
            sample = check_sample(ctx.spec, ctx.source[index], index)
        except Exception as exc:  # noqa: BLE001 - a source that changed or fails now is a finding
            failed.append(pos)
            for _, f in fetched_fixed:
                expected[f.name].append(None)
            tally.problem(pos, "", f"reading source index {index} failed: {type(exc).__name__}: {exc}")
            if selected:
                for _, f in ctx.variable:
                    _count(tally.stats(f.name), mismatch=True)
            continue
        for i, f in fetched_fixed:
            value = sample[i]
            expected[f.name].append(value.numpy() if hasattr(value, "numpy") else value)
        if selected:
            _compare_variable_row(ctx, pos, index, sample, tally)
    _compare_fixed(ctx, positions, expected, failed, tally)
    return tally


def _count(stats: dict, mismatch: bool) -> None:
    stats["compared"] += 1
    stats["mismatches"] += int(mismatch)


def _compare_fixed(
    ctx: _Context, positions: np.ndarray, fetched: dict[str, list], failed: list[int], tally: _Tally
) -> None:
    beton = ctx.beton
    failed_set = set(failed)
    for _, field in ctx.fixed:
        if field.type in ("int", "float"):
            found = np.asarray(beton.metadata[field.name][positions])
        else:
            try:
                found = beton.ndarray_column(field.name, positions)
            except BetonFormatError as exc:
                tally.fixed[field.name] = [len(positions), len(positions), int(positions[0])]
                tally.problem(int(positions[0]), field.name, str(exc))
                continue
        if field.name in ctx.columns:
            want = np.asarray(ctx.columns[field.name][ctx.rows[positions]])
        else:
            values = [found[k] if v is None else v for k, v in enumerate(fetched[field.name])]
            want = np.asarray(values) if field.type in ("int", "float") else np.stack(values) if values else found[:0]
        if field.type in ("int", "float"):
            want = want.astype(found.dtype)
        bad = set(_mismatching_rows(found, want).tolist()) | {
            k for k, p in enumerate(positions) if int(p) in failed_set
        }
        first = int(positions[min(bad)]) if bad else -1
        tally.fixed[field.name] = [len(positions), len(bad), first]
        if bad:
            tally.problem(first, field.name, f"differs from source index {int(ctx.rows[first])}")


def _mismatching_rows(found: np.ndarray, expected: np.ndarray) -> np.ndarray:
    if found.shape != expected.shape:
        return np.arange(len(found))
    found_flat = found.reshape(len(found), -1)
    expected_flat = expected.reshape(len(expected), -1)
    differ = found_flat != expected_flat
    if np.issubdtype(found.dtype, np.floating):
        differ &= ~(np.isnan(found_flat) & np.isnan(expected_flat))
    return np.flatnonzero(differ.any(axis=1))


def expected_image(field, image: np.ndarray) -> np.ndarray:
    """What ffcv stores for a source image: resized (INTER_AREA, never upscaled) to max_resolution."""
    if field.options["max_resolution"] is None:
        return image  # what ffcv's resizer returns then (and it needs no import of ffcv)
    from ffcv.fields.rgb_image import resizer

    return resizer(image, field.options["max_resolution"])


def _compare_variable_row(ctx: _Context, pos: int, index: int, sample: tuple, tally: _Tally) -> None:
    allocations = None
    consumed = 0
    for position, field in ctx.variable:
        stats = tally.stats(field.name)
        try:
            if field.type == "custom":
                if allocations is None:
                    allocations = ctx.beton.custom_allocations(pos)
                problem, used = _compare_custom(ctx, field, pos, sample[position], allocations[consumed:], stats)
                consumed += used
            elif field.type == "rgb_image":
                problem = _compare_image(
                    ctx, tally.images[field.name], pos, expected_image(field, sample[position]), stats
                )
            else:
                problem = _compare_payload(ctx.beton, field, pos, sample[position], stats)
        except Exception as exc:  # noqa: BLE001 - a value that cannot be compared is a finding about that value
            problem = str(exc) if isinstance(exc, BetonFormatError) else f"{type(exc).__name__}: {exc}"
        _count(stats, mismatch=problem is not None)
        if problem:
            tally.problem(pos, field.name, f"(source index {index}): {problem}")


def _compare_payload(beton: BetonFile, field, row: int, value, stats: dict) -> str | None:
    if field.type == "bytes":
        stored = np.asarray(beton.variable_payload(field.name, row))
        if stored.size != value.size:
            return f"stored length {stored.size}, source length {value.size}"
        stats["lengths_equal"] = stats.get("lengths_equal", 0) + 1
        return None if np.array_equal(stored, value) else "bytes differ"
    stored = decode_json(beton.variable_payload(field.name, row))
    return None if stored == json.loads(json.dumps(value)) else f"stored {stored!r} != source"


class _StoredImages:
    """One chunk's stored images of one field, decoded the way ffcv's Loader decodes them.

    JPEGs go through ffcv's own libjpeg-turbo call (fast DCT, RGB out, GIL released), so the
    reported pixel error is the error a Loader user gets; should it refuse a payload, cv2 decides.
    Pointers, sizes and the JPEG's own dimensions are checked first, as ``beton.decode_image`` does.
    """

    def __init__(self, beton: BetonFile, name: str, start: int, stop: int):
        self.beton, self.name, self.start = beton, name, start
        meta = beton.metadata[name][start:stop]
        self.mode, self.width, self.height, self.ptr = (
            meta[k].tolist() for k in ("mode", "width", "height", "data_ptr")
        )
        self.size = beton.image_sizes(name, np.arange(start, stop)).tolist()
        self.out = np.empty((0, 0, 3), dtype=np.uint8)  # reused: decode overwrites what it last returned

    def is_raw(self, row: int) -> bool:
        return self.mode[row - self.start] == IMAGE_MODE_RAW

    def decode(self, row: int) -> np.ndarray:
        """The image of ``row``; a JPEG is decoded into this chunk's one output array (a fresh
        196 KiB array per image costs page faults), so the result is valid until the next call."""
        k = row - self.start
        size, mode, width, height = self.size[k], self.mode[k], self.width[k], self.height[k]
        if size < 0:
            return decode_image(self.beton, self.name, row)  # raises the precise format error
        payload = self.beton.read(self.ptr[k], size)
        if mode == IMAGE_MODE_RAW:
            return np.asarray(payload).reshape(height, width, 3)
        if width * height > MAX_DECODED_PIXELS or _jpeg_dimensions(payload) != (width, height):
            return decode_image(self.beton, self.name, row)
        if self.out.shape != (height, width, 3):
            self.out = np.empty((height, width, 3), dtype=np.uint8)
        out = self.out
        if _ffcv_imdecode(payload, out, height, width) != 0:
            return decode_image(self.beton, self.name, row)
        return out


def _jpeg_dimensions(payload: np.ndarray) -> tuple[int, int] | None:
    """``beton.jpeg_dimensions``, parsing the first 4 KiB (where the SOF marker is) before it copies
    the whole payload: the parse is sequential, so a header found in the prefix is the same."""
    return jpeg_dimensions(payload[:4096]) or (jpeg_dimensions(payload) if payload.size > 4096 else None)


def _ffcv_imdecode(payload: np.ndarray, out: np.ndarray, height: int, width: int) -> int:
    """``ffcv.libffcv.imdecode(payload, out, height, width, height, width, 0, 0, 1, 1, False, False)``:
    the same C function of ffcv's compiled library, with the same arguments (no crop, no flip: one
    tjDecompress2 with TJFLAG_FASTDCT), called without importing the ffcv package."""
    lib = _libffcv()
    if lib is None:
        return -1
    return lib.imdecode(
        payload.ctypes.data, payload.size, height, width, out.ctypes.data, height, width, 0, 0, 1, 1, False, False
    )


def _compare_image(ctx: _Context, images: _StoredImages, row: int, expected: np.ndarray, stats: dict) -> str | None:
    import cv2

    found = images.decode(row)
    if found.shape != expected.shape:
        return f"image shape {found.shape}, expected {expected.shape}"
    if images.is_raw(row):
        stats["raw"] = stats.get("raw", 0) + 1
        return None if np.array_equal(found, expected) else "raw image pixels differ"
    expected = np.ascontiguousarray(expected)
    mean = cv2.norm(found, expected, cv2.NORM_L1) / max(found.size, 1)
    worst = int(cv2.norm(found, expected, cv2.NORM_INF))
    stats["jpeg"] = stats.get("jpeg", 0) + 1
    stats["jpeg_mean_abs_error_sum"] = stats.get("jpeg_mean_abs_error_sum", 0.0) + mean
    stats["jpeg_mean_abs_error_max"] = max(stats.get("jpeg_mean_abs_error_max", 0.0), round(mean, 3))
    stats["jpeg_max_abs_error_max"] = max(stats.get("jpeg_max_abs_error_max", 0), worst)
    if mean > ctx.tolerance:
        return f"JPEG mean absolute pixel error {mean:.2f} exceeds the tolerance {ctx.tolerance}"
    return None


def _content_without_ffcv(spec: DatasetSpec) -> bool:
    """Whether comparing the rows needs neither ffcv's nor torch's modules, so that the Loader batch
    can run in a child process (``start_loader_process``) and this one import neither. Custom field
    classes are ffcv Fields, torch_tensor values need torch, ``max_resolution`` needs ffcv's resizer;
    a ``python`` source may import anything. (Reading shards imports webdataset, and so torch, but
    not ffcv: the Loader's import and numba compile still move to the other core.)"""
    if source_class(spec).may_import_ffcv:
        return False
    return not any(
        f.type in ("custom", "torch_tensor") or (f.type == "rgb_image" and f.options["max_resolution"] is not None)
        for f in spec.fields
    )


def _load_decoders() -> None:
    """The decoders' libraries, loaded once by the main thread before the pool uses them."""
    _libffcv()
    _turbojpeg()
    _cv2_rgb_flag()


def _import_ffcv() -> None:
    """ffcv's modules import each other in cycles: importing them from two threads at once fails
    ("partially initialized module"), so the main thread imports all of them before the pool starts."""
    import ffcv.fields.basics  # noqa: F401
    import ffcv.fields.bytes  # noqa: F401
    import ffcv.fields.decoders  # noqa: F401
    import ffcv.fields.json  # noqa: F401
    import ffcv.fields.ndarray  # noqa: F401
    import ffcv.fields.rgb_image  # noqa: F401
    import ffcv.libffcv  # noqa: F401
    import ffcv.loader  # noqa: F401


class _TurboJPEG:
    """libjpeg-turbo's default decode (integer IDCT, fancy upsampling: what PIL and cv2 do), via the
    libturbojpeg that ffcv itself links against; one handle per chunk, so per thread.
    ``decode_rgb`` returns None for anything it does not handle (CMYK, warnings, no library).
    """

    def __init__(self):
        self.lib = _turbojpeg()
        self.handle = self.lib.tjInitDecompress() if self.lib is not None else None
        self.out: np.ndarray | None = None

    def decode_rgb(self, data: np.ndarray, reuse: bool = False) -> np.ndarray | None:
        """The RGB pixels; with ``reuse``, in this decoder's one output array (valid until the next call)."""
        import ctypes

        if not self.handle:
            return None
        width, height, subsampling, colorspace = (ctypes.c_int() for _ in range(4))
        if self.lib.tjDecompressHeader3(
            self.handle,
            data.ctypes.data,
            data.size,
            ctypes.byref(width),
            ctypes.byref(height),
            ctypes.byref(subsampling),
            ctypes.byref(colorspace),
        ):
            return None
        if colorspace.value not in (0, 1, 2) or not 0 < width.value * height.value <= MAX_DECODED_PIXELS:
            return None  # CMYK / YCCK: the writer's path decides
        shape = (height.value, width.value, 3)
        out = self.out if reuse and self.out is not None and self.out.shape == shape else np.empty(shape, np.uint8)
        if reuse:
            self.out = out
        if self.lib.tjDecompress2(
            self.handle, data.ctypes.data, data.size, out.ctypes.data, width.value, 0, height.value, 0, 0
        ):  # pixel format 0 = RGB, flags 0 = the library defaults
            return None
        return out

    def close(self) -> None:
        if self.handle:
            self.lib.tjDestroy(self.handle)
            self.handle = None


@lru_cache(maxsize=1)
def _libffcv():
    """ffcv's compiled extension through ctypes, as ``ffcv.libffcv`` loads it (``CDLL(_libffcv.__file__)``),
    found without importing the ffcv package (which imports torch: ~1 s of one core); None if absent."""
    import ctypes
    import glob
    import importlib.util

    found = importlib.util.find_spec("ffcv")
    if found is None or not found.submodule_search_locations:
        return None
    paths = sorted(glob.glob(os.path.join(list(found.submodule_search_locations)[0], "_libffcv*.so")))
    try:
        lib = ctypes.CDLL(paths[0])
    except (IndexError, OSError):
        return None
    c = ctypes
    lib.imdecode.argtypes = [
        c.c_void_p,
        c.c_uint64,
        c.c_uint32,
        c.c_uint32,
        c.c_void_p,
        c.c_uint32,
        c.c_uint32,
        c.c_uint32,
        c.c_uint32,
        c.c_uint32,
        c.c_uint32,
        c.c_bool,
        c.c_bool,
    ]  # as ffcv.libffcv
    lib.imdecode.restype = c.c_int
    return lib


@lru_cache(maxsize=1)
def _turbojpeg():
    import ctypes

    if _libffcv() is None:  # loading it loads the libturbojpeg that _libffcv links against
        return None
    try:
        lib = ctypes.CDLL("libturbojpeg.so.0")
    except OSError:
        return None
    lib.tjInitDecompress.restype = ctypes.c_void_p
    lib.tjDestroy.argtypes = [ctypes.c_void_p]
    int_p = ctypes.POINTER(ctypes.c_int)
    lib.tjDecompressHeader3.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ulong, int_p, int_p, int_p, int_p]
    lib.tjDecompress2.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_ulong,
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
    ]
    return lib


@lru_cache(maxsize=1)
def _cv2_rgb_flag() -> int:
    import cv2

    return getattr(cv2, "IMREAD_COLOR_RGB", cv2.IMREAD_COLOR)  # OpenCV >= 4.10 decodes straight to RGB


def _fast_image_rows(ctx: _Context, pos: int, index: int, tally: _Tally) -> bool:
    """Image folder: the source file decoded by libjpeg-turbo directly (JPEG) or cv2, and compared.

    Both decode with the same integer IDCT and upsampling as PIL, 1.5-3x faster. Only a comparison
    that passes counts: any other outcome returns False and the row goes through the writer's own
    path (PIL and the sample contract), which decides.
    """
    data = ctx.source.encoded_image(index)
    if data is None:
        return False
    import cv2

    field = ctx.variable[0][1]
    try:
        rgb = tally.jpeg.decode_rgb(data, reuse=True) if data[:2].tobytes() == b"\xff\xd8" else None
        if rgb is None and data.size:
            rgb = cv2.imdecode(data, _cv2_rgb_flag() | cv2.IMREAD_IGNORE_ORIENTATION)
            if rgb is not None and rgb.ndim == 3 and _cv2_rgb_flag() == cv2.IMREAD_COLOR:
                rgb = cv2.cvtColor(rgb, cv2.COLOR_BGR2RGB)
    except (OSError, cv2.error):
        rgb = None
    if rgb is None or rgb.ndim != 3:
        return False
    scratch: dict[str, Any] = {"compared": 0, "mismatches": 0}
    try:
        check_value(ctx.spec.name, field, rgb, index)  # the same size limits the writer applied
        problem = _compare_image(ctx, tally.images[field.name], pos, expected_image(field, rgb), scratch)
    except BetonbuildError:
        return False
    if problem:
        return False
    stats = tally.stats(field.name)
    for key, value in scratch.items():
        if key.endswith("_max"):
            stats[key] = max(stats.get(key, value), value)
        elif key not in ("compared", "mismatches"):
            stats[key] = stats.get(key, 0) + value
    stats["source_decoded_fast"] = stats.get("source_decoded_fast", 0) + 1
    _count(stats, mismatch=False)
    return True


def _compare_custom(
    ctx: _Context, field, row: int, value, allocations: list[tuple[int, int]], stats: dict
) -> tuple[str | None, int]:
    """Re-encodes the source value and requires the file's record and payload bytes; then ``decode``."""
    beton = ctx.beton
    instance = ctx.instances[field.name]
    record, payloads = custom.encode(instance, value, [p for p, _ in allocations])
    if record != beton.record_bytes(field.name, row):
        return "the metadata record differs from the re-encoded source value", len(payloads)
    if len(payloads) > len(allocations):
        return f"encode allocates {len(payloads)} payloads, the file has {len(allocations)}", len(payloads)
    stored = []
    for j, payload in enumerate(payloads):
        ptr, size = allocations[j]
        if size != payload.size:
            return f"payload {j} is {size} bytes in the file, {payload.size} re-encoded", len(payloads)
        stored.append(np.asarray(beton.read(ptr, size)))
        if not np.array_equal(stored[-1], payload):
            return f"payload {j} differs from the re-encoded source value", len(payloads)
    stats["reencoded_equal"] = stats.get("reencoded_equal", 0) + 1
    if hasattr(instance, "decode"):
        decoded = instance.decode(beton.metadata[field.name][row], stored)
        if not custom.values_equal(decoded, value):
            return f"decodes to {decoded!r}, the source holds {value!r}", len(payloads)
        stats["decoded_equal"] = stats.get("decoded_equal", 0) + 1
    return None, len(payloads)


def _fixed_result(ctx: _Context, tally: _Tally) -> tuple[bool, str, dict]:
    per_field, details = {}, []
    n = len(ctx.rows)
    for _, field in ctx.fixed:
        compared, mismatches, first = tally.fixed[field.name]
        per_field[field.name] = {"compared": compared, "mismatches": mismatches}
        if mismatches:
            why = next(
                (
                    text
                    for row, name, text in sorted(tally.problems)
                    if name == field.name and not text.startswith("differs from")
                ),
                None,
            )
            details.append(
                f"field '{field.name}': {mismatches} of {n} samples differ from the source "
                f"(first: sample {first}, source index {int(ctx.rows[first])})" + (f": {why}" if why else "")
            )
    names = ", ".join(per_field)
    return not details, "; ".join(details) or f"all {n} samples equal the source in {names}", {"fields": per_field}


def _variable_result(ctx: _Context, tally: _Tally, custom_fields: bool) -> tuple[bool, str, dict]:
    fields = [f for _, f in ctx.variable if (f.type == "custom") == custom_fields]
    names = {f.name for f in fields}
    per_field = {}
    for position, field in enumerate(ctx.spec.fields):
        if field.name not in names:
            continue
        stats = dict(tally.stats(field.name))
        if "jpeg_mean_abs_error_sum" in stats:
            stats["jpeg_mean_abs_error_mean"] = round(stats.pop("jpeg_mean_abs_error_sum") / max(stats["jpeg"], 1), 3)
        if field.type == "rgb_image":
            stats["jpeg_tolerance"] = ctx.tolerance
        if field.type == "bytes":
            stats["loader_lengths"] = BYTES_LOADER_NOTE.format(column=f"f{position}")
        if field.type == "custom":
            stats["class"] = field.options["class"]
            stats["comparison"] = "re-encoded source bytes" + (
                " and decoded value" if hasattr(ctx.instances[field.name], "decode") else ""
            )
        per_field[field.name] = stats
    problems = sorted((p for p in tally.problems if p[1] in names or p[1] == ""), key=lambda p: p[0])
    text = [f"field '{f}' sample {row} {what}" if f else f"sample {row}: {what}" for row, f, what in problems]
    failed = any(s["mismatches"] for s in per_field.values())
    which = "every sample" if ctx.mode == "full" else f"{int(ctx.selected.sum())} seeded samples"
    mismatches = sum(s["mismatches"] for s in per_field.values())
    detail = (
        ("; ".join(text[:MAX_PROBLEMS]) or f"{mismatches} mismatches")
        if failed
        else f"{which} of {sorted(names)} equal the source"
    )
    jpeg = [s for s in per_field.values() if s.get("jpeg")]
    if jpeg and not failed:
        detail += (
            f"; JPEG mean absolute error {max(s['jpeg_mean_abs_error_mean'] for s in jpeg)} on average, "
            f"{max(s['jpeg_mean_abs_error_max'] for s in jpeg)} at worst (tolerance {ctx.tolerance}), "
            f"largest pixel error {max(s['jpeg_max_abs_error_max'] for s in jpeg)}"
        )
    return not failed, detail, {"fields": per_field, "rows": "all" if ctx.mode == "full" else int(ctx.selected.sum())}


# --- through the real ffcv.Loader ------------------------------------------------------------------


def start_loader_process(spec: DatasetSpec, threads: int = 2) -> LoaderProcess | None:
    """The child process that will run the Loader batch of ``spec``'s file, started now: it imports
    ffcv meanwhile, then waits for ``request``. None where the comparisons need ffcv's modules
    anyway (``_content_without_ffcv``: the batch then runs on a thread), for a job of one thread
    (a second process would use a core Snakemake did not give it: the parts' verifications run
    side by side), or where no process can start."""
    return LoaderProcess.start() if threads > 1 and _content_without_ffcv(spec) else None


class LoaderProcess:
    """``_check_loader_batch`` in a child process of the same Python, with this one's ``sys.path``
    and working directory. ``request`` sends it the file (once the structural checks allow ffcv's
    Loader to read it), ``result`` waits for its (ok, detail), ``close`` ends it if still running.
    A crash of ffcv's Loader (it reads pointers unchecked) fails the check, not the whole report."""

    def __init__(self, process: subprocess.Popen, stderr):
        self.process, self.stderr, self.answer = process, stderr, None

    @classmethod
    def start(cls) -> LoaderProcess | None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)}
        stderr = tempfile.TemporaryFile()
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", "from betonbuild.verify import _loader_child; _loader_child()"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=env,
            )
        except (OSError, ValueError):
            stderr.close()
            return None
        return cls(process, stderr)

    def request(self, path: str, spec: DatasetSpec) -> LoaderProcess:
        try:
            with self.process.stdin:
                self.process.stdin.write(json.dumps({"path": path, "spec": spec.to_dict()}).encode())
        except BrokenPipeError:
            pass  # it ended already: result() reports how
        self.process.stdin = None  # closed: communicate() must not flush it
        return self

    def result(self) -> tuple[bool, str]:
        if self.answer is None:
            out, _ = self.process.communicate()
            self.stderr.seek(0)
            errors = self.stderr.read().decode(errors="replace").strip()
            try:
                answer = json.loads(out.decode().strip().splitlines()[-1])
                self.answer = bool(answer["ok"]), str(answer["detail"])
            except (ValueError, KeyError, TypeError, IndexError):
                tail = errors.splitlines()[-1] if errors else "no error output"
                self.answer = False, f"ffcv.Loader's process ended with exit code {self.process.returncode}: {tail}"
        return self.answer

    def close(self) -> None:
        """Kills the child unless its answer was read (a report that ended before the Loader batch)."""
        if self.answer is None and self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout, self.stderr):
            if stream is not None:
                stream.close()


def _loader_child() -> None:
    """The child process of ``LoaderProcess``: imports ffcv at once, then reads {path, spec} on stdin
    and prints {ok, detail} (nothing on stdin: it is not needed, and exits)."""
    try:
        _import_ffcv()
        failure = None
    except Exception as exc:  # noqa: BLE001 - reported as the check's failure below
        failure = f"importing ffcv failed: {type(exc).__name__}: {exc}"
    data = sys.stdin.read()
    if not data:
        os._exit(0)
    try:
        if failure:
            raise RuntimeError(failure)
        request = json.loads(data)
        spec = spec_from_dict(request["spec"])
        ok, detail = _check_loader_batch(BetonFile(request["path"], custom_handlers=custom.handlers(spec)), spec)
    except Exception as exc:  # noqa: BLE001 - as Report.run: a check that crashes is a failed check
        ok, detail = False, failure or f"{type(exc).__name__}: {exc}"
    sys.stdout.write("\n" + json.dumps({"ok": bool(ok), "detail": detail}) + "\n")
    sys.stdout.flush()
    os._exit(0)  # skips the interpreter's teardown of torch and numba (~0.1 s): nothing is left to do


def _check_loader_batch(beton: BetonFile, spec: DatasetSpec) -> tuple[bool, str]:
    """One batch through the real ffcv.Loader, compared with what the memmap reader decoded."""
    from ffcv.fields.basics import FloatDecoder, IntDecoder
    from ffcv.fields.bytes import BytesDecoder
    from ffcv.fields.decoders import SimpleRGBImageDecoder
    from ffcv.fields.json import JSONField
    from ffcv.fields.ndarray import NDArrayDecoder
    from ffcv.loader import Loader, OrderOption

    n = min(spec.verify["loader_batch"], beton.num_samples)
    pipelines, skipped = {}, []
    for field in spec.fields:
        if field.type == "int":
            pipelines[field.name] = [IntDecoder()]
        elif field.type == "float":
            pipelines[field.name] = [FloatDecoder()]
        elif field.type in ("ndarray", "torch_tensor"):
            pipelines[field.name] = [NDArrayDecoder()]
        elif field.type in ("bytes", "json"):
            pipelines[field.name] = [BytesDecoder()]
        elif field.type == "rgb_image":
            meta = beton.metadata[field.name][:n]
            if len(np.unique(meta["width"])) == 1 and len(np.unique(meta["height"])) == 1:
                pipelines[field.name] = [SimpleRGBImageDecoder()]
            else:
                pipelines[field.name] = None  # SimpleRGBImageDecoder needs one image size
                skipped.append(field.name)
        # custom fields: the class's own decoder (get_decoder_class), registered below
    loader = Loader(
        beton.path,
        batch_size=n,
        num_workers=1,
        order=OrderOption.SEQUENTIAL,
        indices=list(range(n)),
        pipelines=pipelines,
        drop_last=False,
        custom_fields=custom.handlers(spec),
    )
    batch = next(iter(loader))
    batch = [b.numpy() if hasattr(b, "numpy") else np.asarray(b) for b in batch]
    loaded = dict(zip([f.name for f in spec.fields if pipelines.get(f.name, True) is not None], batch))
    problems, unchecked = [], []
    instances = {f.name: custom.build(f) for f in spec.fields if f.type == "custom"}
    for field in spec.fields:
        if field.name not in loaded:
            continue
        got = loaded[field.name]
        if field.type == "custom" and not (
            hasattr(instances[field.name], "from_loader") and hasattr(instances[field.name], "decode")
        ):
            unchecked.append(field.name)
            continue
        for row in range(n):
            if field.type in ("int", "float"):
                expected = beton.metadata[field.name][row]
                same = got[row].reshape(-1)[0] == expected or (np.isnan(expected) and np.isnan(got[row]).all())
            elif field.type in ("ndarray", "torch_tensor"):
                same = np.array_equal(got[row], beton.ndarray_column(field.name, np.array([row]))[0], equal_nan=True)
            elif field.type == "bytes":
                payload = np.asarray(beton.variable_payload(field.name, row))
                same = np.array_equal(got[row][: payload.size], payload)
            elif field.type == "json":
                same = JSONField.unpack(got[row]) == decode_json(beton.variable_payload(field.name, row))
            elif field.type == "custom":
                instance = instances[field.name]
                payloads = [np.asarray(beton.read(p, s)) for p, s in beton.custom_allocations(row)]
                same = custom.values_equal(
                    instance.from_loader(got[row]), instance.decode(beton.metadata[field.name][row], payloads)
                )
            else:
                # ffcv decodes JPEG with libturbojpeg, we with cv2: their IDCTs differ by about 1 level.
                mine = decode_image(beton, field.name, row).astype(np.int16)
                same = (
                    got[row].shape == mine.shape
                    and np.abs(got[row].astype(np.int16) - mine).mean() < LOADER_JPEG_MEAN_ERROR
                )
            if not same:
                problems.append(f"field '{field.name}' sample {row}: ffcv.Loader and the file disagree")
                break
    detail = "; ".join(problems) or f"ffcv.Loader read {n} samples, equal to the file's decoded content"
    if skipped:
        detail += f" (fields {skipped} skipped: images of several sizes)"
    if unchecked:
        detail += f" (custom fields {unchecked} loaded; their classes have no decode/from_loader to compare)"
    return not problems, detail
