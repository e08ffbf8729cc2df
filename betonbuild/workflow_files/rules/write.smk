rule write:
    """A dataset without partitions: its smoke file and gate, then the full .beton, in one job.

    The smoke stage (the first k and k seeded-random samples, one worker, then read back in full;
    smoke.verify.json is written only when every check passed) runs first, and the full file is
    written only after every check but the gate's Loader batch passed: a bad sample stops the build
    before the full write. That batch's answer (its child is still importing ffcv) is awaited during
    the full write, which its failure ends, leaving no file (workflow/gate.py). One job, so
    that the gate's Loader batch and the full file's share one import of ffcv (torch, 2-3 s of a
    core, in a child process beside the writes) and the full write costs no second start-up; its
    threads are the full write's ffcv workers. (A partitioned dataset's gate is rule smoke.)
    """
    input:
        manifest=manifest,
        samples=smoke_plan,
    output:
        smoke_beton=result("smoke.beton"),
        smoke_record=result("smoke.write.json"),
        survey=result("inspect.json"),
        smoke_report=result("smoke.verify.json"),
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
        mem_mb=gate_and_write_mem_mb,
        runtime=gate_and_write_runtime,
    params:
        spec=gate_and_write_spec,
        stage="full",
        reader_build=reader_build,
        failed_smoke_report=result("failed/smoke.verify.json"),
    script:
        "../scripts/write.py"
