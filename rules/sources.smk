rule source_manifest:
    """Length, final sample order and a content fingerprint of the dataset's inputs."""
    input:
        source_inputs,
    output:
        manifest=result("source.json"),
    log:
        log_path("source_manifest"),
    benchmark:
        benchmark_path("source_manifest")
    conda:
        "../envs/ffcv.yaml"
    threads: 1
    params:
        spec=write_spec,
    script:
        "../scripts/source_manifest.py"
