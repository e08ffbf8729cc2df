"""``bad_samples: {policy: skip}`` through real snakemake for the kinds that came after it: an
iterable (bad samples in its parts) and a Parquet file with null rows are built, their bad samples
skipped and listed, verified, and counted on the summary page."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from conftest import run_snakemake, write_config

GENERATOR = """
import numpy as np


def stream(n):
    for i in range(n):
        bad = i in (2, 17, 33)  # float64 into the float32 field: the contract refuses them
        yield {"x": np.arange(6, dtype=np.float64 if bad else np.float32) * i, "y": i % 7}
"""


def test_an_iterable_and_a_parquet_file_skip_their_bad_samples(tmp_path: Path):
    (tmp_path / "wf_skipstream.py").write_text(GENERATOR)
    scores = [None if i in (4, 29) else float(i) for i in range(40)]
    pq.write_table(pa.table({"id": list(range(40)), "score": scores}), tmp_path / "n.parquet", row_group_size=16)
    policy = {"policy": "skip", "max": 5}
    write_config(
        tmp_path,
        {
            "gen": {
                "source": {"kind": "iterable", "factory": "wf_skipstream:stream", "args": {"n": 45}},
                "fields": {"x": {"type": "ndarray", "dtype": "float32", "shape": [6]}, "y": {"type": "int"}},
                "smoke": {"samples": 4},
                "samples_per_partition": 10,
                "bad_samples": policy,
            },
            "nulls": {
                "source": {"kind": "parquet", "path": str(tmp_path / "n.parquet")},
                "fields": {"id": {"type": "int"}, "score": {"type": "float"}},
                "smoke": {"samples": 4},
                "bad_samples": policy,
            },
        },
    )
    run_snakemake(tmp_path)
    for ds, bad, total in (("gen", [2, 17, 33], 45), ("nulls", [4, 29], 40)):
        results = tmp_path / "results" / ds
        report = json.loads((results / f"{ds}.verify.json").read_text())
        assert report["ok"] and report["num_samples"]["found"] == total - len(bad)
        assert [s["index"] for s in report["skipped"]["samples"]] == bad
        listed = json.loads((results / "skipped.json").read_text())
        assert listed["count"] == len(bad) and listed["written"] == total - len(bad)
        assert f"{len(bad)} bad sample(s) skipped of {total}" in (results / "report" / "summary.html").read_text()
