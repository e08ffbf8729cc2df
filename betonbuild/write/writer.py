"""Runs ffcv's DatasetWriter so that it can neither hang nor leave a partial file.

Plain ffcv spins forever when a worker raises: its parent only polls a done-counter. Here each
worker reports its exception on a queue and exits; the parent watches that queue and the workers'
exit codes, and on any failure (or SIGTERM/SIGINT) terminates the workers, releases the shared
memory and removes the temp file. The file reaches its target path only after a complete write.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import queue
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from multiprocessing import Process, Queue, Value
from typing import Any

import numpy as np

from betonbuild.atomic import atomic_path
from betonbuild.config.spec import DatasetSpec
from betonbuild.errors import SampleError, SourceError, WriteError
from betonbuild.fields import build_fields
from betonbuild.write.contract import check_sample
from betonbuild.write.progress import Progress

ERROR_GRACE_SECONDS = 1.0  # after a first failure, wait this long for failures at smaller indices
TERMINATE_GRACE_SECONDS = 3.0


class WriteInterrupted(WriteError):
    pass


@dataclass
class WorkerFailure:
    """What a worker sends home when it fails: picklable, with the source index it was on."""

    index: int | None
    error: BaseException
    traceback: str


class CheckedDataset:
    """The source seen through the sample contract: every sample is checked before ffcv encodes it.

    Also remembers the index being written, so a failure inside ffcv's own encode can be named.
    """

    def __init__(self, spec: DatasetSpec, source):
        self.spec = spec
        self.source = source
        self.current_index: int | None = None
        self._seed_global_rng = any(f.options.get("write_mode") == "proportion" for f in spec.fields)

    def __len__(self) -> int:
        return len(self.source)

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
        return check_sample(self.spec, sample, index)


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
    sizes: dict[str, int] = {}
    for (name, field), value in zip(fields.items(), values):
        requested: list[int] = []

        def malloc(n: int):
            requested.append(n)  # noqa: B023 - called by this iteration's encode only
            return 0, np.empty(n, dtype=np.uint8)

        field.encode(np.zeros(1, dtype=field.metadata_type), value, malloc)
        sizes[name] = sum(requested)
    return sizes


def _human(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return f"{nbytes}B"


def _worker_job(
    dataset: CheckedDataset,
    error_queue: Queue,
    input_queue,
    metadata_sm,
    metadata_type,
    fields,
    allocator,
    done_number,
    allocations_queue,
) -> None:
    """ffcv's worker_job_indexed_dataset, except that a failure is reported at once and the worker exits.

    ffcv runs its loop inside ``with allocator:``, whose exit flushes the page, and flushing waits for
    the other workers' earlier pages: a failing worker could wait there a long time before anyone
    learned of its error. A failed write is discarded anyway, so nothing is flushed after a failure.
    """
    from ffcv.writer import handle_sample

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what Ctrl-C means
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a file-size limit then raises EFBIG, which we report
    try:
        metadata = np.frombuffer(metadata_sm.buf, dtype=metadata_type)
        field_names = metadata_type.names
        allocator.__enter__()
        while (chunk := input_queue.get()) is not None:
            for dest_ix, source_ix in chunk:
                sample = dataset[source_ix]
                handle_sample(sample, dest_ix, field_names, metadata, allocator, fields)
                with done_number.get_lock():  # per sample: a work item may be a whole shard
                    done_number.value += 1
        allocator.__exit__(None, None, None)
        allocations_queue.put(allocator.allocations)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent
        error = _explain(dataset, fields, exc)
        index = error.index if isinstance(error, SampleError) else dataset.current_index
        error_queue.put(WorkerFailure(index, _picklable(error), traceback.format_exc()))
        error_queue.close()
        error_queue.join_thread()
        os._exit(1)


def _explain(dataset: CheckedDataset, fields: dict, exc: BaseException) -> BaseException:
    """Turns an exception raised inside ffcv's encode into one naming the dataset, field and index."""
    if isinstance(exc, (SampleError, SourceError, WriteError)):
        return exc
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
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


def disk_full_error(dataset: str, exc: OSError) -> WriteError:
    return WriteError(
        f"dataset '{dataset}': the disk is full (or a file-size limit was reached) while writing: "
        f"{exc.strerror or exc}; free space or point `results` at a larger disk, then run again"
    )


def _picklable(error: BaseException) -> BaseException:
    try:
        import pickle

        pickle.loads(pickle.dumps(error))  # both ways: an exception can pickle but not unpickle
        return error
    except Exception:  # noqa: BLE001 - any failure to round-trip means: send a plain copy
        return WriteError(f"{type(error).__name__}: {error}")


def _safe_writer_class():
    from ffcv.memory_allocator import MemoryAllocator
    from ffcv.writer import DatasetWriter

    class SafeDatasetWriter(DatasetWriter):
        """DatasetWriter whose parent loop watches for worker failures instead of spinning forever."""

        def __init__(self, *args, progress: Progress, **kwargs):
            super().__init__(*args, **kwargs)
            self.progress = progress
            self.metadata_sm = None
            self.error_queue: Queue = Queue()

        def _write_common(self, num_samples, queue_content, work_fn, extra_worker_args):
            (dataset,) = extra_worker_args
            self.dataset_name = dataset.spec.name
            self.num_samples = num_samples
            self.prepare()
            self.queues = [workqueue := Queue(), allocations_queue := Queue(), self.error_queue]
            for todo in queue_content:
                workqueue.put(todo)
            for _ in range(self.num_workers):
                workqueue.put(None)
            done_number = Value(ctypes.c_uint64, 0)
            allocator = MemoryAllocator(self.fname, self.data_region_start, self.page_size)
            worker_args = (
                dataset,
                self.error_queue,
                workqueue,
                self.metadata_sm,
                self.metadata_type,
                self.fields,
                allocator,
                done_number,
                allocations_queue,
            )
            self.processes = [
                Process(target=_worker_job, args=worker_args, daemon=True) for _ in range(self.num_workers)
            ]
            for p in self.processes:
                p.start()
            self._wait_for_workers(done_number)
            allocations = []
            for _ in self.processes:
                allocations.extend(self._get_allocations(allocations_queue))
            self.finalize(allocations)

        def _wait_for_workers(self, done_number) -> None:
            while True:
                self._raise_worker_failure()
                done = done_number.value
                self.progress.update(done)
                if done == self.num_samples:
                    break
                if all(p.exitcode is not None for p in self.processes):
                    self._raise_worker_failure(wait=ERROR_GRACE_SECONDS)
                    raise WriteError(f"all writer workers exited after {done} of {self.num_samples} samples")
                time.sleep(0.05)
            self.progress.close()

        def _get_allocations(self, allocations_queue) -> list:
            while True:
                try:
                    return allocations_queue.get(timeout=0.2)
                except queue.Empty:
                    self._raise_worker_failure()

        def _raise_worker_failure(self, wait: float = 0.0) -> None:
            failures = self._drain_errors(wait)
            dead = [p for p in self.processes if p.exitcode not in (None, 0)]
            if dead and not failures:
                failures = self._drain_errors(ERROR_GRACE_SECONDS)
            if failures:
                # Other workers may be failing at smaller indices: give them a moment, keep the smallest.
                failures += self._drain_errors(ERROR_GRACE_SECONDS)
                first = min(failures, key=lambda f: f.index if f.index is not None else sys.maxsize)
                first.error.worker_traceback = first.traceback
                raise first.error
            if dead:
                codes = ", ".join(_describe_exit(p.exitcode) for p in dead)
                raise WriteError(
                    f"dataset '{self.dataset_name}': a writer worker died without reporting an error ({codes}) "
                    f"after {self.progress.done} of {self.num_samples} samples were written; a kill by signal 9 "
                    "is often the kernel's out-of-memory killer; rerun with writer.num_workers: 1 to find the sample"
                )

        def _drain_errors(self, wait: float) -> list[WorkerFailure]:
            failures, deadline = [], time.monotonic() + wait
            while True:
                try:
                    failures.append(self.error_queue.get(timeout=max(0.0, deadline - time.monotonic()) or 0.001))
                except queue.Empty:
                    return failures

        def shutdown(self) -> None:
            """Ends every worker and releases the shared memory, whatever state the write is in."""
            for p in getattr(self, "processes", []):
                if p.exitcode is None:
                    p.terminate()
            deadline = time.monotonic() + TERMINATE_GRACE_SECONDS
            for p in getattr(self, "processes", []):
                p.join(timeout=max(0.0, deadline - time.monotonic()))
                if p.exitcode is None:
                    p.kill()
                    p.join()
            for q in getattr(self, "queues", []):
                # Work left in a queue whose readers are gone would make this process wait for
                # its feeder thread at exit: a hang after the error was already reported.
                q.cancel_join_thread()
                q.close()
            if self.metadata_sm is not None:
                with contextlib.suppress(Exception):
                    self.metadata_sm.close()
                with contextlib.suppress(FileNotFoundError):
                    self.metadata_sm.unlink()
                self.metadata_sm = None

    return SafeDatasetWriter


def _describe_exit(code: int) -> str:
    if code < 0:
        return f"killed by signal {-code} ({signal.Signals(-code).name})"
    return f"exit code {code}"


@contextlib.contextmanager
def _signals_raise():
    """SIGTERM/SIGINT during a write become an exception, so cleanup runs (Snakemake sends SIGTERM)."""

    def handler(signum, _frame):
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
) -> dict[str, Any]:
    """Writes ``source[order[i]]`` as sample i of ``target``; returns a record of the write.

    ``work_items`` (lists of (sample, source index)) replaces the even chunks of ``chunksize``,
    e.g. one item per webdataset shard so each shard is read once, by one worker.
    """
    log = log or sys.stderr
    dataset = CheckedDataset(spec, source)
    fields = build_fields(spec)
    num_workers = max(1, min(num_workers, len(order)))
    progress = Progress(label or spec.name, len(order), stream=log)
    writer_class = _safe_writer_class()
    started = time.monotonic()
    with atomic_path(target) as tmp, _signals_raise():
        writer = writer_class(
            str(tmp), fields, page_size=spec.writer.page_size, num_workers=num_workers, progress=progress
        )
        try:
            if work_items is None:
                writer.from_indexed_dataset(dataset, indices=order, chunksize=spec.writer.chunksize)
            else:
                writer._write_common(len(order), work_items, None, (dataset,))
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
                raise disk_full_error(spec.name, exc) from exc
            raise
        finally:
            writer.shutdown()
    return {
        "num_samples": int(len(order)),
        "num_workers": num_workers,
        "page_size": spec.writer.page_size,
        "chunksize": spec.writer.chunksize,
        "seconds": round(time.monotonic() - started, 3),
    }
