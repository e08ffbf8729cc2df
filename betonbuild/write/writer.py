"""Writes a dataset to a .beton so that the write can neither hang nor leave a partial file.

Plain ffcv spins forever when a worker raises: its parent only polls a done-counter. Here each
worker reports its exception on a queue and exits; the parent watches that queue and the workers'
exit codes (``betonbuild.write.beton_writer``, betonbuild's writer of ffcv's layout), and on any
failure (or SIGTERM/SIGINT) terminates the workers, releases the shared memory and removes the
temp file. The file reaches its target path only after a complete write.

Under ``bad_samples: {policy: skip}`` (``write_beton(skip=SkipLimit(...))``), a failure that is the
sample's own (``SkipBadSamples.describe``: its read, decode, contract check or encode; never an I/O
error of the write itself or a whole-source error) leaves that sample out instead
(``betonbuild.write.skips`` explains how), up to the limit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from betonbuild.atomic import DISK_FULL_ERRNOS, atomic_path
from betonbuild.atomic import disk_full_error as atomic_disk_full_error
from betonbuild.config.spec import DatasetSpec
from betonbuild.errors import SampleError, SourceError, WriteError
from betonbuild.fields import build_fields
from betonbuild.fields.kept_jpeg import keep_failure, keep_tally, keeps_source_jpeg, reason_of, resolve_source_jpeg
from betonbuild.write.beton_writer import BetonWriter, WorkerFailure
from betonbuild.write.contract import SampleContract, sample_to_tuple
from betonbuild.write.image_measure import image_measure
from betonbuild.write.progress import Progress
from betonbuild.write.skips import SkipLimit, SkippedSample, record_entry, sample_location, skipped_from_error
from betonbuild.write.workplan import WorkPlan


class WriteInterrupted(WriteError):
    pass


class CheckedDataset:
    """The source seen through the sample contract: every sample is checked before ffcv encodes it.

    Also remembers the index being written, so a failure inside ffcv's own encode can be named.
    """

    def __init__(self, spec: DatasetSpec, source):
        self.spec = spec
        self.source = source
        self.current_index: int | None = None
        self._seed_global_rng = any(f.options.get("write_mode") == "proportion" for f in spec.fields)
        # ``source_jpeg: keep``: why each image was kept or re-encoded, shared with the forked workers
        self.keep_tally = keep_tally(spec, len(source))
        self._keeping = [(i, f) for i, f in enumerate(spec.fields) if keeps_source_jpeg(f)]
        self.check_sample = SampleContract(spec)

    def __len__(self) -> int:
        return len(self.source)

    def index_now(self) -> int | None:
        """The source index of the sample being written (ffcv encodes it right after reading it)."""
        return self.current_index

    def __getitem__(self, index) -> tuple:
        index = int(index)  # ffcv passes np.int64, which user code (e.g. JSON values) may not expect
        return self.check(self.fetch(index), index)

    def fetch(self, index: int):
        """The raw sample; an exception in the user's __getitem__ becomes a SampleError naming the index."""
        self.current_index = index
        try:
            return self.source[index]
        except (SampleError, SourceError):  # a SourceError is about the whole source, not this sample
            raise
        except Exception as exc:
            raise SampleError(
                self.spec.name,
                None,
                index,
                f"the source's __getitem__ raised {type(exc).__name__}: {exc}",
                "fix the adapter; the traceback shows where it raised",
            ) from exc

    def check(self, sample, index: int) -> tuple:
        if self._seed_global_rng:
            # RGBImageField's `proportion` mode draws from numpy's global RNG: seed it per sample
            # so the choice of JPEG vs raw is reproducible.
            np.random.seed((self.spec.writer.seed * 1_000_003 + index) % 2**32)
        if not self._keeping:
            return self.check_sample(sample, index)
        raw = list(sample_to_tuple(self.spec, sample, index))
        for column, field in self._keeping:
            raw[column] = resolve_source_jpeg(field, raw[column], keep_failure(self.spec.name, field.name, index))
        values = self.check_sample(tuple(raw), index)
        for column, field in self._keeping:
            self.keep_tally.record(field.name, index, reason_of(raw[column], values[column]))
        return values


def page_fit_error(spec: DatasetSpec, fields: dict, values: tuple, index: int) -> SampleError:
    """Explains a sample that does not fit one page: its size and the smallest page_size that fits."""
    sizes = measure_allocations(fields, values)
    total = sum(sizes.values())
    biggest = max(sizes, key=sizes.get) if sizes else None
    fits = max(1 << 21, 1 << (max(total, 1) - 1).bit_length())
    detail = ", ".join(f"{name} {size}" for name, size in sizes.items())
    return SampleError(
        spec.name,
        biggest,
        index,
        f"sample needs {total} bytes ({detail}) but one page holds {spec.writer.page_size}; "
        "ffcv keeps each sample's data on a single page",
        f"set writer.page_size to at least {_human(fits)} ({fits})",
    )


def measure_allocations(fields: dict, values: tuple) -> dict[str, int]:
    """Bytes each field allocates for one sample, found by running its encode into scratch memory."""
    return {
        name: sum(len(b) for b in encode_scratch(field, value)[1])
        for (name, field), value in zip(fields.items(), values)
    }


def encode_scratch(field, value) -> tuple[np.ndarray, list[np.ndarray]]:
    """What ffcv's ``field`` stores for ``value``: its metadata record and the allocations its encode
    filled, in scratch memory (every allocation's pointer is 0)."""
    buffers: list[np.ndarray] = []

    def malloc(n: int):
        buffers.append(np.zeros(n, dtype=np.uint8))
        return 0, buffers[-1]

    record = np.zeros(1, dtype=field.metadata_type)
    field.encode(record, value, malloc)
    return record, buffers


def _human(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return f"{nbytes}B"


def describe_failure(dataset: CheckedDataset, fields: dict, exc: BaseException) -> WorkerFailure:
    """What a worker sends home when ``exc`` ended it: the error explained, picklable, with the
    source index it was on and its traceback (called while ``exc`` is being handled)."""
    error = _explain(dataset, fields, exc)
    index = error.index if isinstance(error, SampleError) else dataset.current_index
    return WorkerFailure(index, _picklable(error), traceback.format_exc())


def _explain(dataset: CheckedDataset, fields: dict, exc: BaseException) -> BaseException:
    """Turns an exception raised inside ffcv's encode into one naming the dataset, field and index."""
    if isinstance(exc, (SampleError, SourceError, WriteError)):
        return exc
    if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
        return disk_full_error(dataset.spec.name, exc)
    index = dataset.current_index
    if index is None:
        return exc
    too_big = isinstance(exc, MemoryError) or (isinstance(exc, ValueError) and "Tried allocating" in str(exc))
    if too_big:
        return page_fit_error(dataset.spec, fields, dataset[index], index)
    return SampleError(
        dataset.spec.name,
        None,
        index,
        f"ffcv's encode raised {type(exc).__name__}: {exc}",
        "replay the sample with `betonbuild repro` to debug the encode in one process",
    )


class SkipBadSamples:
    """The skip policy a writer worker asks about each failure (inherited through fork)."""

    def __init__(self, limit: SkipLimit):
        import ctypes
        from multiprocessing import Value

        self.limit = limit
        self.count = Value(ctypes.c_int64, 0)  # shared by the workers: the first beyond the limit stops

    def over_limit(self) -> bool:
        """Counts one more skipped sample (in a worker); True when the write must stop."""
        with self.count.get_lock():
            self.count.value += 1
            count = self.count.value
        return count > self.limit.limit or count >= self.limit.total

    def describe(
        self, dataset: CheckedDataset, fields: dict, exc: BaseException, dest: int, index
    ) -> SkippedSample | None:
        """The record of a sample left out, or None when ``exc`` is not the sample's fault (the write
        then fails as under ``fail``). Called while ``exc`` is being handled."""
        if not isinstance(exc, Exception) or isinstance(exc, (OSError, SourceError, WriteError)):
            return None
        error = _explain(dataset, fields, exc)
        if not isinstance(error, SampleError) or not error.skippable:
            return None
        return skipped_from_error(error, dest, int(index), sample_location(dataset.source, int(index)))

    def check(self, skipped: list[SkippedSample]) -> None:
        self.limit.check(skipped)


def disk_full_error(dataset: str, exc: OSError) -> WriteError:
    return atomic_disk_full_error(exc, dataset=dataset)


def _picklable(error: BaseException) -> BaseException:
    try:
        import pickle

        pickle.loads(pickle.dumps(error))  # both ways: an exception can pickle but not unpickle
        return error
    except Exception:  # noqa: BLE001 - any failure to round-trip means: send a plain copy
        return WriteError(f"{type(error).__name__}: {error}")


@contextlib.contextmanager
def _signals_raise():
    """SIGTERM/SIGINT during a write become an exception, so cleanup runs (Snakemake sends SIGTERM)."""

    owner = os.getpid()

    def handler(signum, _frame):
        if os.getpid() != owner:
            # A worker forked a moment ago inherits this handler until it sets its own; raising
            # there would unwind the parent's stack copied into the child. It dies as it should.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise WriteInterrupted(f"write interrupted by {signal.Signals(signum).name}")

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    previous[signal.SIGXFSZ] = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG is then reported
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def resolve_workers(num_workers: int, threads: int | None = None) -> int:
    """-1 means the CPUs this process may use; inside Snakemake, the job's threads (which also cap N)."""
    if num_workers > 0:
        return min(num_workers, threads) if threads else num_workers
    if threads:
        return threads
    return len(os.sched_getaffinity(0))


def write_beton(
    spec: DatasetSpec,
    source,
    order: np.ndarray,
    target: str | os.PathLike,
    num_workers: int,
    label: str | None = None,
    log=None,
    work_items: list[list[tuple[int, int]]] | None = None,
    skip: SkipLimit | None = None,
    measure_images: bool = True,
    watch: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Writes ``source[order[i]]`` as sample i of ``target``; returns a record of the write.

    ``work_items`` (lists of (sample, source index)) replaces the even chunks of ``chunksize``,
    e.g. one item per webdataset shard so each shard is read once, by one worker. Either becomes a
    ``WorkPlan`` of numpy arrays first (``work_items`` is released): no Python object per sample
    stays alive during the write.

    ``skip``: leave bad samples out, up to its limit (``TooManyBadSamples`` beyond, nothing written);
    the record then says which (``"skipped"``, positions among ``order``) and ``num_samples`` is
    what the file holds. ``measure_images``: re-encoded images are measured as they are written
    (``write.image_measure``; the record's ``"measured_images"``). ``watch``: called about every 50 ms
    while the workers write; what it raises ends the write, and no file is left at ``target``.
    """
    log = log or sys.stderr
    plan = WorkPlan.even(order, spec.writer.chunksize) if work_items is None else WorkPlan.groups(work_items)
    del work_items
    dataset = CheckedDataset(spec, source)
    fields = build_fields(spec)
    measure = image_measure(spec, len(source)) if measure_images else None  # re-encoded: error and CRC
    for field in spec.fields if measure is not None else []:
        if field.name in measure.rows:
            max_resolution = field.options.get("max_resolution")
            fields[field.name] = measure.wrap(field.name, fields[field.name], max_resolution, dataset.index_now)
    num_workers = max(1, min(num_workers, len(order)))
    progress = Progress(label or spec.name, len(order), stream=log)
    started = time.monotonic()
    with atomic_path(target) as tmp, _signals_raise():
        writer = BetonWriter(
            str(tmp),
            fields,
            page_size=spec.writer.page_size,
            num_workers=num_workers,
            progress=progress,
            describe_failure=describe_failure,
            skip_policy=SkipBadSamples(skip) if skip is not None else None,
            watch=watch,
        )
        try:
            writer.write(dataset, plan)
        except OSError as exc:
            if exc.errno in DISK_FULL_ERRNOS:
                raise disk_full_error(spec.name, exc) from exc
            raise
        finally:
            writer.shutdown()
    record = {
        "num_samples": int(len(order)) - len(writer.skipped),
        "num_workers": num_workers,
        "page_size": spec.writer.page_size,
        "chunksize": spec.writer.chunksize,
        "seconds": round(time.monotonic() - started, 3),
    }
    if skip is not None:
        record["skipped"] = record_entry(sorted(writer.skipped, key=lambda s: s.position), skip.limit)
    if dataset.keep_tally is not None:  # per field: kept and re-encoded images, and why
        record["source_jpeg"] = dataset.keep_tally.summary(order)
    if measure is not None:
        skipped_positions = [s.position for s in writer.skipped]
        record["measured_images"] = measure.summary(np.delete(order, skipped_positions) if skipped_positions else order)
    return record
