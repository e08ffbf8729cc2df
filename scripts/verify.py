# Smoke and full verification: the rule's name says which.
import sys

sys.path.insert(0, snakemake.scriptdir + "/..")  # the conda route imports betonbuild from this checkout
from betonbuild.rulescript import dataset_spec, run
from betonbuild.stages import verify

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
    ),
)
