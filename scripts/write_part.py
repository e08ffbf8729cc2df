# One part of a partitioned dataset.
import sys

sys.path.insert(0, snakemake.scriptdir + "/..")  # the conda route imports betonbuild from this checkout
from betonbuild.rulescript import dataset_spec, run
from betonbuild.stages import build

run(
    snakemake,
    lambda: build(
        dataset_spec(snakemake),
        snakemake.input.manifest,
        snakemake.output.beton,
        snakemake.output.record,
        part=int(snakemake.wildcards.part),
    ),
)
