# The parts of a partitioned dataset joined into its .beton.
import sys

sys.path.append(snakemake.scriptdir + "/../../..")  # --sdm conda: betonbuild from beside us; last: the env wins
from betonbuild.workflow.rulescript import dataset_spec, run
from betonbuild.workflow.stages import merge_parts

run(
    snakemake,
    lambda: merge_parts(
        dataset_spec(snakemake),
        snakemake.input.manifest,
        list(snakemake.input.parts),
        list(snakemake.input.records),
        snakemake.output.beton,
        snakemake.output.record,
    ),
)
