# The smoke write, the full write, or one part of a partitioned dataset: the rule's params.stage says which.
import sys

sys.path.append(snakemake.scriptdir + "/../../..")  # --sdm conda: betonbuild from beside us; last: the env wins
from betonbuild.workflow.rulescript import dataset_spec, run, stage_args
from betonbuild.workflow.stages import build

run(
    snakemake,
    lambda: build(
        dataset_spec(snakemake),
        snakemake.input.manifest,
        snakemake.output.beton,
        snakemake.output.record,
        threads=snakemake.threads,
        survey_path=snakemake.output.get("survey"),
        **stage_args(snakemake),
    ),
)
