"""The read-back report: proves a .beton holds its source's data, written by this ffcv build.

Fixed-size fields are compared for EVERY sample, vectorised over a memmap of the file; a seeded
sample of variable-size fields (images, bytes, JSON) is decoded and compared; one batch goes
through the real ``ffcv.Loader``; and the writer's ffcv build must be the reader's.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Callable

import numpy as np

from .beton import BetonFile, decode_image, decode_json
from .errors import BetonFormatError
from .fields import TYPE_IDS
from .provenance import build_differences, ffcv_build
from .samples import check_sample
from .sources import ArraysSource, ImageFolderSource
from .spec import DatasetSpec

CHUNK_ROWS = 4096  # rows compared at once: bounds the memory of the vectorised comparison
LOADER_JPEG_MEAN_ERROR = 4.0  # two JPEG decoders of one file; a different image differs by ~50+


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


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_beton(
    spec: DatasetSpec,
    source,
    rows: np.ndarray,
    path: str,
    writer_build: dict | None,
    every_variable_sample: bool = False,
) -> dict[str, Any]:
    """``rows[i]`` is the source index that sample i of ``path`` must hold.

    Variable-size fields are compared on a seeded sample of ``verify.samples`` rows, or on every
    row with ``every_variable_sample`` (the smoke gate).
    """
    report = Report()
    reader_build = ffcv_build()
    result: dict[str, Any] = {
        "dataset": spec.name,
        "file": {"path": path, "bytes": os.path.getsize(path), "sha256": sha256_of(path)},
        "ok": False,
        "num_samples": {"expected": int(len(rows)), "found": None},
        "fields": [],
        "checks": report.checks,
        "provenance": {"writer": writer_build, "reader": reader_build},
    }
    try:
        beton = BetonFile(path)
    except BetonFormatError as exc:
        report.check("format", False, str(exc))
        return _finish(result, report)
    result["num_samples"]["found"] = beton.num_samples
    result["fields"] = [{"name": f.name, "type": f.type_name, "type_id": f.type_id} for f in beton.fields]
    report.check("format_version", beton.version == 2, f"version {beton.version}, page size {beton.page_size}")
    if not report.check(
        "num_samples", beton.num_samples == len(rows), f"file has {beton.num_samples}, expected {len(rows)}"
    ):
        return _finish(result, report)
    expected_fields = [(f.name, TYPE_IDS[f.type]) for f in spec.fields]
    found_fields = [(f.name, f.type_id) for f in beton.fields]
    if not report.check(
        "fields", found_fields == expected_fields, f"file has {found_fields}, config says {expected_fields}"
    ):
        return _finish(result, report)
    report.run("allocations", lambda: _check_allocations(beton, spec))
    fixed = [f for f in spec.fields if f.is_fixed_size]
    if fixed:
        report.run("fixed_fields", lambda: _check_fixed_fields(beton, spec, source, rows))
    variable = [f for f in spec.fields if not f.is_fixed_size]
    if variable:
        report.run("variable_fields", lambda: _check_variable_fields(beton, spec, source, rows, every_variable_sample))
    report.run("loader_batch", lambda: _check_loader_batch(beton, spec, source, rows))
    if writer_build is None:
        report.check("same_ffcv_build", False, "no record of the writer's ffcv build")
    else:
        diffs = build_differences(writer_build, reader_build)
        report.check(
            "same_ffcv_build",
            not diffs,
            "writer and reader use the same ffcv build"
            if not diffs
            else "the file was written by another ffcv build (" + "; ".join(diffs) + "); rebuild it with "
            f"`snakemake --forcerun write` for dataset '{spec.name}' (or the software-env trigger under --sdm conda)",
        )
    return _finish(result, report)


def _finish(result: dict, report: Report) -> dict:
    result["ok"] = report.ok
    result["worst"] = report.worst()
    return result


def _check_allocations(beton: BetonFile, spec: DatasetSpec) -> tuple[bool, str]:
    table = beton.alloc_table
    ptr, size, sample = table["ptr"].astype(np.int64), table["size"].astype(np.int64), table["sample_id"]
    problems = []
    if table.size:
        if ptr.min() < beton.data_start or (ptr + size).max() > beton.alloc_table_ptr:
            problems.append("an allocation lies outside the data region")
        if ((ptr - beton.data_start) // beton.page_size != (ptr + np.maximum(size, 1) - 1 - beton.data_start) // beton.page_size).any():
            problems.append("an allocation crosses a page boundary")
        if (sample >= beton.num_samples).any():
            problems.append("an allocation names a sample id beyond num_samples")
        empty = int((size == 0).sum())
        if empty:
            problems.append(f"{empty} size-0 allocations (ffcv's Loader mis-reads them)")
        by_ptr = np.argsort(ptr, kind="stable")
        overlap = (ptr[by_ptr][1:] < (ptr + size)[by_ptr][:-1]).sum()
        if overlap:
            problems.append(f"{int(overlap)} overlapping allocations")
    missing = _metadata_pointers_missing(beton, ptr, sample)
    if missing:
        problems.append(missing)
    detail = "; ".join(problems) or f"{table.size} allocations inside the data region, one page each, no overlap"
    return not problems, detail


def _metadata_pointers_missing(beton: BetonFile, ptr: np.ndarray, sample: np.ndarray) -> str | None:
    """Every pointer in the metadata must be an allocation of that same sample."""
    order = np.argsort(ptr)
    sorted_ptr, sorted_sample = ptr[order], sample[order]
    rows = np.arange(beton.num_samples)
    for info in beton.fields:
        column = beton.metadata[info.name]
        if info.type_id in (3, 5):
            pointers = column["ptr"].astype(np.int64)
        elif info.type_id == 2:
            pointers = column["data_ptr"].astype(np.int64)
        elif info.type_id in (4, 6):
            pointers = column.astype(np.int64)
        else:
            continue
        at = np.clip(np.searchsorted(sorted_ptr, pointers), 0, max(len(sorted_ptr) - 1, 0))
        if not len(sorted_ptr):
            return f"field '{info.name}': pointers but no allocation table"
        bad = (sorted_ptr[at] != pointers) | (sorted_sample[at] != rows)
        if bad.any():
            row = int(np.argmax(bad))
            return f"field '{info.name}': sample {row}'s pointer {int(pointers[row])} is not its allocation"
    return None


def source_fixed_values(spec: DatasetSpec, source, rows: np.ndarray) -> dict[str, np.ndarray]:
    """The source's values of every fixed-size field for the given source indices.

    Vectorised for array sources and image-folder labels; otherwise one pass over the samples,
    through the same sample contract the writer applied.
    """
    fixed = [f for f in spec.fields if f.is_fixed_size]
    if isinstance(source, ArraysSource):
        by_name = dict(zip(spec.field_names, source.columns))
        return {f.name: by_name[f.name] for f in fixed}  # indexed lazily by the caller, in chunks
    if isinstance(source, ImageFolderSource):
        labels = np.array([label for _, label in source.items], dtype=np.int64)
        return {fixed[0].name: labels}
    positions = {f.name: spec.field_names.index(f.name) for f in fixed}
    values: dict[str, list] = {f.name: [] for f in fixed}
    for index in rows:
        sample = check_sample(spec, source[int(index)], int(index))
        for name, position in positions.items():
            value = sample[position]
            values[name].append(value.numpy() if hasattr(value, "numpy") else value)
    columns = {name: np.asarray(v) for name, v in values.items()}
    # Already in row order: index them with 0..n-1 instead of source indices.
    return {name: _RowOrdered(col) for name, col in columns.items()}


class _RowOrdered:
    """A column already gathered in row order (so indexing by source index must not apply)."""

    def __init__(self, column: np.ndarray):
        self.column = column


def _check_fixed_fields(beton: BetonFile, spec: DatasetSpec, source, rows: np.ndarray) -> tuple[bool, str, dict]:
    columns = source_fixed_values(spec, source, rows)
    details, per_field, ok = [], {}, True
    for field in (f for f in spec.fields if f.is_fixed_size):
        column = columns[field.name]
        mismatches, first = 0, None
        for start in range(0, len(rows), CHUNK_ROWS):
            chunk = np.arange(start, min(start + CHUNK_ROWS, len(rows)))
            if isinstance(column, _RowOrdered):
                expected = column.column[chunk]
            else:
                expected = np.asarray(column[rows[chunk]])
            if field.type in ("int", "float"):
                found = np.asarray(beton.metadata[field.name][chunk])
                expected = expected.astype(found.dtype)
            else:
                found = beton.ndarray_column(field.name, chunk)
            bad = _mismatching_rows(found, expected)
            if bad.size and first is None:
                first = int(chunk[bad[0]])
            mismatches += int(bad.size)
        per_field[field.name] = {"compared": int(len(rows)), "mismatches": mismatches}
        if mismatches:
            ok = False
            details.append(
                f"field '{field.name}': {mismatches} of {len(rows)} samples differ from the source "
                f"(first: sample {first}, source index {int(rows[first])})"
            )
    names = ", ".join(per_field)
    return ok, "; ".join(details) or f"all {len(rows)} samples equal the source in {names}", {"fields": per_field}


def _mismatching_rows(found: np.ndarray, expected: np.ndarray) -> np.ndarray:
    if found.shape != expected.shape:
        return np.arange(len(found))
    found_flat = found.reshape(len(found), -1)
    expected_flat = expected.reshape(len(expected), -1)
    differ = found_flat != expected_flat
    if np.issubdtype(found.dtype, np.floating):
        differ &= ~(np.isnan(found_flat) & np.isnan(expected_flat))
    return np.flatnonzero(differ.any(axis=1))


def _sampled_rows(spec: DatasetSpec, n_rows: int, every: bool) -> np.ndarray:
    k = n_rows if every else min(spec.verify["samples"], n_rows)
    return np.sort(np.random.default_rng(spec.writer.seed).choice(n_rows, size=k, replace=False))


def expected_image(field, image: np.ndarray) -> np.ndarray:
    """What ffcv stores for a source image: resized (INTER_AREA, never upscaled) to max_resolution."""
    from ffcv.fields.rgb_image import resizer

    return resizer(image, field.options["max_resolution"])


def _check_variable_fields(beton: BetonFile, spec: DatasetSpec, source, rows: np.ndarray,
                           every: bool) -> tuple[bool, str, dict]:
    sampled = _sampled_rows(spec, len(rows), every)
    variable = [(i, f) for i, f in enumerate(spec.fields) if not f.is_fixed_size]
    stats = {f.name: {"compared": 0, "mismatches": 0} for _, f in variable}
    problems = []
    tolerance = spec.verify["jpeg_mean_abs_error"]
    for row in sampled:
        index = int(rows[row])
        sample = check_sample(spec, source[index], index)
        for position, field in variable:
            problem = _compare_variable(beton, field, int(row), sample[position], tolerance, stats[field.name])
            stats[field.name]["compared"] += 1
            if problem:
                stats[field.name]["mismatches"] += 1
                if len(problems) < 5:
                    problems.append(f"field '{field.name}' sample {int(row)} (source index {index}): {problem}")
    for s in stats.values():
        if "jpeg_mean_abs_error_max" in s:
            s["jpeg_tolerance"] = tolerance
    detail = "; ".join(problems) or f"{len(sampled)} seeded samples of {[f.name for _, f in variable]} equal the source"
    return not problems, detail, {"fields": stats}


def _compare_variable(beton: BetonFile, field, row: int, value, tolerance: float, stats: dict) -> str | None:
    if field.type == "bytes":
        stored = np.asarray(beton.variable_payload(field.name, row))
        if stored.size != value.size:
            return f"stored length {stored.size}, source length {value.size}"
        return None if np.array_equal(stored, value) else "bytes differ"
    if field.type == "json":
        import json

        stored = decode_json(beton.variable_payload(field.name, row))
        return None if stored == json.loads(json.dumps(value)) else f"stored {stored!r} != source"
    expected = expected_image(field, value)
    found = decode_image(beton, field.name, row)
    if found.shape != expected.shape:
        return f"image shape {found.shape}, expected {expected.shape}"
    if beton.metadata[field.name][row]["mode"] == 1:
        stats["raw"] = stats.get("raw", 0) + 1
        return None if np.array_equal(found, expected) else "raw image pixels differ"
    error = np.abs(found.astype(np.int16) - expected.astype(np.int16))
    mean, worst = float(error.mean()), int(error.max())
    stats["jpeg"] = stats.get("jpeg", 0) + 1
    stats["jpeg_mean_abs_error_max"] = max(stats.get("jpeg_mean_abs_error_max", 0.0), round(mean, 3))
    stats["jpeg_max_abs_error_max"] = max(stats.get("jpeg_max_abs_error_max", 0), worst)
    if mean > tolerance:
        return f"JPEG mean absolute pixel error {mean:.2f} exceeds the tolerance {tolerance}"
    return None


def _check_loader_batch(beton: BetonFile, spec: DatasetSpec, source, rows: np.ndarray) -> tuple[bool, str]:
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
        else:
            meta = beton.metadata[field.name]
            if len(np.unique(meta["width"])) == 1 and len(np.unique(meta["height"])) == 1:
                pipelines[field.name] = [SimpleRGBImageDecoder()]
            else:
                pipelines[field.name] = None  # SimpleRGBImageDecoder needs one image size
                skipped.append(field.name)
    loader = Loader(beton.path, batch_size=n, num_workers=1, order=OrderOption.SEQUENTIAL,
                    indices=list(range(n)), pipelines=pipelines, drop_last=False)
    batch = next(iter(loader))
    batch = [b.numpy() if hasattr(b, "numpy") else np.asarray(b) for b in batch]
    loaded = dict(zip([f.name for f in spec.fields if pipelines[f.name] is not None], batch))
    problems = []
    for field in spec.fields:
        if field.name not in loaded:
            continue
        got = loaded[field.name]
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
            else:
                # ffcv decodes JPEG with libturbojpeg, we with cv2: their IDCTs differ by about 1 level.
                mine = decode_image(beton, field.name, row).astype(np.int16)
                same = got[row].shape == mine.shape and np.abs(got[row].astype(np.int16) - mine).mean() < LOADER_JPEG_MEAN_ERROR
            if not same:
                problems.append(f"field '{field.name}' sample {row}: ffcv.Loader and the file disagree")
                break
    detail = "; ".join(problems) or f"ffcv.Loader read {n} samples, equal to the file's decoded content"
    if skipped:
        detail += f" (fields {skipped} skipped: images of several sizes)"
    return not problems, detail
