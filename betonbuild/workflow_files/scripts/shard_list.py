import sys

sys.path.insert(0, snakemake.scriptdir + "/..")  # the conda route imports betonbuild from this checkout
from betonbuild.workflow.rulescript import dataset_spec, run
from betonbuild.workflow.stages import make_shard_list

run(snakemake, lambda: make_shard_list(dataset_spec(snakemake), snakemake.output.shards))
