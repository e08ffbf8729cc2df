rule smoke:
    """The gate of a partitioned dataset: the first k and k seeded-random samples, one worker, then
    read back in full. (A dataset without partitions gates in its write job: rule write.)

    The parts are written beside it (docs/configuration.md#partitions): each is verified in full.
    Writing it and verifying it are one job (one start-up): smoke.verify.json is written only when
    every check passed. Two threads: the file is written by one worker, while the gate's Loader batch
    imports ffcv (torch, 2-3 s) in a process of its own on the second.
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
    wildcard_constraints:
        ds=names_pattern(PARTITIONED),
    conda:
        "../envs/ffcv.yaml"
    threads: 2
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
