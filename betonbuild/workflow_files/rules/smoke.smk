rule smoke:
    """The first k and k seeded-random samples, one worker: catches bad samples in seconds.

    Reruns when those samples (or the largest ones its pre-flight inspects) change: through
    smoke.json, not the manifest's date, so an edit elsewhere in the source leaves it alone.
    """
    input:
        manifest=ancient_manifest,
        samples=smoke_plan,
    output:
        beton=result("smoke.beton"),
        record=result("smoke.write.json"),
        survey=result("inspect.json"),
    log:
        log_path("smoke"),
    benchmark:
        benchmark_path("smoke")
    conda:
        "../envs/ffcv.yaml"
    threads: 1
    resources:
        mem_mb=smoke_mem_mb,
        runtime=smoke_runtime,
    params:
        spec=smoke_spec,
        stage="smoke",
    script:
        "../scripts/write.py"


rule verify_smoke:
    """The gate: the full build starts only when the smoke file reads back equal to its source."""
    input:
        manifest=ancient_manifest,
        beton=result("smoke.beton"),
        record=result("smoke.write.json"),
    output:
        report=result("smoke.verify.json"),
    log:
        log_path("verify_smoke"),
    benchmark:
        benchmark_path("verify_smoke")
    conda:
        "../envs/ffcv.yaml"
    threads: 1
    resources:
        mem_mb=verify_smoke_mem_mb,
        runtime=verify_smoke_runtime,
    params:
        spec=smoke_verify_spec,
        stage="smoke",
        reader_build=reader_build,
        failed_report=result("failed/smoke.verify.json"),
    script:
        "../scripts/verify.py"
