rule write:
    """The full .beton of a dataset without partitions, written by the job's threads as ffcv workers."""
    input:
        manifest=manifest,
        smoke_report=result("smoke.verify.json"),
    output:
        beton=result("{ds}.beton"),
        record=result("{ds}.write.json"),
    log:
        log_path("write"),
    benchmark:
        benchmark_path("write")
    wildcard_constraints:
        ds=names_pattern(UNPARTITIONED),
    conda:
        "../envs/ffcv.yaml"
    threads: write_threads
    resources:
        mem_mb=write_mem_mb,
        runtime=write_runtime,
    params:
        spec=write_spec,
        stage="full",
    script:
        "../scripts/write.py"
