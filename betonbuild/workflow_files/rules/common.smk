import json
import os
import re

from snakemake.utils import validate

from betonbuild.workflow import rerun
from betonbuild.workflow.locks import clear_stale_locks, record_lock_owner
from betonbuild._compat.snakemake_exit import install as install_fast_snakemake_exit
from betonbuild._compat.snakemake_timers import cancel_idle_timers
from betonbuild.provenance import installed_ffcv_build
from betonbuild.sources import (
    input_files,
    missing_package,
    needs_file_list,
    needs_shard_list,
    one_pass,
)
from betonbuild.sources import listed_files_signature as source_listed_files_signature
from betonbuild.sources import missing_listed_files as source_missing_listed_files
from betonbuild.config.load import SCHEMA_PATH, check_no_duplicate_keys, load_config

# Our own checks first: they name the dataset and key (e.g. a field name longer than 16 bytes).
for _configfile in workflow.configfiles:
    check_no_duplicate_keys(_configfile)
CONFIG = load_config(config)
# The dataset-level keys' defaults into `config`; CONFIG holds every kind's defaults too.
validate(config, schema=str(SCHEMA_PATH))
RESULTS = CONFIG.results
DATASETS = CONFIG.datasets

if workflow.is_main_process:
    install_fast_snakemake_exit()
    _cleared = clear_stale_locks()
    if _cleared:
        logger.warning(f"betonbuild: {_cleared}")


# The run that holds the lock owns the working directory: its token fences its jobs' outputs
# (a run with --nolock holds nothing, so it neither takes the directory over nor is fenced).
onstart:
    if workflow.execution_settings.lock:
        record_lock_owner()


# The scheduler's last wake-up timer would hold the finished run's exit back by up to a second.
onsuccess:
    cancel_idle_timers()


onerror:
    cancel_idle_timers()


def names_pattern(names):
    """A regex matching exactly these dataset names (and nothing when there is none)."""
    return "|".join(re.escape(name) for name in names) or "(?!x)x"


wildcard_constraints:
    ds=names_pattern(DATASETS),
    part=r"\d+",


# A partitioned dataset's .beton is the merge of its parts; the others are written directly, an
# iterable source too (its write job reads it once, into parts it merges itself).
PARTITIONED = [
    name
    for name, spec in DATASETS.items()
    if spec.partitions.partitioned and not one_pass(spec)
]
UNPARTITIONED = [name for name in DATASETS if name not in PARTITIONED]
KEEP_PARTS = [name for name in PARTITIONED if DATASETS[name].partitions.keep_parts]
TEMP_PARTS = [name for name in PARTITIONED if name not in KEEP_PARTS]


def result(name):
    """Path of a per-dataset output: results/{ds}/<name>."""
    return f"{RESULTS}/{{ds}}/{name}"


def log_path(stage):
    return f"logs/{stage}/{{ds}}.log"


def benchmark_path(stage):
    return f"benchmarks/{stage}/{{ds}}.tsv"


def all_outputs():
    outputs = []
    for name in DATASETS:
        outputs.append(f"{RESULTS}/{name}/smoke.verify.json")
        outputs.append(f"{RESULTS}/{name}/{name}.beton")
        outputs.append(f"{RESULTS}/{name}/{name}.verify.json")
        outputs.append(f"{RESULTS}/{name}/report/preview.png")
        outputs.append(f"{RESULTS}/{name}/report/summary.html")
    return outputs


def earlier_stage_benchmarks(wildcards):
    """The benchmark files of the dataset's stages before its verification: the report's timings
    table (the verification's own row is measured by its job)."""
    partitioned = wildcards.ds in PARTITIONED
    # a dataset without partitions gates on its smoke file in its write job
    stages = (
        ["source_manifest", "smoke", "merge"]
        if partitioned
        else ["source_manifest", "write"]
    )
    if needs_shard_list(DATASETS[wildcards.ds]):
        stages.insert(0, "shard_list")
    if needs_file_list(DATASETS[wildcards.ds]):
        stages.insert(0, "file_list")
    paths = [benchmark_path(stage).format(ds=wildcards.ds) for stage in stages]
    if partitioned:
        paths[-1:-1] = [
            part_benchmark_path(stage).format(ds=wildcards.ds, part=i)
            for stage in ("write_part", "verify_part")
            for i in range(num_parts(wildcards))
        ]
    return paths


def part_benchmark_path(stage):
    return f"benchmarks/{stage}/{{ds}}.{{part}}.tsv"


def source_inputs(wildcards):
    """The files a dataset is read from, and the user's adapter module: editing them rebuilds it.

    A webdataset source is read through its shard list, an image folder through its file list:
    one file each, whatever the number of shards or images (their rules track those)."""
    spec = DATASETS[wildcards.ds]
    listings = [
        result(name).format(ds=wildcards.ds)
        for name, needed in (
            ("shards.json", needs_shard_list(spec)),
            ("files.npz", needs_file_list(spec)),
        )
        if needed
    ]
    return listings + input_files(spec)


def listed_files(wildcards):
    """The shard or file list's parameter: a digest of its files' names, sizes, mtimes and inodes
    (no file opened), so that its job reruns exactly when one of them changes. Not one input per
    file: a million inputs would cost every dry run minutes."""
    return source_listed_files_signature(DATASETS[wildcards.ds])


def missing_listed_files(wildcards):
    """The shard or file list's inputs: only its files that do not exist, so that Snakemake names
    them before any job runs (normally none)."""
    return source_missing_listed_files(DATASETS[wildcards.ds])


def manifest(wildcards):
    """results/{ds}/source.json, the one input through which the later stages see the source."""
    return checkpoints.source_manifest.get(ds=wildcards.ds).output.manifest


def num_parts(wildcards):
    """How many parts the source manifest planned (a checkpoint: known once it ran)."""
    with open(manifest(wildcards)) as fh:
        return len(json.load(fh)["partitions"])


def part_files(name):
    """Input function: every part's `name` ("beton" or "write.json"), in order."""

    def files(wildcards):
        return [
            result(f"parts/{i}.{name}").format(ds=wildcards.ds)
            for i in range(num_parts(wildcards))
        ]

    return files


def verified_parts(wildcards):
    """A partitioned dataset's part reports: its merged file is verified against them."""
    if wildcards.ds not in PARTITIONED:
        return []
    return part_files("verify.json")(wildcards)


def ancient_manifest(wildcards):
    """The manifest as the input of a part or the smoke file, by content not date: a change
    elsewhere in the source rewrites the manifest, but reruns them only through their own
    `partition` parameter or `smoke.json`.
    """
    return ancient(manifest(wildcards))


def partition_plan(wildcards):
    """The part's slice of the sample order and its source fingerprint: a rule parameter, so a
    change of exactly this part's source content (or rows) reruns it. (Read through the
    checkpoint, not from `input`: Snakemake does not compare parameters derived from input.)
    """
    with open(manifest(wildcards)) as fh:
        return json.load(fh)["partitions"][int(wildcards.part)]


def smoke_plan(wildcards):
    """results/{ds}/smoke.json: the smoke samples' source fingerprint, from the manifest job. An
    ordinary input: rewritten with the same content, it is the same to Snakemake (a small file's
    checksum is compared), so the smoke file reruns when exactly its samples change.
    """
    return checkpoints.source_manifest.get(ds=wildcards.ds).output.smoke


# Each rule's `spec` parameter: the part of the dataset's spec its output depends on, so that
# Snakemake reruns it when exactly that part changes (betonbuild.workflow.rerun).
def write_spec(wildcards):
    return rerun.write_spec(DATASETS[wildcards.ds])


def manifest_spec(wildcards):
    return rerun.manifest_spec(DATASETS[wildcards.ds])


def smoke_spec(wildcards):
    return rerun.smoke_spec(DATASETS[wildcards.ds])


def verify_spec(wildcards):
    return rerun.verify_spec(DATASETS[wildcards.ds])


def smoke_verify_spec(wildcards):
    return rerun.smoke_verify_spec(DATASETS[wildcards.ds])


def gate_and_write_spec(wildcards):
    return rerun.gate_and_write_spec(DATASETS[wildcards.ds])


def smoke_gate_mem_mb(wildcards, input, attempt):
    """The smoke stage writes, then verifies, in one process: the larger of the two."""
    return max(
        smoke_mem_mb(wildcards, input, attempt),
        verify_smoke_mem_mb(wildcards, input, attempt),
    )


def smoke_gate_runtime(wildcards, input, attempt):
    return smoke_runtime(wildcards, input, attempt) + verify_smoke_runtime(
        wildcards, input, attempt
    )


def gate_and_write_mem_mb(wildcards, input, threads, attempt):
    """The write job of a dataset without partitions: its smoke gate, then the full write."""
    return max(
        smoke_gate_mem_mb(wildcards, input, attempt),
        write_mem_mb(wildcards, input, threads, attempt),
    )


def gate_and_write_runtime(wildcards, input, threads, attempt):
    return smoke_gate_runtime(wildcards, input, attempt) + write_runtime(
        wildcards, input, threads, attempt
    )


def part_verify_spec(wildcards):
    return rerun.part_verify_spec(DATASETS[wildcards.ds])


def reader_build(wildcards):
    """The ffcv build that verification reads with: when it changes, verification reruns and
    reports that the file was written by another build (the write does not rerun by itself).
    """
    return installed_ffcv_build()


for _name, _spec in DATASETS.items():
    if missing_package(_spec):
        logger.warning(
            f"dataset '{_name}' reads WebDataset shards but the optional package `webdataset` is not "
            "installed: its jobs will fail; the other datasets still build with --keep-going"
        )
