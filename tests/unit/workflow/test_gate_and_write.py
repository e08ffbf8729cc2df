"""The write job of a dataset without partitions (``workflow.gate.gate_and_write``): its smoke file and
gate, then, only if the gate passed, the full file, with one Loader child (one ffcv import) for
the gate's batch and the full file's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from betonbuild.config.load import load_config
from betonbuild.errors import VerificationError
from betonbuild.loader_process import LoaderProcess
from betonbuild.workflow.gate import gate_and_write
from betonbuild.workflow.stages import make_source_manifest
from tests.conftest import make_photo_folder


def photos_spec(root: Path, tolerance: float):
    entry = {
        "source": {"kind": "image_folder", "root": str(root)},
        "fields": {"image": {"type": "rgb_image", "write_mode": "jpg", "max_resolution": 48}, "label": {"type": "int"}},
        "smoke": {"samples": 2},  # 4 of the 12 photos: the full file is written, not copied
        "verify": {"mode": "full", "jpeg_mean_abs_error": tolerance},
    }
    return load_config({"datasets": {"photos": entry}}).datasets["photos"]


@pytest.fixture
def children(monkeypatch) -> list[LoaderProcess]:
    """Every Loader child started, as the job's first process (no ffcv in it yet)."""
    monkeypatch.delitem(sys.modules, "ffcv.loader", raising=False)
    started, real_start = [], LoaderProcess.start.__func__

    def counted(cls):
        started.append(real_start(cls))
        return started[-1]

    monkeypatch.setattr(LoaderProcess, "start", classmethod(counted))
    return started


# A stand-in for the Loader child: it answers the gate's request only once the full file's write has
# begun (its temporary file, or the file, is in the results folder), with the given verdict.
LATE_CHILD = """
import glob, json, sys, time
results, ok = sys.argv[1], sys.argv[2] == "ok"
for number, line in enumerate(iter(sys.stdin.readline, "")):
    seen, deadline = False, time.monotonic() + 60
    while number == 0 and not seen and time.monotonic() < deadline:
        seen = bool(glob.glob(results + "/photos.beton*"))
        time.sleep(0.01)
    detail = "late batch %d, the full write seen: %s" % (number, seen or number > 0)
    print(json.dumps({"ok": ok, "detail": detail}), flush=True)
"""


def late_child(results: Path, verdict: str) -> LoaderProcess:
    command = [sys.executable, "-c", LATE_CHILD, str(results), verdict]
    return LoaderProcess(
        subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE), tempfile.TemporaryFile()
    )


def run(tmp_path: Path, tolerance: float, started: LoaderProcess | None = None):
    spec = photos_spec(make_photo_folder(tmp_path / "photos", per_class=6), tolerance)
    out = tmp_path / "results"
    out.mkdir(exist_ok=True)
    smoke = {
        "beton_path": str(out / "smoke.beton"),
        "record_path": str(out / "smoke.write.json"),
        "survey_path": str(out / "inspect.json"),
        "report_path": str(out / "smoke.verify.json"),
        "failed_report_path": str(out / "failed" / "smoke.verify.json"),
    }
    with open(os.devnull, "w") as quiet:
        make_source_manifest(spec, str(out / "source.json"), plan_parts=False, log=quiet)
        record = gate_and_write(
            spec,
            str(out / "source.json"),
            smoke,
            str(out / "photos.beton"),
            str(out / "photos.write.json"),
            2,
            quiet,
            started,
        )
    return out, record


def test_the_gate_and_the_full_file_are_read_by_one_loader_child(tmp_path: Path, children):
    out, record = run(tmp_path, tolerance=8.0)
    gate = json.loads((out / "smoke.verify.json").read_text())
    assert gate["ok"] and gate["num_samples"]["found"] == 4
    assert next(c for c in gate["checks"] if c["name"] == "loader_batch")["ok"]
    assert record["num_samples"] == 12 and "copied_from" not in record
    assert record["loader_batch"]["ok"], record["loader_batch"]
    (child,) = children  # one process, one import of ffcv and torch
    assert child.served == 2 and child.process.returncode == 0  # both batches, then it exited by itself


def test_a_failing_gate_stops_the_job_before_the_full_write_and_ends_the_child(tmp_path: Path, children):
    with pytest.raises(VerificationError, match="smoke.beton"):
        run(tmp_path, tolerance=0.0)  # every re-encoded JPEG differs from its source a little
    out = tmp_path / "results"
    assert not (out / "smoke.verify.json").exists() and json.loads((out / "failed/smoke.verify.json").read_text())
    assert not (out / "photos.beton").exists() and not (out / "photos.write.json").exists()
    assert not [p for p in out.iterdir() if p.name.startswith("photos.beton")]  # no temporary full file
    (child,) = children
    assert child.served == 1 and child.process.returncode is not None


def test_the_full_write_runs_while_the_gates_loader_batch_is_awaited(tmp_path: Path, children):
    """Every other check of the gate passed, the full write starts; the gate's report waits for
    its Loader batch (here a child that answers only once it sees the full write under way)."""
    (tmp_path / "results").mkdir()
    out, record = run(tmp_path, tolerance=8.0, started=late_child(tmp_path / "results", "ok"))
    gate = json.loads((out / "smoke.verify.json").read_text())
    batch = next(c for c in gate["checks"] if c["name"] == "loader_batch")
    assert gate["ok"] and batch["detail"] == "late batch 0, the full write seen: True", batch
    assert record["num_samples"] == 12 and record["loader_batch"]["detail"].startswith("late batch 1")
    assert not children  # the job's own child served both


def test_a_gate_whose_loader_batch_fails_during_the_full_write_leaves_no_full_file(tmp_path: Path, children):
    (tmp_path / "results").mkdir()
    with pytest.raises(VerificationError, match="loader_batch: late batch 0"):
        run(tmp_path, tolerance=8.0, started=late_child(tmp_path / "results", "fail"))
    out = tmp_path / "results"
    failed = json.loads((out / "failed/smoke.verify.json").read_text())
    assert [c["name"] for c in failed["checks"] if not c["ok"]] == ["loader_batch"]
    assert not (out / "smoke.verify.json").exists()
    assert not [p for p in out.iterdir() if p.name.startswith("photos.")]  # no full file, record or temporary
