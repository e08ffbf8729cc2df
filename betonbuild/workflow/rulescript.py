"""Glue for the thin scripts under scripts/: logging into the rule's log, one clear error at the edge."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

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


def traceback_path(log: str | os.PathLike) -> Path:
    """Where a job's traceback goes: beside its log, never into it, because the workflow profiles'
    ``show-failed-logs`` prints the log of a failed job on the console."""
    return Path(log).with_suffix(".traceback")


def run(snakemake, stage: Callable[[], object]) -> None:
    """Runs ``stage`` with stdout/stderr (also of child processes) going to the rule's log.

    A betonbuild error is written once, to the log, which Snakemake prints on the console when the
    job fails (``show-failed-logs`` in every profile under profiles/, local and SLURM alike): a copy
    of our own on the console would print it twice, and on SLURM it would land in the job's SLURM
    log, not on the console. A traceback (a writer worker's, or an unexpected error's) goes to
    ``traceback_path(log)``; an unexpected error's one line in the log names that file. Without a
    log (outside Snakemake) all of it goes to stderr. Exits non-zero.
    """
    log_path = snakemake.log[0] if snakemake.log else None
    log = open(log_path, "w") if log_path else None
    console = os.fdopen(os.dup(2), "w")  # for an error no Snakemake is left to print (``to_console``)
    if log:
        traceback_path(log_path).unlink(missing_ok=True)  # a traceback is always from this run
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        stage()
    except BetonbuildError as exc:
        if getattr(exc, "worker_traceback", None):
            _keep_traceback(log_path, exc.worker_traceback)
        print(f"betonbuild error: {exc}", file=sys.stderr, flush=True)
        if log and getattr(exc, "to_console", False):
            print(f"betonbuild error: {exc}", file=console, flush=True)
        sys.exit(1)
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - the edge of the job: any other error ends as one line
        where = _keep_traceback(log_path, "".join(traceback.format_exception(exc)))
        print(f"unexpected error: {type(exc).__name__}: {exc}; traceback in {where}", file=sys.stderr, flush=True)
        sys.exit(130 if isinstance(exc, KeyboardInterrupt) else 1)
    exit_without_teardown(log)


def _keep_traceback(log_path: str | None, text: str) -> str:
    """Writes ``text`` beside the log (to stderr without a log); returns where it went."""
    text = text if text.endswith("\n") else text + "\n"
    if log_path is None:
        print(text, file=sys.stderr, end="", flush=True)
        return "the output above"
    path = traceback_path(log_path)
    path.write_text(text)
    return str(path)
