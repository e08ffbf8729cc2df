rule smoke:
    """The first k and k seeded-random samples, one worker, then read back in full: the gate.

    The full build starts only when the smoke file reads back equal to its source. Writing it
    and verifying it are one job, so that ffcv (torch) is imported once (the gate's Loader batch
    reuses the write's import): smoke.verify.json is written only when every check passed.
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
        report=result("smoke.verify.json"),
    log:
        log_path("smoke"),
    benchmark:
        benchmark_path("smoke")
    conda:
        "../envs/ffcv.yaml"
    threads: 1
    resources:
        mem_mb=smoke_gate_mem_mb,
        runtime=smoke_gate_runtime,
    params:
        spec=smoke_verify_spec,
        stage="smoke",
        reader_build=reader_build,
        failed_report=result("failed/smoke.verify.json"),
    script:
        "../scripts/smoke.py"
