import sys

sys.path.insert(0, snakemake.scriptdir + "/..")  # the conda route imports betonbuild from this checkout
from betonbuild.report import preview, summary_html
from betonbuild.workflow.rulescript import dataset_spec, run


def assets():
    spec = dataset_spec(snakemake)
    preview(snakemake.input.beton, spec, snakemake.output.preview)
    summary_html(
        spec, snakemake.input.report, snakemake.input.record, snakemake.input.benchmarks, snakemake.output.summary
    )


run(snakemake, assets)
