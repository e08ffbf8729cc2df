# Memory (mem_mb) and time limit (runtime, minutes) of every rule, computed from the dataset, so
# that a cluster scheduler can pack jobs. A profile overrides any of them per rule, e.g.
#   set-resources: {write: {mem_mb: 64000, runtime: 600}}   set-threads: {write: 16}
#
# Threads are the rules' own (`threads:`): 1, and for write and verify writer.num_workers, at most
# --cores.
# What a job holds in RAM:
#   every job          one Python process that imported ffcv, torch and numba (PROCESS_MB)
#   + an .npz source   its arrays, loaded whole (.npy columns are memory-mapped, images read lazily)
#   + the sample order two int64 per sample
#   write, smoke       + the metadata table in shared memory (samples x record size)
#                      + per worker (the job's threads) one page buffer and one forked process
#   verify(_smoke)     + the metadata table, + what it decodes: fixed-size fields in chunks (every
#                      sample's at once for python and webdataset sources), one ffcv.Loader batch
# Both are multiplied by the attempt: with `retries` in the profile, a job killed for running out
# of memory or time is resubmitted asking for more.
#
# The sizes come from results/{ds}/source.json (the rule's `manifest` input) once it exists,
# which is before any job that reads it is scheduled; before that (dry runs) from the config.

import json
import math
import os
import zipfile

import numpy as np

from betonbuild.fields import field_kind, metadata_type
from betonbuild.verify import CHUNK_ROWS, resolve_mode

MB = 1 << 20
PROCESS_MB = 768  # measured: a job that imported ffcv and torch peaks at 430-530 MB
WORKER_MB = 256  # a forked writer worker, beyond its page buffer
ORDER_BYTES_PER_SAMPLE = 16  # the index range and its seeded permutation, int64 each
ALLOCATION_BYTES = 24  # one allocation-table entry: sample id, pointer, size
PYTHON_VALUE_BYTES = 160  # a numpy value in a Python list (verifying a python source)
LOADER_COPIES = 2  # ffcv.Loader's batch buffer and our decoded copy of it
UNKNOWN_LENGTH = (
    1_000_000  # a python/webdataset source's length before its manifest exists
)
MIN_RUNTIME = 10  # minutes: start-up, imports, numba compilation, a loaded file system
SAFETY = 2  # the runtime estimates below are multiplied by this
READ_MB_PER_S = 100  # hashing or reading files on a shared file system
SECONDS_PER_SAMPLE = {  # reading, checking and encoding one value, one core
    "rgb_image": 0.05,
    "bytes": 0.002,
    "json": 0.002,
}
SECONDS_PER_FIXED_VALUE = 0.0002


def _spec(wildcards):
    return DATASETS[wildcards.ds]


def _manifest(input):
    path = input.get("manifest")
    if path and os.path.exists(path):
        with open(path) as fh:
            return json.load(fh)
    return None


def _array_headers(path):
    """(shape, dtype) of every array of an .npy or .npz file, from its header alone."""
    if path.endswith(".npy"):
        array = np.load(path, mmap_mode="r", allow_pickle=False)
        return {"": (array.shape, array.dtype)}
    headers = {}
    with zipfile.ZipFile(path) as archive:
        for member in archive.namelist():
            with archive.open(member) as fh:
                version = np.lib.format.read_magic(fh)
                read = (
                    np.lib.format.read_array_header_1_0
                    if version == (1, 0)
                    else np.lib.format.read_array_header_2_0
                )
                shape, _, dtype = read(fh)
            headers[member.removesuffix(".npy")] = (shape, dtype)
    return headers


def _source_arrays(spec):
    """(shape, dtype) per field of an arrays source whose files exist, else None."""
    source = spec.source
    if source["kind"] != "arrays":
        return None
    try:
        if "path" in source:
            headers = _array_headers(source["path"])
            return [headers[source["columns"][name]] for name in spec.field_names]
        return [
            _array_headers(source["columns"][name])[""] for name in spec.field_names
        ]
    except (OSError, KeyError, ValueError):
        return None


def num_samples(spec, input):
    """Samples of the full file: from the manifest, else estimated from the config."""
    manifest = _manifest(input)
    if manifest:
        return int(manifest["num_samples"])
    arrays = _source_arrays(spec)
    if arrays and arrays[0][0]:
        length = arrays[0][0][0]
    elif spec.source["kind"] == "image_folder":
        length = len(input_files(spec))
    else:
        return UNKNOWN_LENGTH
    indices = spec.writer.indices
    if isinstance(indices, list):
        return len(indices)
    if isinstance(indices, str):
        start, stop, step = (part.strip() for part in (indices.split(":") + [""])[:3])
        stop = min(int(stop), length) if stop else length
        return len(range(int(start or 0), stop, int(step or 1)))
    return length


def record_bytes(spec):
    """Bytes of one sample's metadata record: ffcv aligns the per-field types like this."""
    fields = [(f.name, metadata_type(f)) for f in spec.fields]
    return np.dtype(fields, align=True).itemsize


def fixed_bytes(spec):
    """Payload bytes of one sample's fixed-size fields (int, float, ndarray, torch_tensor)."""
    total = 0
    for field in spec.fields:
        if field.type in ("int", "float"):
            total += 8
        elif field_kind(field).fixed_size:
            itemsize = np.dtype(field.options["dtype"]).itemsize
            total += itemsize * math.prod(field.options["shape"])
    return total


def decoded_bytes(spec):
    """Upper bound of one decoded sample: a variable-size value fits one page (ffcv's rule)."""
    total = fixed_bytes(spec)
    for field in spec.fields:
        if field.type == "rgb_image" and field.options.get("max_resolution"):
            total += 3 * field.options["max_resolution"] ** 2
        elif not field_kind(field).fixed_size:
            total += spec.writer.page_size
    return total


def resident_source_bytes(spec):
    """An .npz source is loaded whole; other sources are memory-mapped or read per sample."""
    arrays = _source_arrays(spec)
    if not arrays or "path" not in spec.source:
        return 0
    return sum(math.prod(shape) * dtype.itemsize for shape, dtype in arrays)


def _mb(nbytes):
    return math.ceil(nbytes / MB)


def _base_mb(spec, samples):
    return PROCESS_MB + _mb(
        resident_source_bytes(spec) + samples * ORDER_BYTES_PER_SAMPLE
    )


def _write_mb(spec, samples, workers):
    table = samples * record_bytes(spec)
    return (
        _base_mb(spec, samples)
        + _mb(table)
        + workers * (WORKER_MB + _mb(spec.writer.page_size))
    )


def _verify_mb(spec, samples):
    table = samples * record_bytes(spec)
    if spec.source["kind"] not in (
        "arrays",
        "image_folder",
    ):  # values gathered one by one
        n_fixed = sum(field_kind(f).fixed_size for f in spec.fields)
        fixed = samples * (2 * fixed_bytes(spec) + n_fixed * PYTHON_VALUE_BYTES)
    else:
        fixed = min(samples, CHUNK_ROWS) * 3 * fixed_bytes(spec)
    batch = (
        min(samples, spec.verify["loader_batch"]) * decoded_bytes(spec) * LOADER_COPIES
    )
    return _base_mb(spec, samples) + _mb(table + fixed + batch)


def _smoke_samples(spec, input):
    return min(2 * spec.smoke_samples, num_samples(spec, input))


def _seconds_per_sample(spec):
    variable = sum(SECONDS_PER_SAMPLE.get(f.type, 0) for f in spec.fields)
    return variable + SECONDS_PER_FIXED_VALUE * sum(
        field_kind(f).fixed_size for f in spec.fields
    )


def _minutes(seconds, attempt):
    return (MIN_RUNTIME + math.ceil(SAFETY * seconds / 60)) * attempt


def _input_bytes(spec, input):
    manifest = _manifest(input)
    if manifest:
        return int(manifest["inputs"]["bytes"])
    files = input_files(spec)
    return sum(os.path.getsize(f) for f in files if os.path.isfile(f))


def source_manifest_mem_mb(wildcards, input, attempt):
    spec = _spec(wildcards)
    return _base_mb(spec, num_samples(spec, input)) * attempt


def source_manifest_runtime(wildcards, input, attempt):
    """Every input file of the job is read once and hashed (also the shards, by shard_list)."""
    nbytes = sum(os.path.getsize(path) for path in input if os.path.isfile(path))
    return _minutes(nbytes / MB / READ_MB_PER_S, attempt)


def write_mem_mb(wildcards, input, threads, attempt):
    spec = _spec(wildcards)
    return _write_mb(spec, num_samples(spec, input), threads) * attempt


def write_runtime(wildcards, input, threads, attempt):
    spec = _spec(wildcards)
    samples = num_samples(spec, input)
    encode = samples * _seconds_per_sample(spec) / max(threads, 1)
    io = (_input_bytes(spec, input) + samples * fixed_bytes(spec)) / MB / READ_MB_PER_S
    return _minutes(encode + io, attempt)


def smoke_mem_mb(wildcards, input, attempt):
    spec = _spec(wildcards)
    return _write_mb(spec, _smoke_samples(spec, input), 1) * attempt


def smoke_runtime(wildcards, input, attempt):
    """The smoke samples, plus a look for the largest samples of the source."""
    spec = _spec(wildcards)
    return _minutes(_smoke_samples(spec, input) * _seconds_per_sample(spec), attempt)


def _part_samples(spec, wildcards, input):
    """Samples of one part: planned in the manifest, else an even share of the estimate."""
    manifest = _manifest(input)
    if manifest:
        return int(manifest["partitions"][int(wildcards.part)]["num_samples"])
    total = num_samples(spec, input)
    if spec.partitions.samples is not None:
        return min(total, spec.partitions.samples)
    return math.ceil(total / (spec.partitions.count or 1))


def part_mem_mb(wildcards, input, attempt):
    spec = _spec(wildcards)
    return _write_mb(spec, _part_samples(spec, wildcards, input), 1) * attempt


def part_runtime(wildcards, input, attempt):
    """A part's share of the write, on its one worker."""
    spec = _spec(wildcards)
    samples = _part_samples(spec, wildcards, input)
    share = samples / max(num_samples(spec, input), 1)
    encode = samples * _seconds_per_sample(spec)
    io = (
        (_input_bytes(spec, input) * share + samples * fixed_bytes(spec))
        / MB
        / READ_MB_PER_S
    )
    return _minutes(encode + io, attempt)


def part_verify_mem_mb(wildcards, input, attempt):
    spec = _spec(wildcards)
    return _verify_mb(spec, _part_samples(spec, wildcards, input)) * attempt


def merge_mem_mb(wildcards, input, attempt):
    """Every part's metadata and allocation table, and the merged copies of them."""
    spec = _spec(wildcards)
    samples = num_samples(spec, input)
    allocations = samples * len(spec.fields) * ALLOCATION_BYTES
    return (PROCESS_MB + 2 * _mb(samples * record_bytes(spec) + allocations)) * attempt


def merge_runtime(wildcards, input, attempt):
    """A copy of every part's data region."""
    nbytes = sum(
        os.path.getsize(p) for p in input.get("parts", []) if os.path.exists(p)
    )
    return _minutes(nbytes / MB / READ_MB_PER_S, attempt)


def verify_mem_mb(wildcards, input, attempt):
    spec = _spec(wildcards)
    return _verify_mb(spec, num_samples(spec, input)) * attempt


def verify_runtime(wildcards, input, threads, attempt):
    """Every fixed-size value, the decoded variable-size samples (all of them in full mode, on the
    job's threads), and a hash of the whole file."""
    spec = _spec(wildcards)
    samples = num_samples(spec, input)
    beton = input.get("beton")
    nbytes = (
        os.path.getsize(beton)
        if beton and os.path.exists(beton)
        else _input_bytes(spec, input)
    )
    fixed = (
        samples
        * SECONDS_PER_FIXED_VALUE
        * sum(field_kind(f).fixed_size for f in spec.fields)
    )
    decoded = (
        samples
        if resolve_mode(spec, samples) == "full"
        else min(samples, spec.verify["samples"])
    )
    variable = decoded * _seconds_per_sample(spec) / max(threads, 1)
    return _minutes(fixed + variable + nbytes / MB / READ_MB_PER_S, attempt)


def verify_smoke_mem_mb(wildcards, input, attempt):
    spec = _spec(wildcards)
    return _verify_mb(spec, _smoke_samples(spec, input)) * attempt


def verify_smoke_runtime(wildcards, input, attempt):
    spec = _spec(wildcards)
    return _minutes(_smoke_samples(spec, input) * _seconds_per_sample(spec), attempt)


def demo_data_mem_mb(wildcards, attempt):
    return 2048 * attempt


def demo_data_runtime(wildcards, attempt):
    return MIN_RUNTIME * attempt
