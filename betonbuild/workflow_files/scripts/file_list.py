import sys

sys.path.append(snakemake.scriptdir + "/../../..")  # --sdm conda: betonbuild from beside us; last: the env wins
from betonbuild.workflow.rulescript import dataset_spec, run
from betonbuild.workflow.stages import make_file_list

run(snakemake, lambda: make_file_list(dataset_spec(snakemake), snakemake.output.files, snakemake.threads))
