import sys

sys.path.insert(0, snakemake.scriptdir + "/..")  # the conda route imports betonbuild from this checkout
from betonbuild.workflow.rulescript import dataset_spec, run
from betonbuild.workflow.stages import make_file_list

run(snakemake, lambda: make_file_list(dataset_spec(snakemake), snakemake.output.files, snakemake.threads))
