# The write job of a dataset without partitions (its smoke file and gate, then the full file), or
# one part of a partitioned dataset: the rule's params.stage says which.
import sys

sys.path.append(snakemake.scriptdir + "/../../..")  # --sdm conda: betonbuild from beside us; last: the env wins
from betonbuild.loader_process import LoaderProcess

# The Loader batches (the smoke gate's, the full file's) import ffcv (torch) in a child: started
# first, on a core this process leaves idle while it imports betonbuild's modules and opens the source.
full = snakemake.params.stage == "full" and snakemake.threads > 1
started_loader = LoaderProcess.start() if full else None

from betonbuild.workflow.gate import gate_and_write  # noqa: E402
from betonbuild.workflow.rulescript import dataset_spec, run, stage_args  # noqa: E402
from betonbuild.workflow.stages import build  # noqa: E402


def write():
    spec, output = dataset_spec(snakemake), snakemake.output
    if snakemake.params.stage == "part":
        return build(
            spec,
            snakemake.input.manifest,
            output.beton,
            output.record,
            threads=snakemake.threads,
            **stage_args(snakemake),
        )
    smoke_paths = {
        "beton_path": output.smoke_beton,
        "record_path": output.smoke_record,
        "survey_path": output.survey,
        "report_path": output.smoke_report,
        "failed_report_path": snakemake.params.failed_smoke_report,
    }
    return gate_and_write(
        spec,
        snakemake.input.manifest,
        smoke_paths,
        output.beton,
        output.record,
        threads=snakemake.threads,
        started_loader=started_loader,
    )


run(snakemake, write)
