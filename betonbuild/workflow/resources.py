"""Memory (mem_mb) and time limit (runtime, minutes) of every rule's job, from the dataset.

A cluster scheduler packs jobs by these; ``rules/resources.smk`` passes each rule's wildcards,
input, threads and attempt here. A profile overrides any of them per rule, e.g.
  set-resources: {write: {mem_mb: 64000, runtime: 600}}   set-threads: {write: 16}

What a job holds in RAM:
  every job          one Python process that imported ffcv, torch and numba (PROCESS_MB)
  + an .npz source   its arrays, loaded whole (.npy columns are memory-mapped, images read lazily)
  + the sample order one int64 per sample
  write, smoke       + the metadata table in shared memory (samples x record size); the smoke
                     stage holds the whole dataset's order beside its own samples' table
                     + per worker (the job's threads) two page buffers and one forked process
                     (the work plan is the order itself; allocation records go to temp files)
                     an iterable: one part's samples as yielded, then the merge of the parts
  verify(_smoke)     + a flag or two per position, + the windows its passes read of the mapped
                     file and source (their pages unmapped as they go: a few million samples'
                     worth), + what it decodes: fixed-size fields in chunks of 4096 rows, one
                     ffcv.Loader batch (in the write job, or a process that maps the tables)
  merge              + the parts' tables, in blocks of 2^18 rows
Both are multiplied by the attempt: with `retries` in the profile, a job killed for running out
of memory or time is resubmitted asking for more.

The sizes come from results/{ds}/source.json (the rule's `manifest` input) once it exists, which
is before any job that reads it is scheduled; before that (dry runs) from the config.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np

from betonbuild.beton.format import CUSTOM_TYPE_ID, POINTER_TYPES
from betonbuild.beton.merge_tables import BLOCK_ROWS
from betonbuild.config.spec import ORDER_BYTES_PER_SAMPLE, DatasetSpec, count_indices
from betonbuild.errors import SourceError
from betonbuild.fields import field_kind, metadata_type
from betonbuild.sources import adapter_files, gathers_fixed_values_one_by_one, source_class
from betonbuild.verify import CHUNK_ROWS, resolve_mode
from betonbuild.write.pages import PAGE_BUFFERS

MB = 1 << 20
PROCESS_MB = 768  # measured: a job that imported ffcv and torch peaks at 430-530 MB
WORKER_MB = 256  # a forked writer worker, beyond its page buffers
ALLOCATION_BYTES = 24  # one allocation-table entry: sample id, pointer, size
PYTHON_VALUE_BYTES = 160  # a numpy value in a Python list (verifying a python source)
# verification: every pass over the file (structural checks, content digest, comparison) reads its
# mapped tables and payloads in windows and unmaps what it read, so only the passes' windows are
# resident, about this many samples' worth at once (1M between the comparison's unmappings, what the
# pool holds ahead, the digest's 256 blocks); per sample of the whole file it holds the order (8
# bytes, in _base_mb) and per-position flags. Measured at 100M rows of float32[4] + int64: see
# docs/cluster.md.
VERIFY_WINDOW_SAMPLES = 4_000_000
VERIFY_POSITION_BYTES = 8  # per position of the file: which are compared, and similar flags
VERIFY_LIVE_CHUNKS = 3  # chunks of fixed-size values alive at once (one per thread of a 2-core job, and one merging)
LOADER_COPIES = 2  # ffcv.Loader's batch buffer and our decoded copy of it
UNKNOWN_LENGTH = 1_000_000  # a python/webdataset source's length before its manifest exists
# The manifest job is the first to learn such a source's length: it asks for room for an order of
# this many samples (256 MB) and refuses a longer source before allocating (check_manifest_memory)
MANIFEST_ORDER_ROOM = 32_000_000
MIN_RUNTIME = 10  # minutes: start-up, imports, numba compilation, a loaded file system
SAFETY = 2  # the runtime estimates below are multiplied by this
READ_MB_PER_S = 100  # hashing or reading files on a shared file system
DEMO_DATA_MB = 2048


# -- Sizes of one sample and of the job's samples --


def read_manifest(path: str | None) -> dict[str, Any] | None:
    """results/{ds}/source.json once it exists (the rule's `manifest` input), else None."""
    if path and os.path.exists(path):
        with open(path) as fh:
            return json.load(fh)
    return None


def num_samples(spec: DatasetSpec, manifest: dict[str, Any] | None) -> int:
    """Samples of the full file: from the manifest, else estimated from the config."""
    if manifest and manifest["num_samples"] is not None:  # None: an iterable's, before its write
        return int(manifest["num_samples"])
    length = source_class(spec).estimated_length(spec)
    if length is None:
        return UNKNOWN_LENGTH
    return count_indices(spec.writer, length)


def record_bytes(spec: DatasetSpec) -> int:
    """Bytes of one sample's metadata record: ffcv aligns the per-field types like this."""
    fields = [(f.name, metadata_type(f)) for f in spec.fields]
    return np.dtype(fields, align=True).itemsize


def fixed_bytes(spec: DatasetSpec) -> int:
    """Payload bytes of one sample's fixed-size fields."""
    return sum(field_kind(field).fixed_bytes(field) for field in spec.fields)


def decoded_bytes(spec: DatasetSpec) -> int:
    """Upper bound of one decoded sample."""
    return sum(field_kind(field).decoded_bytes(field, spec.writer.page_size) for field in spec.fields)


def seconds_per_sample(spec: DatasetSpec) -> float:
    """One core's time to read, check and encode one sample's values."""
    return sum(field_kind(field).cost_per_sample_s for field in spec.fields)


def _fixed_fields(spec: DatasetSpec) -> int:
    return sum(field_kind(field).fixed_size for field in spec.fields)


def smoke_samples(spec: DatasetSpec, manifest: dict[str, Any] | None) -> int:
    """The smoke file's samples: the first k and k seeded-random others."""
    return min(2 * spec.smoke_samples, num_samples(spec, manifest))


def part_samples(spec: DatasetSpec, manifest: dict[str, Any] | None, part: int) -> int:
    """Samples of one part: planned in the manifest, else an even share of the estimate."""
    if manifest:
        return int(manifest["partitions"][part]["num_samples"])
    total = num_samples(spec, manifest)
    if spec.partitions.samples is not None:
        return min(total, spec.partitions.samples)
    return math.ceil(total / (spec.partitions.count or 1))


def input_bytes(spec: DatasetSpec, manifest: dict[str, Any] | None) -> int:
    """Bytes of the source's input files: from the manifest, else from the files on disk."""
    if manifest:
        return int(manifest["inputs"]["bytes"])
    return source_class(spec).estimated_bytes(spec) + _files_bytes(adapter_files(spec))


def _mb(nbytes: float) -> int:
    return math.ceil(nbytes / MB)


def _minutes(seconds: float, attempt: int) -> int:
    return (MIN_RUNTIME + math.ceil(SAFETY * seconds / 60)) * attempt


def _files_bytes(paths) -> int:
    return sum(os.path.getsize(path) for path in paths if os.path.isfile(path))


def _base_mb(spec: DatasetSpec, samples: int) -> int:
    return PROCESS_MB + _mb(source_class(spec).resident_bytes(spec) + samples * ORDER_BYTES_PER_SAMPLE)


def _write_mb(spec: DatasetSpec, samples: int, workers: int) -> int:
    table = samples * record_bytes(spec)
    return _base_mb(spec, samples) + _mb(table) + workers * (WORKER_MB + _mb(PAGE_BUFFERS * spec.writer.page_size))


def _allocations(spec: DatasetSpec, samples: int) -> int:
    """One allocation per sample for each field that stores a payload (int and float fields store
    none; a custom field is counted as one)."""
    kinds = [field_kind(f).type_id for f in spec.fields]
    return samples * sum(t in POINTER_TYPES or t == CUSTOM_TYPE_ID for t in kinds)


def _verify_mb(spec: DatasetSpec, samples: int) -> int:
    window = min(samples, VERIFY_WINDOW_SAMPLES)
    per_window_sample = record_bytes(spec) + 2 * fixed_bytes(spec)  # the file's record and payload, the source's row
    mapped = window * per_window_sample + _allocations(spec, window) * ALLOCATION_BYTES
    table = samples * VERIFY_POSITION_BYTES + mapped
    chunk = min(samples, CHUNK_ROWS) * VERIFY_LIVE_CHUNKS
    if gathers_fixed_values_one_by_one(spec):
        fixed = chunk * (2 * fixed_bytes(spec) + _fixed_fields(spec) * PYTHON_VALUE_BYTES)
    else:
        fixed = chunk * fixed_bytes(spec)
    batch = min(samples, spec.verify["loader_batch"]) * decoded_bytes(spec) * LOADER_COPIES
    return _base_mb(spec, samples) + _mb(table + fixed + batch)


# -- Per rule: what rules/resources.smk asks for --


def source_manifest_mem_mb(spec: DatasetSpec, manifest: dict[str, Any] | None, attempt: int = 1) -> int:
    if source_class(spec).estimated_length(spec) is None:
        return _base_mb(spec, MANIFEST_ORDER_ROOM) * attempt
    return _base_mb(spec, num_samples(spec, manifest)) * attempt


def check_manifest_memory(spec: DatasetSpec, length: int, declared_mb: int) -> None:
    """Refuses (SourceError), before the order is built, a source longer than the manifest job's
    memory was declared for: on a cluster the job would be killed, or take a node's memory from
    other jobs. The fix names the figure that lets it run."""
    needed = _base_mb(spec, count_indices(spec.writer, length))
    if needed > declared_mb:
        raise SourceError(
            spec.name,
            f"the source has {length:,} samples: the source_manifest job needs about {needed:,} MB for their "
            f"order, more than the {declared_mb:,} MB it was given (mem_mb, estimated before the length was "
            f"known); run again as `snakemake <targets> --set-resources source_manifest:mem_mb={needed}` (the "
            "option last: it takes several values), or set it under set-resources in your profile, or select "
            "fewer samples with writer.indices",
        )


def source_manifest_runtime(input_paths, attempt: int = 1) -> int:
    """Every input file of the job is read once and hashed (the listings' files by their own jobs)."""
    return _minutes(_files_bytes(input_paths) / MB / READ_MB_PER_S, attempt)


def listing_runtime(spec: DatasetSpec, attempt: int = 1) -> int:
    """shard_list, file_list: every shard or image file read and hashed (the first time; later only
    the changed ones)."""
    return _minutes(source_class(spec).estimated_bytes(spec) / MB / READ_MB_PER_S, attempt)


def write_threads(spec: DatasetSpec, cores: int) -> int:
    """The write's threads (its ffcv workers): writer.num_workers, at most --cores; -1 means --cores."""
    workers = spec.writer.num_workers
    return cores if workers < 1 else min(workers, cores)


def write_mem_mb(spec: DatasetSpec, manifest: dict[str, Any] | None, threads: int, attempt: int = 1) -> int:
    if source_class(spec).one_pass:
        return _stream_write_mb(spec, manifest, threads) * attempt
    return _write_mb(spec, num_samples(spec, manifest), threads) * attempt


def _stream_write_mb(spec: DatasetSpec, manifest: dict[str, Any] | None, threads: int) -> int:
    """An iterable's write: one part at a time, whose samples it holds as they were yielded (copied),
    the largest of the first ones (the manifest's ``stream.sample_bytes``) standing for each; then
    the merge of the parts, in blocks. Before the manifest exists: the decoded size of a sample."""
    part = source_class(spec).samples_per_part(spec)
    sample = ((manifest or {}).get("stream") or {}).get("sample_bytes") or decoded_bytes(spec)
    held = part * (sample + len(spec.fields) * PYTHON_VALUE_BYTES)
    return _write_mb(spec, part, threads) + _mb(held)


def write_runtime(spec: DatasetSpec, manifest: dict[str, Any] | None, threads: int, attempt: int = 1) -> int:
    samples = num_samples(spec, manifest)
    encode = samples * seconds_per_sample(spec) / max(threads, 1)
    io = (input_bytes(spec, manifest) + samples * fixed_bytes(spec)) / MB / READ_MB_PER_S
    return _minutes(encode + io, attempt)


def smoke_mem_mb(spec: DatasetSpec, manifest: dict[str, Any] | None, attempt: int = 1) -> int:
    """The write of the smoke samples, beside the whole dataset's order: the smoke stage draws its
    samples from it and surveys the largest of them (100M rows: 800 MB of a 1.7 GB job)."""
    order = num_samples(spec, manifest) * ORDER_BYTES_PER_SAMPLE
    return (_write_mb(spec, smoke_samples(spec, manifest), 1) + _mb(order)) * attempt


def smoke_runtime(spec: DatasetSpec, manifest: dict[str, Any] | None, attempt: int = 1) -> int:
    """The smoke samples, plus a look for the largest samples of the source."""
    return _minutes(smoke_samples(spec, manifest) * seconds_per_sample(spec), attempt)


def part_mem_mb(spec: DatasetSpec, manifest: dict[str, Any] | None, part: int, attempt: int = 1) -> int:
    return _write_mb(spec, part_samples(spec, manifest, part), 1) * attempt


def part_runtime(spec: DatasetSpec, manifest: dict[str, Any] | None, part: int, attempt: int = 1) -> int:
    """A part's share of the write, on its one worker (also the time limit of its verification)."""
    samples = part_samples(spec, manifest, part)
    share = samples / max(num_samples(spec, manifest), 1)
    encode = samples * seconds_per_sample(spec)
    io = (input_bytes(spec, manifest) * share + samples * fixed_bytes(spec)) / MB / READ_MB_PER_S
    return _minutes(encode + io, attempt)


def part_verify_mem_mb(spec: DatasetSpec, manifest: dict[str, Any] | None, part: int, attempt: int = 1) -> int:
    return _verify_mb(spec, part_samples(spec, manifest, part)) * attempt


def merge_mem_mb(spec: DatasetSpec, manifest: dict[str, Any] | None, attempt: int = 1) -> int:
    """The sample order, and the parts' tables checked, shifted and written in blocks of
    ``merge_tables.BLOCK_ROWS`` rows (a few MiB at any size)."""
    samples = num_samples(spec, manifest)
    block = min(samples, BLOCK_ROWS)
    tables = block * record_bytes(spec) + _allocations(spec, block) * ALLOCATION_BYTES
    return (PROCESS_MB + _mb(samples * ORDER_BYTES_PER_SAMPLE + 2 * tables)) * attempt


def merge_runtime(part_paths, attempt: int = 1) -> int:
    """A copy of every part's data region."""
    nbytes = sum(os.path.getsize(p) for p in part_paths if os.path.exists(p))
    return _minutes(nbytes / MB / READ_MB_PER_S, attempt)


def verify_mem_mb(spec: DatasetSpec, manifest: dict[str, Any] | None, attempt: int = 1) -> int:
    return _verify_mb(spec, num_samples(spec, manifest)) * attempt


def verify_runtime(
    spec: DatasetSpec, manifest: dict[str, Any] | None, beton_path: str | None, threads: int, attempt: int = 1
) -> int:
    """Every fixed-size value, the decoded variable-size samples (all of them in full mode, on the
    job's threads), and a hash of the whole file."""
    samples = num_samples(spec, manifest)
    if beton_path and os.path.exists(beton_path):
        nbytes = os.path.getsize(beton_path)
    else:
        nbytes = input_bytes(spec, manifest)
    fixed = samples * sum(field_kind(f).cost_per_sample_s for f in spec.fields if field_kind(f).fixed_size)
    decoded = samples if resolve_mode(spec, samples) == "full" else min(samples, spec.verify["samples"])
    variable = decoded * seconds_per_sample(spec) / max(threads, 1)
    return _minutes(fixed + variable + nbytes / MB / READ_MB_PER_S, attempt)


def verify_smoke_mem_mb(spec: DatasetSpec, manifest: dict[str, Any] | None, attempt: int = 1) -> int:
    return _verify_mb(spec, smoke_samples(spec, manifest)) * attempt


def verify_smoke_runtime(spec: DatasetSpec, manifest: dict[str, Any] | None, attempt: int = 1) -> int:
    return _minutes(smoke_samples(spec, manifest) * seconds_per_sample(spec), attempt)


def demo_data_mem_mb(attempt: int = 1) -> int:
    return DEMO_DATA_MB * attempt


def demo_data_runtime(attempt: int = 1) -> int:
    return MIN_RUNTIME * attempt
