# Full or part verification: the rule's params.stage says which. The full one also makes the
# report's preview and summary of the verified file.
import sys
import time

started = time.monotonic()  # the summary's row of this job: its time up to the report's assets
sys.path.append(snakemake.scriptdir + "/../../..")  # --sdm conda: betonbuild from beside us; last: the env wins
from betonbuild.report import report_assets  # noqa: E402
from betonbuild.workflow.rulescript import dataset_spec, run, stage_args  # noqa: E402
from betonbuild.workflow.stages import verify_dataset  # noqa: E402


def verify():
    spec = dataset_spec(snakemake)
    verify_dataset(
        spec,
        snakemake.input.manifest,
        snakemake.input.beton,
        snakemake.input.record,
        snakemake.output.report,
        snakemake.params.failed_report,
        threads=snakemake.threads,
        part_reports=list(snakemake.input.get("part_reports", [])),
        **stage_args(snakemake),
    )
    if "summary" in snakemake.output.keys():
        report_assets(
            spec,
            snakemake.input.beton,
            snakemake.output.report,
            snakemake.input.record,
            snakemake.params.benchmarks,
            snakemake.output.preview,
            snakemake.output.summary,
            this_job=("verify", started),
        )


run(snakemake, verify)
