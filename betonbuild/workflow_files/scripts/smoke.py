# The smoke write and its gate (the read-back of the smoke file) in one process.
import sys

sys.path.append(snakemake.scriptdir + "/../../..")  # --sdm conda: betonbuild from beside us; last: the env wins
from betonbuild.loader_process import LoaderProcess

# The gate's Loader batch imports ffcv (torch) in a child: started first, on the job's second core,
# while this process imports betonbuild's modules (the job waits for that import, not for those).
started_loader = LoaderProcess.start() if snakemake.threads > 1 else None

from betonbuild.workflow.gate import smoke_and_gate  # noqa: E402
from betonbuild.workflow.rulescript import dataset_spec, run  # noqa: E402

run(
    snakemake,
    lambda: smoke_and_gate(
        dataset_spec(snakemake),
        snakemake.input.manifest,
        snakemake.output.beton,
        snakemake.output.record,
        snakemake.output.survey,
        snakemake.output.report,
        snakemake.params.failed_report,
        threads=snakemake.threads,
        started_loader=started_loader,
    ),
)
