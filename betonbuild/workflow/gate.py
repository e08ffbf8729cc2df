"""The smoke gate: the smoke file written and read back in full in one process (``smoke_and_gate``,
a partitioned dataset's smoke job), and the write job of a dataset without partitions, which gates
on its smoke file and then writes the full file (``gate_and_write``)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

from betonbuild.config.spec import DatasetSpec
from betonbuild.verify import LoaderProcess, start_loader_process
from betonbuild.workflow.stages import build, verify_dataset
from betonbuild.write.writer import WriteInterrupted


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
    """The smoke file and its gate, then the full file (``build``): the write job of a dataset without
    partitions. One job, so that both Loader batches (the gate's, and the full file's for its
    record) share one child and one import of ffcv (torch, 2-3 s of a core), and the full write
    costs no second start-up. ``smoke_paths``: the smoke stage's beton, record, survey, report and
    failed_report paths.

    The full write starts once the gate's every check but its Loader batch has passed: a bad sample
    still stops the job before it. The Loader batch's answer (the child is still importing ffcv) is
    awaited during the write (``SmokeGate``); if it fails, the write ends within 50 ms, and no full
    file or record is left."""
    loader = start_loader_process(spec, threads or 1, started_loader)  # None where no child is wanted
    if loader is None:  # the gate's Loader batch runs in this process, which imports ffcv for it
        smoke_and_gate(spec, manifest_path, **smoke_paths, threads=threads, log=log)
        return build(spec, manifest_path, beton_path, record_path, threads=threads, log=log)
    with loader.kept_open():
        smoke = {"threads": 1, "smoke": True, "survey_path": smoke_paths["survey_path"], "log": log}
        build(spec, manifest_path, smoke_paths["beton_path"], smoke_paths["record_path"], **smoke)
        gate = SmokeGate(spec, manifest_path, smoke_paths, threads, loader)
        gate.wait_for_comparisons()
        try:
            full = {"threads": threads, "log": log, "started_loader": loader, "watch": gate.raise_if_failed}
            record = build(spec, manifest_path, beton_path, record_path, **full)
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, WriteInterrupted)):
                loader.end()  # no wait for its answer: the gate's report then says the child ended first
            gate.thread.join()  # its report, written as it would be: the answer comes within seconds
            raise
        try:
            gate.finish()
        except BaseException:
            for path in (beton_path, record_path):  # the gate failed: the full file does not stand
                Path(path).unlink(missing_ok=True)
            raise
    return record


class SmokeGate:
    """The smoke file's verification (``verify_dataset``) on a thread, so that its Loader batch's
    answer can be awaited while the full file is written. ``wait_for_comparisons`` returns once
    every other check has passed, or raises the gate's failure; ``raise_if_failed`` (the full
    write's ``watch``) raises it once the answer failed; ``finish`` waits for the report."""

    def __init__(self, spec: DatasetSpec, manifest_path: str, paths: dict[str, str], threads, loader: LoaderProcess):
        self.compared = threading.Event()
        self.comparisons_passed = False
        self.error: BaseException | None = None
        paths = [manifest_path, *(paths[k] for k in ("beton_path", "record_path", "report_path", "failed_report_path"))]
        options = {"smoke": True, "threads": threads, "loader": loader, "compared": self._compared}
        self.thread = threading.Thread(target=self._verify, args=(spec, paths, options), daemon=True)
        self.thread.start()

    def _verify(self, spec: DatasetSpec, paths: list[str], options: dict) -> None:
        try:
            verify_dataset(spec, *paths, **options)
        except BaseException as exc:  # noqa: BLE001 - raised in the job's own thread, by raise_if_failed
            self.error = exc
        finally:
            self.compared.set()

    def _compared(self, passed: bool) -> None:
        self.comparisons_passed = passed
        self.compared.set()

    def wait_for_comparisons(self) -> None:
        self.compared.wait()
        if not self.comparisons_passed:
            self.finish()  # a check failed (or the verification ended early): its report, and its error

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    def finish(self) -> None:
        self.thread.join()
        self.raise_if_failed()
