rule write:
    """The full .beton, written by the job's threads as ffcv workers."""
    input:
        source_inputs,
        manifest=result("source.json"),
        # The gate: built first when missing; its timestamp alone (e.g. after a change to the
        # verify settings) does not rebuild the full file.
        smoke_report=ancient(result("smoke.verify.json")),
    output:
        beton=result("{ds}.beton"),
        record=result("{ds}.write.json"),
    log:
        log_path("write"),
    benchmark:
        benchmark_path("write")
    conda:
        "../envs/ffcv.yaml"
    threads: write_threads
    params:
        spec=write_spec,
    script:
        "../scripts/write.py"
