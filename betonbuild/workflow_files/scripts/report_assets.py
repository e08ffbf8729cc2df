import sys

sys.path.append(snakemake.scriptdir + "/../../..")  # --sdm conda: betonbuild from beside us; last: the env wins
from betonbuild.report import preview, summary_html
from betonbuild.workflow.rulescript import dataset_spec, run


def assets():
    spec = dataset_spec(snakemake)
    preview(snakemake.input.beton, spec, snakemake.output.preview)
    summary_html(
        spec, snakemake.input.report, snakemake.input.record, snakemake.input.benchmarks, snakemake.output.summary
    )


run(snakemake, assets)
