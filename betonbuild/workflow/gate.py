"""The smoke gate: the smoke file written and read back in full in one process (``smoke_and_gate``,
a partitioned dataset's smoke job), and the write job of a dataset without partitions, which gates
on its smoke file and then writes the full file (``gate_and_write``)."""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from betonbuild.config.spec import DatasetSpec
from betonbuild.verify import LoaderProcess, start_loader_process
from betonbuild.workflow.stages import build, verify_dataset


def smoke_and_gate(
    spec: DatasetSpec,
    manifest_path: str,
    beton_path: str,
    record_path: str,
    survey_path: str,
    report_path: str,
    failed_report_path: str,
    threads: int | None = None,
    log=sys.stderr,
    started_loader: LoaderProcess | None = None,
) -> dict[str, Any]:
    """The smoke stage and its gate in one job: smoke.beton written (``build``), read back in full (``verify_dataset``)
    or the build stops. Its Loader batch imports ffcv (2-3 s; the write does not) in a child started
    first (``started_loader``, if the job script started it before importing this module)."""
    loader = start_loader_process(spec, threads or 1, started_loader)
    try:
        build(spec, manifest_path, beton_path, record_path, threads=1, smoke=True, survey_path=survey_path, log=log)
    except BaseException:
        if loader is not None:
            loader.close()
        raise
    paths = (manifest_path, beton_path, record_path, report_path, failed_report_path)
    return verify_dataset(spec, *paths, smoke=True, threads=threads, loader=loader)


def gate_and_write(
    spec: DatasetSpec,
    manifest_path: str,
    smoke_paths: dict[str, str],
    beton_path: str,
    record_path: str,
    threads: int | None = None,
    log=sys.stderr,
    started_loader: LoaderProcess | None = None,
) -> dict[str, Any]:
    """The smoke file and its gate (``smoke_and_gate``), then, only if it passed, the full file
    (``build``): the write job of a dataset without partitions. One job, so that both Loader batches
    (the gate's, and the full file's for its record) share one child and one import of ffcv (torch,
    2-3 s of a core), and the full write costs no second start-up. ``smoke_paths``: the smoke stage's
    beton, record, survey, report and failed_report paths."""
    loader = start_loader_process(spec, threads or 1, started_loader)  # None where no child is wanted
    with loader.kept_open() if loader is not None else contextlib.nullcontext():
        smoke_and_gate(spec, manifest_path, **smoke_paths, threads=threads, log=log, started_loader=loader)
        return build(spec, manifest_path, beton_path, record_path, threads=threads, log=log, started_loader=loader)
