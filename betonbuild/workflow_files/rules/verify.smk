rule verify:
    """Reads the full .beton back and proves it equals its source (report: {ds}.verify.json), then
    makes what `snakemake --report report.html` shows of it, read back from the file: one job, so
    that the report's pictures cost no second start-up after the verification.
    The earlier stages' benchmark files are params, not inputs: the summary's timings table is of
    the build that made the verified file, and a stage that reruns without changing it (a touched
    image's file_list) does not make this job verify the file again.
    """
    input:
        manifest=manifest,
        beton=result("{ds}.beton"),
        record=result("{ds}.write.json"),
        part_reports=verified_parts,
    output:
        report=result("{ds}.verify.json"),
        preview=report(
            result("report/preview.png"),
            caption="../report/preview.rst",
            category="{ds}",
            labels={"dataset": "{ds}", "figure": "preview"},
        ),
        summary=report(
            result("report/summary.html"),
            caption="../report/summary.rst",
            category="{ds}",
            labels={"dataset": "{ds}", "figure": "summary"},
        ),
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
        benchmarks=earlier_stage_benchmarks,
    script:
        "../scripts/verify.py"
