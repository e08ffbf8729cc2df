# Smoke, full or part verification: the rule's params.stage says which.
import sys

sys.path.append(snakemake.scriptdir + "/../../..")  # --sdm conda: betonbuild from beside us; last: the env wins
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
