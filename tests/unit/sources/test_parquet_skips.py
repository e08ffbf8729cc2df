"""``bad_samples: {policy: skip}`` for ``kind: parquet`` and ``kind: huggingface``: a null row is
not refused when the source opens; its own read fails, and the write skips and records it (real
ffcv writes), verification passes, and a tampered record fails it."""

from __future__ import annotations

import os

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from parquet_samples import numeric_table

from betonbuild.config.load import load_config
from betonbuild.errors import SampleError
from betonbuild.provenance import ffcv_build
from betonbuild.sources import open_source
from betonbuild.verify import verify_beton
from betonbuild.workflow.skipped import write_limit
from betonbuild.write.skips import SkippedSample, from_record
from betonbuild.write.writer import write_beton

NULL_ROWS = (5, 37)


def spec_for(source: dict, fields: dict, policy: str = "skip"):
    entry = {
        "source": source,
        "fields": fields,
        "bad_samples": {"policy": policy, "max": 3},
        "verify": {"mode": "full"},
    }
    return load_config({"datasets": {"pq": entry}}).datasets["pq"]


@pytest.fixture
def nulls_parquet(tmp_path):
    table = numeric_table(40)
    scores = table["score"].to_pylist()
    for row in NULL_ROWS:
        scores[row] = None
    path = tmp_path / "n.parquet"
    pq.write_table(table.set_column(1, "score", pa.array(scores)), path, row_group_size=16)
    return str(path)


def parquet_spec(path, policy="skip"):
    return spec_for({"kind": "parquet", "path": path}, {"id": {"type": "int"}, "score": {"type": "float"}}, policy)


def write_and_verify(spec, tmp_path):
    source = open_source(spec)
    rows = np.arange(len(source))
    target = tmp_path / "out.beton"
    record = write_beton(
        spec, source, rows, target, 2, log=open(os.devnull, "w"), skip=write_limit(spec, len(rows), len(rows), "full")
    )
    report = verify_beton(
        spec,
        source,
        rows,
        str(target),
        ffcv_build(),
        skipped=from_record(record),
        skip_limit=record["skipped"]["limit"],
    )
    return source, rows, target, record, report


def test_under_fail_a_null_is_still_refused_when_the_source_opens(nulls_parquet):
    with pytest.raises(SampleError, match="column 'score' is null in this row"):
        open_source(parquet_spec(nulls_parquet, policy="fail"))


def test_a_null_row_is_skipped_recorded_and_the_file_verifies(nulls_parquet, tmp_path):
    source, rows, target, record, report = write_and_verify(parquet_spec(nulls_parquet), tmp_path)
    assert record["num_samples"] == 38
    skipped = record["skipped"]["samples"]
    assert [(s["position"], s["index"], s["field"]) for s in skipped] == [(r, r, "score") for r in NULL_ROWS]
    assert all("column 'score' is null in this row" in s["message"] for s in skipped)
    assert "n.parquet, row group 2, row 37 of the file" in skipped[1]["location"]
    assert report["ok"], report
    assert report["skipped"]["count"] == 2 and report["num_samples"]["found"] == 38


def test_a_tampered_record_fails_verification(nulls_parquet, tmp_path):
    spec = parquet_spec(nulls_parquet)
    source, rows, target, record, _ = write_and_verify(spec, tmp_path)
    kept_only_one = [SkippedSample(**record["skipped"]["samples"][0])]
    report = verify_beton(spec, source, rows, str(target), ffcv_build(), skipped=kept_only_one, skip_limit=3)
    assert not report["ok"]
    assert not next(c for c in report["checks"] if c["name"] == "num_samples")["ok"]
    moved = [
        SkippedSample(**{**s, "position": s["position"] + 1, "index": s["index"] + 1})
        for s in record["skipped"]["samples"]
    ]
    report = verify_beton(spec, source, rows, str(target), ffcv_build(), skipped=moved, skip_limit=3)
    assert not report["ok"]  # the counts agree; the rows compared differ


def test_a_huggingface_null_row_is_skipped_recorded_and_the_file_verifies(tmp_path):
    labels = list(range(30))
    labels[23] = None
    features = datasets.Features({"y": datasets.Value("int64")})
    datasets.Dataset.from_dict({"y": labels}, features=features).save_to_disk(str(tmp_path / "n"))
    fields = {"y": {"type": "int"}}
    with pytest.raises(SampleError, match="column 'y' is null in this row"):
        open_source(spec_for({"kind": "huggingface", "path": str(tmp_path / "n")}, fields, policy="fail"))
    spec = spec_for({"kind": "huggingface", "path": str(tmp_path / "n")}, fields)
    _, _, _, record, report = write_and_verify(spec, tmp_path)
    assert [(s["index"], s["field"]) for s in record["skipped"]["samples"]] == [(23, "y")]
    assert record["num_samples"] == 29
    assert report["ok"], report
