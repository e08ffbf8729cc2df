# Smoke, full or part verification: the rule's params.stage says which.
import sys

sys.path.insert(0, snakemake.scriptdir + "/..")  # the conda route imports betonbuild from this checkout
from betonbuild.workflow.rulescript import dataset_spec, run, stage_args
from betonbuild.workflow.stages import verify_dataset

run(
    snakemake,
    lambda: verify_dataset(
        dataset_spec(snakemake),
        snakemake.input.manifest,
        snakemake.input.beton,
        snakemake.input.record,
        snakemake.output.report,
        snakemake.params.failed_report,
        threads=snakemake.threads,
        part_reports=list(snakemake.input.get("part_reports", [])),
        **stage_args(snakemake),
    ),
)
