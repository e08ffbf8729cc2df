# Smoke, full or part verification: the rule says which.
import sys

sys.path.insert(0, snakemake.scriptdir + "/..")  # the conda route imports betonbuild from this checkout
from betonbuild.workflow.rulescript import dataset_spec, run
from betonbuild.workflow.stages import verify

run(
    snakemake,
    lambda: verify(
        dataset_spec(snakemake),
        snakemake.input.manifest,
        snakemake.input.beton,
        snakemake.input.record,
        snakemake.output.report,
        snakemake.params.failed_report,
        smoke=snakemake.rule == "verify_smoke",
        threads=snakemake.threads,
        part=int(snakemake.wildcards.part) if "part" in snakemake.wildcards.keys() else None,
        part_reports=list(snakemake.input.get("part_reports", [])),
    ),
)
