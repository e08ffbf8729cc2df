"""The one-pass write of an iterable source: its stream cut into parts of ``samples_per_partition``
samples, each written by ``write.writer.write_beton`` (atomic) and recorded the moment it is
complete, so that an interrupted write resumes after its finished parts and the stream is read
once. The caller merges the parts (``beton.merge``).

A part ``results/{ds}/parts/{i}.beton`` is finished when its record ``{i}.write.json`` exists,
names the same ``plan`` (the dataset's content keys except ``source.length``, the part size, the
adapter code's digest and the ffcv build: anything that would change its bytes) and its file has
the recorded size. The record holds the part's first position, its count, a digest of its raw
samples and whether the stream ended with it (``final``).

On resume the stream is advanced past the finished parts: a factory with a ``start``/``skip``
parameter is asked to start there; any other is read from the start and each finished part's
samples are compared with its digest (read and hashed, not checked or encoded, then dropped). A
part whose samples differ is removed with the parts after it, and the write stops: the source
changed since that part was written.

When the iterable raises, the samples it yielded before are written as a shorter part first, so
that the next run resumes at the failing position. A part's samples are held in memory while it
is written (copies, as they were yielded): the writer workers are forked with them.
``samples_per_partition`` bounds that memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from betonbuild.atomic import write_json
from betonbuild.config.spec import DatasetSpec
from betonbuild.errors import SampleError, SourceError
from betonbuild.provenance import ffcv_build
from betonbuild.sources.iterable import IterableSource, chained_digest, iterate, sample_digest, starts_itself
from betonbuild.write.skips import SkipLimit, SkippedSample, TooManyBadSamples, from_record, record_entry
from betonbuild.write.writer import write_beton

PLAN_SKIPS_SOURCE_KEYS = ("length",)  # a check, not content: fixing it must not rewrite the parts


class PartSamples:
    """One part's samples as the writer reads them: indexed by stream position."""

    def __init__(self, start: int, samples: list[Any]):
        self.start = start
        self.samples = samples

    def __len__(self) -> int:
        return self.start + len(self.samples)

    def __getitem__(self, position: int) -> Any:
        if not self.start <= position < len(self):
            raise IndexError(f"position {position} is not in this part ({self.start}..{len(self) - 1})")
        return self.samples[position - self.start]

    def work_items(self, rows: np.ndarray) -> None:
        return None


def part_paths(parts_dir: str | os.PathLike, index: int) -> tuple[Path, Path]:
    """(the part's .beton, its record)."""
    return Path(parts_dir) / f"{index}.beton", Path(parts_dir) / f"{index}.write.json"


def write_plan(spec: DatasetSpec, adapters_sha256: str) -> str:
    """What a finished part must have been written for, to be kept on resume."""
    content = spec.to_dict()
    content["source"] = {k: v for k, v in content["source"].items() if k not in PLAN_SKIPS_SOURCE_KEYS}
    kept = {k: content[k] for k in ("name", "source", "fields", "sample_keys", "writer")}
    kept["samples_per_part"] = IterableSource.samples_per_part(spec)
    kept["adapters_sha256"] = adapters_sha256
    kept["ffcv"] = ffcv_build()
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()


def finished_parts(parts_dir: str | os.PathLike, plan: str, skip: bool = False) -> list[dict[str, Any]]:
    """The records of the finished parts 0, 1, ... up to the first missing, stale or unfinished one.
    A part that left bad samples out is kept only under ``skip`` (``bad_samples`` is not in the plan:
    a part without skips is the same file under either policy)."""
    records: list[dict[str, Any]] = []
    while True:
        beton, record_path = part_paths(parts_dir, len(records))
        try:
            with open(record_path) as fh:
                record = json.load(fh)
            size = None if record.get("written") == 0 else beton.stat().st_size  # every sample bad: no file
        except (OSError, ValueError):
            return records
        expected_start = sum(r["num_samples"] for r in records)
        if record.get("plan") != plan or record.get("bytes") != size or record.get("start") != expected_start:
            return records
        if not skip and (record.get("skipped") or {}).get("count"):
            return records
        records.append(record)
        if record.get("final"):
            return records


def remove_parts_from(parts_dir: str | os.PathLike, first: int) -> int:
    """Deletes part ``first`` and every later one (their records first: a record never outlives its file's
    validity). Returns how many part files there were."""
    removed = 0
    for path in sorted(Path(parts_dir).glob("*.write.json")):
        index = path.name.split(".")[0]
        if index.isdigit() and int(index) >= first:
            path.unlink(missing_ok=True)
    for path in sorted(Path(parts_dir).glob("*.beton")):
        if path.stem.isdigit() and int(path.stem) >= first:
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def write_parts(
    spec: DatasetSpec,
    parts_dir: str | os.PathLike,
    plan: str,
    workers: int,
    failed: Callable[[PartSamples, SampleError], None] | None = None,
    log=None,
    kept: Callable[[PartSamples, list[SkippedSample], int], None] | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """Writes the stream's parts not finished yet; returns every part's record, in order, and how many
    were finished before (resumed). ``failed(samples, error)`` is told of a bad sample before it is raised.

    Under ``bad_samples: {policy: skip}`` each part leaves its bad samples out (a sample the contract
    or ffcv's encode refuses; the iterable raising is never skipped) against what ``max`` leaves after
    the earlier parts' skips, and lists them in its record (positions among its rows, source index =
    stream position); ``kept(samples, skipped, earlier)`` is told of them while the part's samples are
    in memory (``earlier``: how many the earlier parts skipped)."""
    log = log or sys.stderr
    Path(parts_dir).mkdir(parents=True, exist_ok=True)
    records = finished_parts(parts_dir, plan, spec.bad_samples.skip)
    resumed = len(records)
    remove_parts_from(parts_dir, resumed)  # stale or unfinished: rewritten
    if records and records[-1].get("final"):
        print(f"{spec.name}: all {resumed} parts were finished by an earlier run", file=log, flush=True)
        check_count(spec, sum(r["num_samples"] for r in records))
        stream_skips(spec, records)
        return records, resumed
    start = sum(r["num_samples"] for r in records)
    stream = iterate(spec, start)
    if resumed:
        if not starts_itself(spec):
            _skip_finished(spec, stream, records, parts_dir)
        print(
            f"{spec.name}: resuming after {resumed} finished part(s), at sample {start} "
            f"({'the factory starts there' if starts_itself(spec) else 'earlier samples read and compared'})",
            file=log,
            flush=True,
        )
    size = IterableSource.samples_per_part(spec)
    for index, position, samples, digests, final in _cut(spec, stream, start, size, len(records)):
        beton, record_path = part_paths(parts_dir, index)
        part = PartSamples(position, samples)
        earlier = stream_skips(spec, records)
        try:
            written = write_beton(
                spec,
                part,
                np.arange(position, position + len(samples), dtype=np.int64),
                beton,
                workers,
                label=f"{spec.name} (part {index}, samples {position}..{position + len(samples) - 1})",
                log=log,
                skip=_part_limit(spec, index, len(samples), position + len(samples), len(earlier)),
            )
        except SampleError as exc:
            written = _all_bad_part(spec, exc, len(samples), len(earlier), position + len(samples), workers)
            if written is None:
                error = _with_earlier(spec, exc, earlier, position + len(samples))
                if failed is not None:
                    failed(part, error)
                if error is exc:
                    raise
                raise error from exc
        record = {
            "dataset": spec.name,
            "part": index,
            "start": position,
            "num_samples": len(samples),  # samples of the stream the part covers (``written``: rows it holds)
            "samples_sha256": chained_digest(digests),
            "final": final,
            "plan": plan,
            "bytes": beton.stat().st_size if written["num_samples"] else None,
            "seconds": written["seconds"],
            "num_workers": written["num_workers"],
            "provenance": ffcv_build(),
        }
        if "skipped" in written:
            record.update(written=written["num_samples"], skipped=written["skipped"])
            if kept is not None:
                kept(part, from_record(written), len(earlier))
        write_json(record_path, record)
        records.append(record)
    check_count(spec, sum(r["num_samples"] for r in records))
    return records, resumed


def _part_limit(spec: DatasetSpec, index: int, rows: int, read: int, earlier: int) -> SkipLimit | None:
    """A part's bound under ``skip``: what ``max`` leaves after the earlier parts' skips (a fraction
    needs ``source.length``: ``IterableSource.check_spec``), never all of its own rows."""
    policy = spec.bad_samples
    if not policy.skip:
        return None
    of = spec.source.get("length") or read
    return SkipLimit(spec.name, max(0, policy.limit(of) - earlier), rows, f"part {index}", of)


def _all_bad_part(
    spec: DatasetSpec, exc: SampleError, rows: int, earlier: int, read: int, workers: int
) -> dict[str, Any] | None:
    """The record of a part whose every sample is bad, when the stream's skips stay within ``max``:
    a write leaves no file then (never an empty .beton), but the stream goes on (e.g. a last part of
    one bad sample); the merge leaves the part out. None for any other failure."""
    if not isinstance(exc, TooManyBadSamples) or len(exc.skipped) != rows:
        return None
    of = spec.source.get("length") or read
    if earlier + rows > spec.bad_samples.limit(of):
        return None
    limit = _part_limit(spec, 0, rows, read, earlier)
    return {"num_samples": 0, "seconds": 0.0, "num_workers": workers, "skipped": record_entry(exc.skipped, limit.limit)}


def stream_skips(spec: DatasetSpec, records: list[dict[str, Any]]) -> list[SkippedSample]:
    """The parts' skipped samples, positions in the whole stream; TooManyBadSamples when together
    they exceed ``bad_samples.max`` (finished parts kept from a run with a higher ``max``)."""
    everything = [
        SkippedSample(**{**s.to_dict(), "position": s.position + int(r["start"])})
        for r in records
        for s in from_record(r)
    ]
    if everything:
        read = sum(r["num_samples"] for r in records)
        of = spec.source.get("length") or read
        SkipLimit(spec.name, spec.bad_samples.limit(of), read + 1, "full", of).check(everything)
    return everything


def _with_earlier(spec: DatasetSpec, exc: SampleError, earlier: list[SkippedSample], read: int) -> SampleError:
    """A part's TooManyBadSamples with the earlier parts' skips, when together they are beyond ``max``
    (the part alone may be within what was left: its message would then mislead)."""
    if not isinstance(exc, TooManyBadSamples) or not earlier:
        return exc
    mine = [SkippedSample(**{**s.to_dict(), "position": s.index}) for s in exc.skipped]
    of = spec.source.get("length") or read
    limit = spec.bad_samples.limit(of)
    if len(earlier) + len(mine) <= limit:
        return exc
    return TooManyBadSamples(spec.name, earlier + mine, limit, read + 1, "full", of)


def _skip_finished(spec: DatasetSpec, stream: Iterator, records: list[dict[str, Any]], parts_dir) -> None:
    """Reads the finished parts' samples from the stream and compares each part's digest."""
    for record in records:
        digests = []
        for _ in range(record["num_samples"]):
            item = next(stream, None)
            if item is None:
                break
            digests.append(sample_digest(item[1]))
        if len(digests) != record["num_samples"] or chained_digest(digests) != record["samples_sha256"]:
            remove_parts_from(parts_dir, record["part"])
            stop = record["start"] + record["num_samples"] - 1
            raise SourceError(
                spec.name,
                f"samples {record['start']}..{stop} of the iterable differ from those part {record['part']} was "
                f"written from in an earlier run (the source changed, or does not yield the same samples each "
                f"time it is iterated); parts {record['part']} and later were removed: run snakemake again to "
                "rewrite them",
            )


def _cut(
    spec: DatasetSpec, stream: Iterator, start: int, size: int, first_index: int
) -> Iterator[tuple[int, int, list, list, bool]]:
    """(part index, first position, samples, their digests, whether the stream ended) per part;
    one sample is read ahead, so that a full last part is known to be the last. When the iterable
    raises, the samples read before are written as a (shorter) part first: the next run resumes
    exactly at the failing position."""
    length = spec.source.get("length")
    ahead, raised = _next(stream)
    index, position = first_index, start
    while ahead is not None:
        samples, digests = [], []
        while ahead is not None and len(samples) < size:
            if length is not None and ahead[0] >= length:
                raise too_many(spec, length)
            samples.append(ahead[1])
            digests.append(sample_digest(ahead[1]))
            ahead, raised = _next(stream)
        if length is not None and ahead is not None and ahead[0] >= length:
            raise too_many(spec, length)
        yield index, position, samples, digests, ahead is None and raised is None
        index, position = index + 1, position + len(samples)
    if raised is not None:
        raise raised
    if index == 0 and start == 0:
        raise SourceError(spec.name, f"factory {spec.source['factory']} yielded no sample; a .beton needs one")


def _next(stream: Iterator) -> tuple[tuple[int, Any] | None, SampleError | None]:
    """The stream's next (position, sample), or None at its end or when the iterable raised (then
    with the error, raised once the samples before it are written)."""
    try:
        return next(stream, None), None
    except SampleError as exc:
        return None, exc


def too_many(spec: DatasetSpec, length: int) -> SourceError:
    return SourceError(
        spec.name,
        f"the iterable yields more than the {length} samples `datasets.{spec.name}.source.length` says "
        f"(sample {length} exists); correct `length` (or remove it), or fix the factory",
    )


def check_count(spec: DatasetSpec, count: int) -> None:
    """With ``source.length`` given, the stream must have ended at exactly that count."""
    length = spec.source.get("length")
    if length is not None and count != length:
        raise SourceError(
            spec.name,
            f"the iterable yielded {count} samples but `datasets.{spec.name}.source.length` says {length}; "
            f"correct `length` (or remove it), or fix the factory (the {count} samples written are kept in "
            "results/{ds}/parts/ and reused by the next run)".replace("{ds}", spec.name),
        )
