"""Comparing a .beton's content with its source, on a thread pool over chunks of file positions.

A *position* is a sample's place in the file (0..n-1); ``indices[position]`` is the source index
whose sample it must hold. Fixed-size fields are compared at every position, vectorised;
variable-size and custom fields at the selected positions (all of them in ``mode: full``), one
sample at a time, each by its kind (``FieldKind.compare``, ``betonbuild.fields``).
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any

import numpy as np

from betonbuild._compat.ffcv_ctypes import TurboJPEG
from betonbuild.beton.format import BetonFile
from betonbuild.config.spec import DatasetSpec
from betonbuild.errors import BetonbuildError, BetonFormatError
from betonbuild.fields import FIELD_KINDS, field_kind
from betonbuild.fields.kept_jpeg import KeptJPEG, keep_or_reason, keeps_source_jpeg
from betonbuild.fields.reduced_decode import decodes_reduced, reduces
from betonbuild.mapped_pages import release_mapped
from betonbuild.verify.images import DecoderCount, StoredImages, decode_source_image
from betonbuild.verify.measured import decoder_count
from betonbuild.write.contract import SampleContract, check_value

CHUNK_ROWS = 4096  # positions compared at once: bounds the memory of the vectorised comparison
MIN_TASK_ROWS, MAX_TASK_ROWS = 16, 256  # positions per pool task when every sample is decoded
MAX_PROBLEMS = 5
TASKS_IN_FLIGHT = 64  # chunks submitted to the pool ahead of the one being merged
RELEASE_EVERY = 256  # chunks between unmappings of the pages read (1M positions of fixed fields)


@dataclass
class Context:
    beton: BetonFile
    spec: DatasetSpec
    source: Any
    indices: np.ndarray  # the source index each position must hold
    mode: str
    fixed: list[tuple[int, Any]]  # (column, field) of the fixed-size fields
    variable: list[tuple[int, Any]]  # (column, field) of the variable-size and custom fields
    columns: dict[str, Any]  # fixed-field values read vectorised from the source
    selected: np.ndarray  # per position: whether its variable fields are compared
    positions_per_task: int
    tolerance: float
    # field -> its statistics as the write measured them (``verify.measured``): not compared again
    measured: dict[str, dict] = dc_field(default_factory=dict)
    check_sample: SampleContract = dc_field(init=False)  # the sample contract, as the writer applied it

    def __post_init__(self) -> None:
        self.check_sample = SampleContract(self.spec)

    @classmethod
    def build(cls, beton, spec, source, indices, mode, threads, measured: dict | None = None) -> Context:
        measured = measured or {}
        fixed = [(i, f) for i, f in enumerate(spec.fields) if field_kind(f).fixed_size]
        variable = [(i, f) for i, f in enumerate(spec.fields) if not field_kind(f).fixed_size]
        compared = [f for _, f in variable if f.name not in measured]
        selected = np.zeros(len(indices), dtype=bool)
        if compared:
            selected[_sampled_positions(spec, len(indices), mode == "full")] = True
        heavy = compared and mode == "full"
        per_task = int(np.clip(len(indices) // (threads * 8), MIN_TASK_ROWS, MAX_TASK_ROWS)) if heavy else CHUNK_ROWS
        return cls(
            beton,
            spec,
            source,
            indices,
            mode,
            fixed,
            variable,
            source.fixed_columns(),
            selected,
            per_task,
            float(spec.verify["jpeg_mean_abs_error"]),
            measured,
        )

    @property
    def compared(self) -> list[tuple[int, Any]]:
        """The variable fields compared sample by sample with the source: all but the measured ones."""
        return [(i, f) for i, f in self.variable if f.name not in self.measured]

    def add_measured(self, tally: Tally, refused: dict[str, str]) -> None:
        """The measured fields' statistics, and why the others' measurements were not used."""
        for name, stats in self.measured.items():
            tally.variable[name] = dict(stats)
            tally.decoders[name] = decoder_count(stats)
        for name, reason in refused.items():
            tally.stats(name)["measured_not_used"] = reason

    def variable_checks(self) -> list[str]:
        """The report checks of the variable fields (``FieldKind.verify_check``), in a fixed order."""
        present = {field_kind(f).verify_check for _, f in self.variable}
        return [c for c in dict.fromkeys(k.verify_check for k in FIELD_KINDS.values()) if c in present]


def _sampled_positions(spec: DatasetSpec, n: int, every: bool) -> np.ndarray:
    k = n if every else min(spec.verify["samples"], n)
    if k == n:
        return np.arange(n)
    return np.sort(np.random.default_rng(spec.writer.seed).choice(n, size=k, replace=False))


@dataclass
class Tally:
    """What one chunk of positions found; tallies of all chunks are merged in position order."""

    fixed: dict[str, list[int]] = dc_field(default_factory=dict)  # name -> [compared, mismatches, first]
    variable: dict[str, dict[str, Any]] = dc_field(default_factory=dict)
    problems: list[tuple[int, str, str]] = dc_field(default_factory=list)  # (position, field, text)
    decoders: dict[str, DecoderCount] = dc_field(default_factory=dict)  # image field -> who decoded its JPEGs

    def stats(self, name: str) -> dict[str, Any]:
        return self.variable.setdefault(name, {"compared": 0, "mismatches": 0})

    def problem(self, position: int, field: str, text: str) -> None:
        if len(self.problems) < MAX_PROBLEMS * 4:
            self.problems.append((position, field, text))

    def merge(self, other: Tally) -> None:
        for name, (compared, mismatches, first) in other.fixed.items():
            mine = self.fixed.setdefault(name, [0, 0, -1])
            mine[0] += compared
            mine[1] += mismatches
            if mine[2] < 0:
                mine[2] = first
        for name, theirs in other.variable.items():
            add_stats(self.stats(name), theirs)
        self.problems.extend(other.problems)
        for name, count in other.decoders.items():
            self.decoders.setdefault(name, DecoderCount()).add(count)


def add_stats(mine: dict, theirs: dict, skip: tuple[str, ...] = ()) -> None:
    """Adds one field's counters to another's (``*_max`` keys: the maximum)."""
    for key, value in theirs.items():
        if key in skip:
            continue
        if key.endswith("_max"):
            mine[key] = max(mine.get(key, value), value)
        else:
            mine[key] = mine.get(key, 0) + value


class Chunk:
    """One pool task's positions [start, stop): what a kind's ``compare`` reads of the stored sample
    at ``position`` (``betonbuild.fields.kind.StoredSample``), and this thread's source JPEG decoder."""

    def __init__(self, ctx: Context, start: int, stop: int):
        self.beton, self.tolerance, self.start, self.stop = ctx.beton, ctx.tolerance, start, stop
        self.position = start
        self.images: dict[str, StoredImages] = {}  # per field, decoded as ffcv's Loader decodes them
        self.jpeg = TurboJPEG()
        self._allocations: list[tuple[int, int]] | None = None
        self._claimed = 0

    def at(self, position: int) -> Chunk:
        self.position, self._allocations, self._claimed = position, None, 0
        return self

    def image(self, name: str) -> tuple[np.ndarray, bool]:
        images = self.images.get(name)
        if images is None:
            images = self.images[name] = StoredImages(self.beton, name, self.start, self.stop)
        return images.decode(self.position), images.is_raw(self.position)

    def allocations(self) -> list[tuple[int, int]]:
        if self._allocations is None:
            self._allocations = self.beton.custom_allocations(self.position)
        return self._allocations[self._claimed :]

    def claim(self, count: int) -> None:
        self._claimed += count


def run_content(ctx: Context, pool: ThreadPoolExecutor) -> Tally:
    """Every chunk compared on the pool, at most ``TASKS_IN_FLIGHT`` submitted at a time (a future
    and its tally per chunk of a 100M-row file would be a per-sample cost), merged in order."""
    step, n = ctx.positions_per_task, len(ctx.indices)
    in_flight: deque = deque()
    total = Tally()
    for number, start in enumerate(range(0, n, step)):
        in_flight.append(pool.submit(_compare_chunk, ctx, start, min(start + step, n)))
        if len(in_flight) >= TASKS_IN_FLIGHT:
            total.merge(in_flight.popleft().result())
        if number % RELEASE_EVERY == RELEASE_EVERY - 1:  # the file's and the source's pages compared so far
            release_mapped(ctx.beton.mm, *ctx.columns.values())
    while in_flight:
        total.merge(in_flight.popleft().result())
    return total


def _compare_chunk(ctx: Context, start: int, stop: int) -> Tally:
    chunk = Chunk(ctx, start, stop)
    try:
        tally = _compare_positions(ctx, chunk, Tally())
    finally:
        chunk.jpeg.close()
    tally.decoders = {name: images.count() for name, images in chunk.images.items()}
    return tally


def _compare_positions(ctx: Context, chunk: Chunk, tally: Tally) -> Tally:
    positions = np.arange(chunk.start, chunk.stop)
    fetched_fixed = [(i, f) for i, f in ctx.fixed if f.name not in ctx.columns]
    expected: dict[str, list] = {f.name: [] for _, f in fetched_fixed}
    failed: list[int] = []
    to_visit = positions if fetched_fixed else positions[ctx.selected[chunk.start : chunk.stop]]
    for position in to_visit:
        position = int(position)
        index = int(ctx.indices[position])
        selected = bool(ctx.selected[position])
        if not fetched_fixed and selected and _fast_image(ctx, chunk.at(position), index, tally):
            continue
        try:
            sample = _fetch(ctx, index, fetched_fixed, selected)
        except Exception as exc:  # noqa: BLE001 - a source that changed or fails now is a finding
            failed.append(position)
            for _, f in fetched_fixed:
                expected[f.name].append(None)
            tally.problem(position, "", f"reading source index {index} failed: {type(exc).__name__}: {exc}")
            if selected:
                for _, f in ctx.compared:
                    _count(tally.stats(f.name), mismatch=True)
            continue
        for i, f in fetched_fixed:
            value = sample[i]
            expected[f.name].append(value.numpy() if hasattr(value, "numpy") else value)
        if selected:
            _compare_variable(ctx, chunk.at(position), index, sample, tally)
    _compare_fixed(ctx, positions, expected, failed, tally)
    return tally


def _fetch(ctx: Context, index: int, fetched_fixed: list[tuple[int, Any]], selected: bool):
    """The checked sample; only its fixed fields where nothing else of it is compared and the
    source can give them alone (``Source.some_fields``: a shard's label without decoding its image)."""
    if not selected or not ctx.compared:
        values = ctx.source.some_fields(index, [i for i, _ in fetched_fixed])
        if values is not None:
            return {i: check_value(ctx.spec.name, f, values[i], index) for i, f in fetched_fixed}
    return ctx.check_sample(ctx.source[index], index)


def _count(stats: dict, mismatch: bool) -> None:
    stats["compared"] += 1
    stats["mismatches"] += int(mismatch)


def _compare_fixed(
    ctx: Context, positions: np.ndarray, fetched: dict[str, list], failed: list[int], tally: Tally
) -> None:
    failed_set = set(failed)
    for _, field in ctx.fixed:
        kind = field_kind(field)
        try:
            found = kind.stored_column(ctx.beton, field, positions)
        except BetonFormatError as exc:
            tally.fixed[field.name] = [len(positions), len(positions), int(positions[0])]
            tally.problem(int(positions[0]), field.name, str(exc))
            continue
        if field.name in ctx.columns:
            want = np.asarray(ctx.columns[field.name][ctx.indices[positions]])
        else:
            want = kind.expected_column(
                [found[k] if v is None else v for k, v in enumerate(fetched[field.name])], found
            )
        want = kind.as_stored(want, found)
        bad = set(_mismatching(found, want).tolist()) | {k for k, p in enumerate(positions) if int(p) in failed_set}
        first = int(positions[min(bad)]) if bad else -1
        tally.fixed[field.name] = [len(positions), len(bad), first]
        if bad:
            tally.problem(first, field.name, f"differs from source index {int(ctx.indices[first])}")


def _mismatching(found: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """The offsets (into ``found``) of the values that differ; NaN equals NaN."""
    if found.shape != expected.shape:
        return np.arange(len(found))
    found_flat = found.reshape(len(found), -1)
    expected_flat = expected.reshape(len(expected), -1)
    differ = found_flat != expected_flat
    if np.issubdtype(found.dtype, np.floating):
        differ &= ~(np.isnan(found_flat) & np.isnan(expected_flat))
    return np.flatnonzero(differ.any(axis=1))


def _compare_variable(ctx: Context, stored: Chunk, index: int, sample: tuple, tally: Tally) -> None:
    for column, field in ctx.compared:
        stats = tally.stats(field.name)
        try:
            problem = field_kind(field).compare(field, stored, sample[column], stats)
        except Exception as exc:  # noqa: BLE001 - a value that cannot be compared is a finding about that value
            problem = str(exc) if isinstance(exc, BetonFormatError) else f"{type(exc).__name__}: {exc}"
        _count(stats, mismatch=problem is not None)
        if problem:
            tally.problem(stored.position, field.name, f"(source index {index}): {problem}")


def _fast_image(ctx: Context, stored: Chunk, index: int, tally: Tally) -> bool:
    """Image folder: the source file decoded by libjpeg-turbo directly (JPEG) or cv2, and compared.

    Both decode with the same integer IDCT and upsampling as PIL, 1.5-3x faster. Only a comparison
    that passes counts: any other outcome returns False and the sample goes through the writer's own
    path (PIL and the sample contract), which decides.
    """
    data = ctx.source.encoded_image(index)
    if data is None:
        return False
    field = ctx.compared[0][1]
    # A JPEG the writer keeps is verified by its bytes (and one decode of the stored copy), never by pixels
    value = keep_or_reason(field, data.tobytes()) if keeps_source_jpeg(field) else None
    if not isinstance(value, KeptJPEG):
        if decodes_reduced(field) and reduces(field, data.tobytes()):  # no copy of the bytes otherwise
            return False  # decoded at the reduced scale, as the writer decoded it, by the writer's path
        value = decode_source_image(stored.jpeg, data)
        if value is None or value.ndim != 3:
            return False
    scratch: dict[str, Any] = {"compared": 0, "mismatches": 0}
    try:
        value = check_value(ctx.spec.name, field, value, index)  # the same size limits the writer applied
        problem = field_kind(field).compare(field, stored, value, scratch)
    except BetonbuildError:
        return False
    if problem:
        return False
    stats = tally.stats(field.name)
    add_stats(stats, scratch, skip=("compared", "mismatches"))
    stats["source_decoded_fast"] = stats.get("source_decoded_fast", 0) + 1
    _count(stats, mismatch=False)
    return True


def fixed_result(ctx: Context, tally: Tally) -> tuple[bool, str, dict]:
    per_field, details = {}, []
    n = len(ctx.indices)
    for _, field in ctx.fixed:
        compared, mismatches, first = tally.fixed[field.name]
        per_field[field.name] = {"compared": compared, "mismatches": mismatches}
        if mismatches:
            why = next(
                (
                    text
                    for _, name, text in sorted(tally.problems)
                    if name == field.name and not text.startswith("differs from")
                ),
                None,
            )
            details.append(
                f"field '{field.name}': {mismatches} of {n} samples differ from the source "
                f"(first: sample {first}, source index {int(ctx.indices[first])})" + (f": {why}" if why else "")
            )
    names = ", ".join(per_field)
    return not details, "; ".join(details) or f"all {n} samples equal the source in {names}", {"fields": per_field}


def variable_result(ctx: Context, tally: Tally, check: str) -> tuple[bool, str, dict]:
    """The outcome of report check ``check`` (``variable_fields``, ``custom_fields``) over its fields."""
    names = {f.name for _, f in ctx.variable if field_kind(f).verify_check == check}
    per_field, fixes = {}, []
    for column, field in enumerate(ctx.spec.fields):
        if field.name not in names:
            continue
        stats = dict(tally.stats(field.name))
        field_kind(field).report_stats(field, column, stats, ctx.tolerance)
        if "fix" in stats:
            fixes.append(stats.pop("fix"))  # how to make this field's failures go away, said once
        per_field[field.name] = stats
    problems = sorted((p for p in tally.problems if p[1] in names or p[1] == ""), key=lambda p: p[0])
    text = [f"field '{f}' sample {at} {what}" if f else f"sample {at}: {what}" for at, f, what in problems]
    failed = any(s["mismatches"] for s in per_field.values())
    which = "every sample" if ctx.mode == "full" else f"{int(ctx.selected.sum())} seeded samples"
    mismatches = sum(s["mismatches"] for s in per_field.values())
    detail = (
        ("; ".join(text[:MAX_PROBLEMS]) or f"{mismatches} mismatches")
        if failed
        else f"{which} of {sorted(names)} equal the source"
    )
    if failed and fixes:
        detail += ". Fix: " + "; ".join(dict.fromkeys(fixes))
    jpeg = [s for s in per_field.values() if s.get("jpeg")]
    if jpeg and not failed:
        detail += (
            f"; JPEG mean absolute error {max(s['jpeg_mean_abs_error_mean'] for s in jpeg)} on average, "
            f"{max(s['jpeg_mean_abs_error_max'] for s in jpeg)} at worst (tolerance {ctx.tolerance}), "
            f"largest pixel error {max(s['jpeg_max_abs_error_max'] for s in jpeg)}"
        )
    return not failed, detail, {"fields": per_field, "rows": "all" if ctx.mode == "full" else int(ctx.selected.sum())}
