rule verify:
    """Reads the full .beton back and proves it equals its source (report: {ds}.verify.json)."""
    input:
        manifest=manifest,
        beton=result("{ds}.beton"),
        record=result("{ds}.write.json"),
        part_reports=verified_parts,
    output:
        report=result("{ds}.verify.json"),
    log:
        log_path("verify"),
    benchmark:
        benchmark_path("verify")
    conda:
        "../envs/ffcv.yaml"
    threads: verify_threads
    resources:
        mem_mb=verify_mem_mb,
        runtime=verify_runtime,
    params:
        spec=verify_spec,
        stage="full",
        reader_build=reader_build,
        failed_report=result("failed/{ds}.verify.json"),
    script:
        "../scripts/verify.py"
