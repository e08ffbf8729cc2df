import sys

sys.path.insert(0, snakemake.scriptdir + "/..")  # the conda route imports betonbuild from this checkout
from betonbuild.report import contact_sheet, numeric_plot, summary_html
from betonbuild.workflow.rulescript import dataset_spec, run


def assets():
    spec = dataset_spec(snakemake)
    if any(f.type == "rgb_image" for f in spec.fields):
        contact_sheet(snakemake.input.beton, spec, snakemake.output.preview)
    else:
        numeric_plot(snakemake.input.beton, spec, snakemake.output.preview)
    summary_html(
        spec, snakemake.input.report, snakemake.input.record, snakemake.input.benchmarks, snakemake.output.summary
    )


run(snakemake, assets)
