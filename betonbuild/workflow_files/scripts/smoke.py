# The smoke write and its gate (the read-back of the smoke file) in one process.
import sys

sys.path.append(snakemake.scriptdir + "/../../..")  # --sdm conda: betonbuild from beside us; last: the env wins
from betonbuild.workflow.rulescript import dataset_spec, run
from betonbuild.workflow.stages import smoke_and_gate

run(
    snakemake,
    lambda: smoke_and_gate(
        dataset_spec(snakemake),
        snakemake.input.manifest,
        snakemake.output.beton,
        snakemake.output.record,
        snakemake.output.survey,
        snakemake.output.report,
        snakemake.params.failed_report,
        threads=snakemake.threads,
    ),
)
