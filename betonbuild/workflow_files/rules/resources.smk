# Memory (mem_mb) and time limit (runtime, minutes) of every rule: Snakemake's signatures
# (wildcards, input, threads, attempt) passed on to betonbuild.workflow.resources, which says
# what a job holds and how long it takes. A profile overrides any of them per rule, e.g.
#   set-resources: {write: {mem_mb: 64000, runtime: 600}}   set-threads: {write: 16}
# Threads are the rules' own (`threads:`): 1, and for write and verify writer.num_workers, at most
# --cores.

from betonbuild.workflow import resources


def write_threads(wildcards):
    return resources.write_threads(DATASETS[wildcards.ds], workflow.cores)


def verify_threads(wildcards):
    """Full verification decodes on as many threads as the write used workers."""
    return write_threads(wildcards)


def _estimate(wildcards, input):
    """The dataset's spec and its source manifest (None until the manifest job ran)."""
    return DATASETS[wildcards.ds], resources.read_manifest(input.get("manifest"))


def source_manifest_mem_mb(wildcards, input, attempt):
    return resources.source_manifest_mem_mb(*_estimate(wildcards, input), attempt)


def source_manifest_runtime(wildcards, input, attempt):
    return resources.source_manifest_runtime(list(input), attempt)


def listing_runtime(wildcards, attempt):
    return resources.listing_runtime(DATASETS[wildcards.ds], attempt)


def write_mem_mb(wildcards, input, threads, attempt):
    return resources.write_mem_mb(*_estimate(wildcards, input), threads, attempt)


def write_runtime(wildcards, input, threads, attempt):
    return resources.write_runtime(*_estimate(wildcards, input), threads, attempt)


def smoke_mem_mb(wildcards, input, attempt):
    return resources.smoke_mem_mb(*_estimate(wildcards, input), attempt)


def smoke_runtime(wildcards, input, attempt):
    return resources.smoke_runtime(*_estimate(wildcards, input), attempt)


def part_mem_mb(wildcards, input, attempt):
    part = int(wildcards.part)
    return resources.part_mem_mb(*_estimate(wildcards, input), part, attempt)


def part_runtime(wildcards, input, attempt):
    part = int(wildcards.part)
    return resources.part_runtime(*_estimate(wildcards, input), part, attempt)


def part_verify_mem_mb(wildcards, input, attempt):
    part = int(wildcards.part)
    return resources.part_verify_mem_mb(*_estimate(wildcards, input), part, attempt)


def merge_mem_mb(wildcards, input, attempt):
    return resources.merge_mem_mb(*_estimate(wildcards, input), attempt)


def merge_runtime(wildcards, input, attempt):
    return resources.merge_runtime(list(input.get("parts", [])), attempt)


def verify_mem_mb(wildcards, input, attempt):
    return resources.verify_mem_mb(*_estimate(wildcards, input), attempt)


def verify_runtime(wildcards, input, threads, attempt):
    beton = input.get("beton")
    return resources.verify_runtime(
        *_estimate(wildcards, input), beton, threads, attempt
    )


def verify_smoke_mem_mb(wildcards, input, attempt):
    return resources.verify_smoke_mem_mb(*_estimate(wildcards, input), attempt)


def verify_smoke_runtime(wildcards, input, attempt):
    return resources.verify_smoke_runtime(*_estimate(wildcards, input), attempt)


def demo_data_mem_mb(wildcards, attempt):
    return resources.demo_data_mem_mb(attempt)


def demo_data_runtime(wildcards, attempt):
    return resources.demo_data_runtime(attempt)
