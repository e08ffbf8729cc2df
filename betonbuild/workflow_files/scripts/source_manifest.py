import sys

sys.path.append(snakemake.scriptdir + "/../../..")  # --sdm conda: betonbuild from beside us; last: the env wins
from betonbuild.workflow.rulescript import dataset_spec, run
from betonbuild.workflow.stages import make_source_manifest

run(
    snakemake,
    lambda: make_source_manifest(
        dataset_spec(snakemake),
        snakemake.output.manifest,
        smoke_path=snakemake.output.smoke,
        memory_mb=snakemake.resources.mem_mb,
    ),
)
