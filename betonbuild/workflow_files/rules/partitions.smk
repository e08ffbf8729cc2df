rule write_part:
    """One part of a partitioned dataset: a contiguous slice of the sample order, one writer
    worker (reproducible bytes); the parts run side by side as separate jobs, also on a cluster.

    A part reruns when its own `partition` parameter (rows, source fingerprint) changes, not when
    the manifest's date does. Neither the parts nor the merge wait for the smoke gate (every part
    is verified in full instead; the gate is a target of `all`, built side by side): a dependency
    on the gate, which reruns on any source change, would hide a part's own reasons from Snakemake
    (a job downstream of a rerunning one is only rerun through that dependency).
    """
    input:
        manifest=ancient_manifest,
    output:
        beton=result("parts/{part}.beton"),
        record=result("parts/{part}.write.json"),
    log:
        "logs/write_part/{ds}.{part}.log",
    benchmark:
        part_benchmark_path("write_part")
    wildcard_constraints:
        ds=names_pattern(KEEP_PARTS),
    conda:
        "../envs/ffcv.yaml"
    threads: 1
    resources:
        mem_mb=part_mem_mb,
        runtime=part_runtime,
    params:
        spec=write_spec,
        stage="part",
        partition=partition_plan,
    script:
        "../scripts/write.py"


use rule write_part as write_temp_part with:
    output:
        beton=temp(result("parts/{part}.beton")),
        record=temp(result("parts/{part}.write.json")),
    wildcard_constraints:
        ds=names_pattern(TEMP_PARTS),


rule verify_part:
    """A part read back and compared with its source in full: the merged file is then proven
    part by part, so a rebuild of one part re-decodes that part alone."""
    input:
        manifest=ancient_manifest,
        beton=result("parts/{part}.beton"),
        record=result("parts/{part}.write.json"),
    output:
        report=result("parts/{part}.verify.json"),
    log:
        "logs/verify_part/{ds}.{part}.log",
    benchmark:
        part_benchmark_path("verify_part")
    wildcard_constraints:
        ds=names_pattern(PARTITIONED),
    conda:
        "../envs/ffcv.yaml"
    threads: 1
    resources:
        mem_mb=part_verify_mem_mb,
        runtime=part_runtime,
    params:
        spec=part_verify_spec,
        stage="part",
        partition=partition_plan,
        reader_build=reader_build,
        failed_report=result("failed/part{part}.verify.json"),
    script:
        "../scripts/verify.py"


rule merge:
    """The parts joined, in order, into the dataset's one standard .beton (betonbuild.beton.merge)."""
    input:
        manifest=manifest,
        parts=part_files("beton"),
        records=part_files("write.json"),
    output:
        beton=result("{ds}.beton"),
        record=result("{ds}.write.json"),
    log:
        log_path("merge"),
    benchmark:
        benchmark_path("merge")
    wildcard_constraints:
        ds=names_pattern(PARTITIONED),
    conda:
        "../envs/ffcv.yaml"
    threads: 1
    resources:
        mem_mb=merge_mem_mb,
        runtime=merge_runtime,
    params:
        spec=write_spec,
    script:
        "../scripts/merge.py"
