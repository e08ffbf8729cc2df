rule report_assets:
    """What `snakemake --report report.html` shows of a dataset, read back from its .beton."""
    input:
        beton=result("{ds}.beton"),
        report=result("{ds}.verify.json"),
        record=result("{ds}.write.json"),
        benchmarks=stage_benchmarks,
    output:
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
        log_path("report_assets"),
    benchmark:
        benchmark_path("report_assets")
    conda:
        "../envs/ffcv.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    params:
        spec=write_spec,
    script:
        "../scripts/report_assets.py"
