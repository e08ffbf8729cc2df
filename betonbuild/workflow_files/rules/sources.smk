rule shard_list:
    """A webdataset source's shards: size, mtime, sha256, sample count and keys of each, counted
    from tar headers without decoding (cached per shard, so one changed shard is recounted alone).
    Reruns when a shard's stat changes (the `files` parameter), not through one input per shard.
    """
    input:
        missing_listed_files,
    output:
        shards=result("shards.json"),
    log:
        log_path("shard_list"),
    benchmark:
        benchmark_path("shard_list")
    conda:
        "../envs/ffcv.yaml"
    threads: 1
    resources:
        mem_mb=source_manifest_mem_mb,
        runtime=listing_runtime,
    params:
        spec=write_spec,
        files=listed_files,
    script:
        "../scripts/shard_list.py"


rule file_list:
    """An image folder's files: name, size, mtime, inode and sha256 of each, hashed only where
    they changed since the last listing (betonbuild/sources/folder_listing.py). Every later job
    reads the folder through this list. Reruns when a file's stat changes (the `files` parameter).
    """
    input:
        missing_listed_files,
    output:
        files=result("files.npz"),
    log:
        log_path("file_list"),
    benchmark:
        benchmark_path("file_list")
    conda:
        "../envs/ffcv.yaml"
    threads: write_threads  # hashing, the first time every image
    resources:
        mem_mb=source_manifest_mem_mb,
        runtime=listing_runtime,
    params:
        spec=write_spec,
        files=listed_files,
    script:
        "../scripts/file_list.py"


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
        smoke=result("smoke.json"),
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
        spec=manifest_spec,
    script:
        "../scripts/source_manifest.py"
