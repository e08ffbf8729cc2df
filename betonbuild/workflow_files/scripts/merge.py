# The parts of a partitioned dataset joined into its .beton.
import sys

sys.path.insert(0, snakemake.scriptdir + "/..")  # the conda route imports betonbuild from this checkout
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
