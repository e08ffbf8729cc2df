# The smoke write, the full write, or one part of a partitioned dataset: the rule's params.stage says which.
import sys

sys.path.append(snakemake.scriptdir + "/../../..")  # --sdm conda: betonbuild from beside us; last: the env wins
from betonbuild.loader_process import LoaderProcess

# The full file's Loader batch imports ffcv (torch) in a child: started first, on a core this
# process leaves idle while it imports betonbuild's modules and opens the source.
full = snakemake.params.stage == "full" and snakemake.threads > 1
started_loader = LoaderProcess.start() if full else None

from betonbuild.workflow.rulescript import dataset_spec, run, stage_args  # noqa: E402
from betonbuild.workflow.stages import build  # noqa: E402

run(
    snakemake,
    lambda: build(
        dataset_spec(snakemake),
        snakemake.input.manifest,
        snakemake.output.beton,
        snakemake.output.record,
        threads=snakemake.threads,
        survey_path=snakemake.output.get("survey"),
        started_loader=started_loader,
        **stage_args(snakemake),
    ),
)
