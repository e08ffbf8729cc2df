rule demo_data:
    """Real data that ships in scikit-learn and scikit-image, materialised under data/demo/."""
    output:
        digits="data/demo/digits.npz",
        faces_images="data/demo/faces/images.npy",
        faces_labels="data/demo/faces/labels.npy",
        photos=directory("data/demo/photos"),
        shards=expand("data/demo/wds/photos-{shard:04d}.tar", shard=range(4)),
    log:
        "logs/demo_data.log",
    benchmark:
        "benchmarks/demo_data.tsv"
    conda:
        "../envs/ffcv.yaml"
    threads: 1
    resources:
        mem_mb=demo_data_mem_mb,
        runtime=demo_data_runtime,
    script:
        "../scripts/demo_data.py"
