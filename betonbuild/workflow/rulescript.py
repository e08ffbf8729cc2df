"""Glue for the thin scripts under scripts/: logging into the rule's log, one clear error at the edge."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable

from betonbuild._compat.fast_exit import exit_without_teardown
from betonbuild.config.load import spec_from_dict
from betonbuild.config.spec import DatasetSpec
from betonbuild.errors import BetonbuildError

# A write or verify rule's `params: stage=`: which file of the dataset its job makes or checks.
STAGES = ("smoke", "full", "part")


def dataset_spec(snakemake) -> DatasetSpec:
    return spec_from_dict(snakemake.params.spec)


def stage_args(snakemake) -> dict[str, bool | int | None]:
    """``smoke`` and ``part`` for a write or verify stage, from the rule's ``params.stage`` (never
    from the rule's name, so that renaming a rule does not change what its job does). A part's
    number is its ``{part}`` wildcard."""
    stage = snakemake.params.stage
    if stage not in STAGES:
        raise ValueError(f"rule {snakemake.rule}: params.stage is {stage!r}, expected one of {STAGES}")
    return {"smoke": stage == "smoke", "part": int(snakemake.wildcards.part) if stage == "part" else None}


def run(snakemake, stage: Callable[[], object]) -> None:
    """Runs ``stage`` with stdout/stderr (also of child processes) going to the rule's log.

    A betonbuild error is printed once, to the log and to the console, and exits non-zero.
    """
    console = os.fdopen(os.dup(2), "w")
    log = open(snakemake.log[0], "w") if snakemake.log else None
    if log:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        stage()
    except BetonbuildError as exc:
        message = f"betonbuild error: {exc}"
        if getattr(exc, "worker_traceback", None):
            print(exc.worker_traceback, file=sys.stderr)
        print(message, file=sys.stderr, flush=True)
        if log:
            print(message, file=console, flush=True)
        sys.exit(1)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        if log:
            print(f"unexpected error; traceback in {snakemake.log[0]}", file=console, flush=True)
        raise
    exit_without_teardown(console, log)
