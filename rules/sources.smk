checkpoint source_manifest:
    """Length, final sample order and a content fingerprint of the dataset's inputs.

    A checkpoint, so that Snakemake looks at its output again once it ran: a source rewritten
    with identical content gives an identical source.json, and the later stages (which depend
    on source.json, not on the source files) are not rebuilt.
    """
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
    resources:
        mem_mb=source_manifest_mem_mb,
        runtime=source_manifest_runtime,
    params:
        spec=write_spec,
    script:
        "../scripts/source_manifest.py"
