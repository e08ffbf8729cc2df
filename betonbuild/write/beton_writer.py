"""betonbuild's .beton writer: ffcv 1.0.2's ``DatasetWriter`` file layout, byte for byte (with one
worker the same file as plain ffcv's), without importing ffcv, and unable to hang or to hold a
Python object per sample.

Why not ffcv's ``DatasetWriter``: plain ffcv spins forever when a worker raises (its parent only
polls a done-counter), and its memory grows per sample; and importing it imports torch and numba,
2-3 s of one core before the first sample of every write job (docs/performance.md). The fields it
is given write themselves through ffcv's Field interface: betonbuild's own encoders of ffcv's
built-in fields (``betonbuild.fields.builtin_encoders``) and shipped kinds need no ffcv; a
``torch_tensor`` or ``type: custom`` field brings ffcv's class (and import) with it. The data pages
are ffcv's allocator's (``betonbuild.write.pages``).

Each worker reports its exception on a queue and exits; the parent watches that queue and the
workers' exit codes and raises the first failure (``betonbuild.write.writer`` removes the temp file).

Memory (measured at 2M and 4M rows of float32[4] + int: ffcv ~490 bytes per sample in the parent):
ffcv builds ``list(enumerate(indices))`` and queues every chunk up front (~130 bytes a sample), each
worker keeps its allocations as a list of tuples until the end (~160 bytes an allocation), sends it
whole through a queue, and the parent unpickles all of them and turns each into a 0-d array before
``finalize`` (~300 bytes more). Here workers take items of a
``betonbuild.write.workplan.WorkPlan`` (numpy, inherited through fork) by number from a shared
counter; after each sample, once enough have gathered, a worker moves its allocation records into
its own unlinked temp file as ``ALLOC_TABLE_TYPE`` rows (at a sample boundary, so the retry on a
fresh page, which pops the current sample's records off the list's tail, still finds them there);
``finalize`` appends those files to the .beton. Same records in the same order as ffcv's.

The sample order, when the caller put it in shared memory (``mapped_pages.shared_array``: the
workflow's full write does), is dropped from each worker's mapping at the same pace: otherwise every
worker's RSS would count the whole order (800 MB at 100M rows) once it had taken its last item.

The metadata table itself (samples x record size, 2.4 GB at 100M rows) lives in shared memory once,
but every process counts the pages it touched in its own RSS: the workers their rows, the parent all
of them as it copies the table into the file. A job's summed RSS (Snakemake's benchmark, ``time``)
then held it twice. Each worker, every ``RELEASE_EVERY`` samples, and the parent, after each block
it copies, drop their mapping of those pages (``release_table_pages``); the content stays in
shared memory, and the next access maps it again.

The metadata block in shared memory is named ``betonbuild-shm-<pid>-<random>`` (ffcv's random
``psm_...`` name outlives a write killed with SIGKILL together with its resource tracker, in
/dev/shm for good), and the next write unlinks the blocks so named whose process no longer exists:
only betonbuild's, never a live one, never another program's.

Under ``bad_samples: {policy: skip}`` (``skips`` given) a worker that meets a bad sample takes its
allocation records back, reports it on a queue and goes on; ``finalize`` leaves the skipped rows
out of the metadata it copies, renumbers the allocation table's sample ids as it copies it and
lowers ``num_samples`` (the reasons are in ``betonbuild.write.skips``). Nothing skipped: ffcv's
layout, byte for byte.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import queue
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing import Process, Queue, Value, shared_memory
from pathlib import Path
from typing import Any

import numpy as np

from betonbuild.atomic import _alive
from betonbuild.beton.descriptors import field_descriptors, header_record, metadata_type
from betonbuild.beton.format import ALLOC_TABLE_TYPE, HEADER_TYPE
from betonbuild.errors import WriteError
from betonbuild.mapped_pages import release_mapped
from betonbuild.write.data_sync import DataSync
from betonbuild.write.pages import PageAllocator, encode_sample
from betonbuild.write.skips import kept_blocks, renumber
from betonbuild.write.workplan import WorkPlan

MIN_PAGE_SIZE = 1 << 21  # ffcv's bounds: 2 MiB, the most common huge page
MAX_PAGE_SIZE = 1 << 32  # the largest that does not overflow the header's <u4
ALLOCATIONS_PER_FLUSH = 1 << 16  # records a worker gathers before moving them to its file (1.5 MiB)
RELEASE_EVERY = 1 << 16  # samples a worker writes between releases of its table pages
COUNT_EVERY = 64  # samples a worker writes between additions to the shared done-counter (a lock each)
TABLE_BLOCK = 64 << 20  # bytes of the metadata table the parent copies into the file at a time
ERROR_GRACE_SECONDS = 1.0  # after a first failure, wait this long for failures at smaller indices
TERMINATE_GRACE_SECONDS = 3.0
SHM_DIR = Path("/dev/shm")  # where Linux keeps POSIX shared memory; absent elsewhere (nothing reclaimed)
SHM_PREFIX = "betonbuild-shm-"


def shm_name() -> str:
    return f"{SHM_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"


def reclaim_dead_writers_shm(shm_dir: Path = SHM_DIR) -> list[str]:
    """Unlinks the metadata blocks of betonbuild writes whose process no longer exists; returns their names."""
    reclaimed = []
    for entry in shm_dir.glob(f"{SHM_PREFIX}*"):
        pid = entry.name[len(SHM_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            with contextlib.suppress(FileNotFoundError, PermissionError):
                entry.unlink()
                reclaimed.append(entry.name)
    return reclaimed


@dataclass
class WorkerFailure:
    """What a worker sends home when it fails: picklable, with the source index it was on."""

    index: int | None
    error: BaseException
    traceback: str


def _worker_job(
    dataset,
    plan: WorkPlan,
    next_item,
    describe_failure: Callable[[Any, dict, BaseException], WorkerFailure],
    error_queue: Queue,
    metadata_sm,
    record_type,
    fields,
    allocator,
    done_number,
    allocation_fd: int,
    skips=None,
) -> None:
    """One writer process (ffcv's ``worker_job_indexed_dataset``, except that work items come from
    ``plan`` by number, the allocation records go to ``allocation_fd`` as they gather, and a failure
    is reported at once, as ``describe_failure(dataset, fields, exc)`` says it, and the worker exits).

    ffcv runs its loop inside ``with allocator:``, whose exit flushes the page even after a failure
    (and ffcv's flush waits for the other workers' earlier pages). A failed write is discarded
    anyway, so nothing is flushed after a failure: the error reaches the parent at once.

    ``skips`` (a ``betonbuild.write.writer.SkipBadSamples`` and its queue): a sample whose failure
    it describes as a sample's fault is left out and reported there instead.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what Ctrl-C means
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a file-size limit then raises EFBIG, which we report
    try:
        metadata = np.frombuffer(metadata_sm.buf, dtype=record_type)
        columns = [metadata[name] for name in record_type.names]
        allocator.__enter__()
        written = counted = 0
        while (item := _take(next_item)) < plan.num_items:
            destinations, sources = plan.item(item)
            for dest_ix, source_ix in zip(destinations, sources):
                written += 1
                if written % RELEASE_EVERY == 0:
                    release_table_pages(metadata_sm)
                    release_mapped(plan.sources, plan.destinations)  # an order in shared memory: its pages read
                if skips is None:
                    encode_sample(dataset[source_ix], int(dest_ix), columns, allocator, fields.values())
                elif _encode_or_skip(dataset, source_ix, int(dest_ix), columns, allocator, fields, skips):
                    _stop_after_skips(skips[1])
                if len(allocator.allocations) >= ALLOCATIONS_PER_FLUSH:
                    _move_allocations(allocator, allocation_fd)
                if written - counted == COUNT_EVERY:  # within an item too: an item may be a whole shard
                    _count_done(done_number, written - counted)
                    counted = written
            _count_done(done_number, written - counted)
            counted = written
        allocator.__exit__(None, None, None)
        _move_allocations(allocator, allocation_fd)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent
        error_queue.put(describe_failure(dataset, fields, exc))
        error_queue.close()
        error_queue.join_thread()
        os._exit(1)


def _encode_or_skip(dataset, source_ix, dest_ix, columns, allocator, fields, skips) -> bool:
    """``encode_sample``, except that a bad sample is reported on ``skips``' queue and left out:
    its allocation records (all still at the list's tail: records move to the file only between
    samples) are taken back, as the retry on a fresh page does. True: the write is over its
    limit of bad samples and stops."""
    policy, skip_queue = skips
    try:
        encode_sample(dataset[source_ix], dest_ix, columns, allocator, fields.values())
    except BaseException as exc:  # noqa: BLE001 - the policy says which failures are the sample's
        skipped = policy.describe(dataset, fields, exc, dest_ix, source_ix)
        if skipped is None:
            raise
        allocator.take_back(dest_ix)
        skip_queue.put(skipped)
        return policy.over_limit()
    return False


def _stop_after_skips(skip_queue: Queue) -> None:
    """Ends a worker whose skip went over the limit: its records reach the parent, which stops the
    write (nothing is flushed: the write is discarded)."""
    skip_queue.close()
    skip_queue.join_thread()
    os._exit(0)


def release_table_pages(metadata_sm: shared_memory.SharedMemory, start: int = 0, length: int = 0) -> None:
    """This process's mapping of the metadata table's pages (from ``start``, ``length`` bytes, 0:
    to the end) dropped: they no longer count in its RSS, their content stays in shared memory
    (madvise(2): a shared mapping's pages are mapped again from it on the next access)."""
    if length or start < metadata_sm.size:
        metadata_sm._mmap.madvise(mmap.MADV_DONTNEED, start, length or metadata_sm.size - start)  # CPython 3.11's mmap


def write_table(fp, metadata_sm: shared_memory.SharedMemory, blocks) -> None:
    """The metadata table's bytes ``[start, stop)`` of each block, written to ``fp`` in pieces of
    ``TABLE_BLOCK`` bytes, each piece's pages released once written."""
    with memoryview(metadata_sm.buf) as table:
        for start, stop in blocks:
            for at in range(start, stop, TABLE_BLOCK):
                end = min(stop, at + TABLE_BLOCK)
                fp.write(table[at:end])
                aligned = at - at % mmap.PAGESIZE
                release_table_pages(metadata_sm, aligned, end - aligned)


def _count_done(done_number, samples: int) -> None:
    """Adds ``samples`` written to the counter that the parent's progress and its end wait on."""
    if samples:
        with done_number.get_lock():
            done_number.value += samples


def _take(counter) -> int:
    """The next work item's number, shared by every worker (what ffcv's work queue did)."""
    with counter.get_lock():
        taken = counter.value
        counter.value = taken + 1
    return taken


def _move_allocations(allocator, fd: int) -> None:
    """Appends the allocator's records to ``fd`` as allocation-table rows and forgets them. Called
    between samples only: the retry of a sample on a fresh page pops that sample's records off
    the list's tail."""
    if allocator.allocations:
        data = memoryview(np.array(allocator.allocations, dtype=ALLOC_TABLE_TYPE)).cast("B")
        while data.nbytes:
            data = data[os.write(fd, data) :]
        allocator.allocations.clear()


class BetonWriter:
    """Writes a .beton from a dataset with ``num_workers`` forked processes; its parent loop watches
    for worker failures (ffcv's spins forever)."""

    def __init__(
        self,
        fname: str,
        fields: Mapping[str, Any],
        page_size: int,
        num_workers: int,
        *,
        progress,
        describe_failure,
        skip_policy=None,
        watch=None,
    ):
        if page_size & (page_size - 1) or not MIN_PAGE_SIZE <= page_size < MAX_PAGE_SIZE:
            raise ValueError(f"page_size must be a power of 2 in [{MIN_PAGE_SIZE}, {MAX_PAGE_SIZE}), not {page_size}")
        self.fname, self.fields, self.page_size, self.num_workers = fname, fields, page_size, num_workers
        self.metadata_type = metadata_type(fields)
        self.progress = progress
        self.describe_failure = describe_failure
        self.skip_policy = skip_policy  # None: a bad sample fails the write (ffcv's path exactly)
        self.skipped: list = []
        self.skip_queue: Queue | None = None
        self.metadata_sm = None
        self.data_sync: DataSync | None = None  # the pages made durable as they are written
        self.error_queue: Queue = Queue()
        self.watch = watch or (lambda: None)  # called by the parent loop: an exception raised there ends the write

    def prepare(self) -> None:
        """The header and field descriptors written, the metadata table's shared memory created
        (``DatasetWriter.prepare``'s layout: the table follows the descriptors, the pages follow it)."""
        reclaim_dead_writers_shm()
        descriptors = field_descriptors(self.fields)
        self.header = header_record(len(self.fields), self.page_size, self.num_samples)
        with open(self.fname, "wb") as fp:
            fp.write(self.header.tobytes())  # written again at the end, with the allocation table's place
            fp.write(descriptors.tobytes())
        table_bytes = self.num_samples * self.metadata_type.itemsize
        self.metadata_start = HEADER_TYPE.itemsize + descriptors.nbytes
        self.metadata_sm = shared_memory.SharedMemory(name=shm_name(), create=True, size=table_bytes)
        self.data_region_start = self.metadata_start + table_bytes

    def write(self, dataset, plan: WorkPlan) -> None:
        """Writes sample ``d`` from ``dataset[source]`` for every (d, source) of ``plan``."""
        self.dataset_name = dataset.spec.name
        self.num_samples = plan.num_samples
        self.prepare()
        self.queues = [self.error_queue]
        skips = None
        if self.skip_policy is not None:
            self.skip_queue = Queue()
            self.queues.append(self.skip_queue)
            skips = (self.skip_policy, self.skip_queue)
        directory = os.path.dirname(os.path.abspath(self.fname))
        # unlinked at once: nothing is left behind, whatever ends this process
        self.allocation_logs = [tempfile.TemporaryFile(dir=directory) for _ in range(self.num_workers)]
        next_item = Value(ctypes.c_int64, 0)
        done_number = Value(ctypes.c_uint64, 0)
        allocator = PageAllocator(self.fname, self.data_region_start, self.page_size)
        shared = (self.describe_failure, self.error_queue, self.metadata_sm, self.metadata_type, self.fields)
        self.processes = [
            Process(
                target=_worker_job,
                args=(dataset, plan, next_item, *shared, allocator, done_number, log.fileno(), skips),
                daemon=True,
            )
            for log in self.allocation_logs
        ]
        for p in self.processes:
            p.start()
        self.data_sync = DataSync(self.fname, lambda: allocator.next_page_allocated.value).start()
        self._wait_for_workers(done_number)
        self._join_workers()
        self.data_sync.stop()
        self.finalize(self.allocation_logs)

    def _wait_for_workers(self, done_number) -> None:
        while True:
            self._raise_worker_failure()
            self._collect_skips()
            self.watch()
            done = done_number.value
            self.progress.update(done)
            if done == self.num_samples:
                break
            if all(p.exitcode is not None for p in self.processes):
                self._raise_worker_failure(wait=ERROR_GRACE_SECONDS)
                self._collect_skips(wait=ERROR_GRACE_SECONDS)  # a worker over the limit of bad samples
                raise WriteError(f"all writer workers exited after {done} of {self.num_samples} samples")
            time.sleep(0.05)
        self.progress.close()

    def _join_workers(self) -> None:
        """Waits for every worker to flush its last page and allocation records and exit."""
        while any(p.exitcode is None for p in self.processes):
            self._raise_worker_failure()
            self._collect_skips()
            self.watch()
            time.sleep(0.01)
        self._raise_worker_failure()
        self._collect_skips(wait=0.01)

    def _collect_skips(self, wait: float = 0.0) -> None:
        """Gathers the workers' skipped samples; the policy stops the write beyond its limit."""
        if self.skip_queue is None:
            return
        new = self._drain(self.skip_queue, wait)
        if new:
            self.skipped.extend(new)
            self.skip_policy.check(self.skipped)

    def finalize(self, allocation_logs) -> None:
        """The metadata table copied into the file, the allocation table appended from the workers'
        files, the header written again (ffcv's ``finalize``)."""
        if self.skipped:
            self._finalize_without_skipped(allocation_logs)
            return
        with open(self.fname, "r+b") as fp:
            fp.seek(self.metadata_start)
            write_table(fp, self.metadata_sm, [(0, self.metadata_sm.size)])
            allocation_table_location = fp.seek(0, os.SEEK_END)
            for log in allocation_logs:
                log.seek(0)
                shutil.copyfileobj(log, fp, 1 << 20)
            self.header["alloc_table_ptr"] = allocation_table_location
            fp.seek(0)
            fp.write(self.header.tobytes())

    def _finalize_without_skipped(self, allocation_logs) -> None:
        """finalize for a write with skipped samples: their metadata rows left out, the
        allocation table's sample ids renumbered (streamed in blocks), ``num_samples`` lowered."""
        positions = np.array(sorted(s.position for s in self.skipped), dtype=np.int64)
        row, block = self.metadata_type.itemsize, ALLOC_TABLE_TYPE.itemsize * ALLOCATIONS_PER_FLUSH
        with open(self.fname, "r+b") as fp:
            fp.seek(self.metadata_start)
            kept = kept_blocks(self.num_samples, positions)
            write_table(fp, self.metadata_sm, [(start * row, stop * row) for start, stop in kept])
            allocation_table_location = fp.seek(0, os.SEEK_END)  # no data pages: right after the rows
            for log in allocation_logs:
                log.seek(0)
                while chunk := log.read(block):
                    fp.write(renumber(np.frombuffer(chunk, dtype=ALLOC_TABLE_TYPE), positions).tobytes())
            self.header["num_samples"] = self.num_samples - len(positions)
            self.header["alloc_table_ptr"] = allocation_table_location
            fp.seek(0)
            fp.write(self.header.tobytes())

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
        return self._drain(self.error_queue, wait)

    @staticmethod
    def _drain(source: Queue, wait: float) -> list:
        items, deadline = [], time.monotonic() + wait
        while True:
            try:
                items.append(source.get(timeout=max(0.0, deadline - time.monotonic()) or 0.001))
            except queue.Empty:
                return items

    def shutdown(self) -> None:
        """Ends every worker and releases the shared memory, whatever state the write is in."""
        # A start() interrupted by a signal leaves a Process that never ran: nothing to end.
        if self.data_sync is not None:
            self.data_sync.stop(wait=False)
        started = [p for p in getattr(self, "processes", []) if p.pid is not None]
        for p in started:
            if p.exitcode is None:
                p.terminate()
        deadline = time.monotonic() + TERMINATE_GRACE_SECONDS
        for p in started:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
            if p.exitcode is None:
                p.kill()
                p.join()
        for log in getattr(self, "allocation_logs", []):
            log.close()
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


def _describe_exit(code: int) -> str:
    if code < 0:
        return f"killed by signal {-code} ({signal.Signals(-code).name})"
    return f"exit code {code}"
