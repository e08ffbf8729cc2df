"""``kind: iterable`` through real snakemake: a generator of unknown length built and verified; a
raise at a position stops the build with the position named and the finished parts kept; the rerun
resumes after them without rewriting them; an edit of the generator's module rebuilds."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from conftest import run_snakemake, write_config

# A generator of unknown length over JSON metadata, arrays and labels; a file FAIL_AT in the
# working directory makes it raise at that position (the working directory is the project).
GENERATOR = """
import os
import numpy as np


def stream(n):
    fail_at = int(open("FAIL_AT").read()) if os.path.exists("FAIL_AT") else -1
    for i in range(n):
        if i == fail_at:
            raise ConnectionError(f"lost the connection at record {i}")
        yield {"x": np.arange(6, dtype=np.float32) * i, "y": i % 7, "meta": {"id": f"r{i}"}}
"""


def entry(**extra) -> dict:
    return {
        "source": {"kind": "iterable", "factory": "wf_stream:stream", "args": {"n": 45}, **extra},
        "fields": {
            "x": {"type": "ndarray", "dtype": "float32", "shape": [6]},
            "y": {"type": "int"},
            "meta": {"type": "json"},
        },
        "smoke": {"samples": 4},
        "samples_per_partition": 10,
    }


def rules_run(result: subprocess.CompletedProcess) -> list[str]:
    return re.findall(r"^(?:local)?(?:rule|checkpoint) (\w+):", result.stdout + result.stderr, re.M)


def part_stats(parts: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in sorted(parts.iterdir())}


def test_iterable_is_built_interrupted_by_a_raise_resumed_and_verified(tmp_path: Path):
    (tmp_path / "wf_stream.py").write_text(GENERATOR)
    write_config(tmp_path, {"gen": entry()})
    results = tmp_path / "results" / "gen"

    (tmp_path / "FAIL_AT").write_text("34")
    failed = run_snakemake(tmp_path, check=False)
    assert failed.returncode != 0
    log = failed.stdout + failed.stderr
    assert "producing sample 34" in log and "lost the connection at record 34" in log
    # the raise is past the first samples, in the write job's full stage after its gate passed: Snakemake
    # removed the failed job's outputs, the gate's report with them (the resumed job gates again)
    assert "gen (part 0, samples 0..9)" in (tmp_path / "logs/write/gen.log").read_text()
    assert not (results / "smoke.verify.json").exists()
    assert not (results / "gen.beton").exists() and not (results / "gen.write.json").exists()
    finished = part_stats(results / "parts")
    # three full parts, and the 4 samples read before the raise as a short one
    assert sorted(finished) == [f"{i}.{ext}" for i in range(4) for ext in ("beton", "write.json")]

    (tmp_path / "FAIL_AT").unlink()
    resumed = run_snakemake(tmp_path)
    assert "write" in rules_run(resumed) and "source_manifest" not in rules_run(resumed)
    after = part_stats(results / "parts")
    assert {name: after[name] for name in finished} == finished  # not rewritten
    assert sorted(after) == [f"{i}.{ext}" for i in range(6) for ext in ("beton", "write.json")]
    record = json.loads((results / "gen.write.json").read_text())
    assert record["stream"] == {"count": 45, "parts": 6, "resumed_parts": 4}
    assert [p["start"] for p in record["partitions"]] == [0, 10, 20, 30, 34, 44]
    report = json.loads((results / "gen.verify.json").read_text())
    assert report["ok"] and report["num_samples"] == {"expected": 45, "found": 45}
    assert report["source"]["length"] == 45
    assert {c["name"] for c in report["checks"]} >= {"fixed_fields", "variable_fields", "stream_length", "loader_batch"}
    manifest = json.loads((results / "source.json").read_text())
    assert manifest["length"] is None and manifest["stream"]["first_samples"] == 4
    assert (results / "report" / "summary.html").exists()

    assert "Nothing to be done" in (lambda r: r.stdout + r.stderr)(run_snakemake(tmp_path))

    # an edit of the generator's module (adapter code) rebuilds, every part rewritten
    (tmp_path / "wf_stream.py").write_text(GENERATOR.replace("% 7", "% 5"))
    rebuilt = run_snakemake(tmp_path)
    assert {"source_manifest", "write", "verify"} <= set(rules_run(rebuilt))  # write: its smoke gate first
    record = json.loads((results / "gen.write.json").read_text())
    assert record["stream"]["resumed_parts"] == 0
    assert all(part_stats(results / "parts")[n][1] != finished[n][1] for n in finished)


def test_length_mismatch_stops_the_build_naming_the_key(tmp_path: Path):
    (tmp_path / "wf_stream.py").write_text(GENERATOR)
    write_config(tmp_path, {"gen": entry(length=50)})
    failed = run_snakemake(tmp_path, check=False)
    assert failed.returncode != 0
    assert "yielded 45 samples but `datasets.gen.source.length` says 50" in failed.stdout + failed.stderr
    assert not (tmp_path / "results/gen/gen.beton").exists()
