"""``bad_samples: {policy: skip}`` for ``kind: iterable``: each part leaves out the samples the
field contract refuses, records them (part records, the write record, skipped.json, the first few
for ``betonbuild repro``), counts them against ``max`` across parts, and verification against a
second iteration drops exactly the recorded positions; the iterable itself raising is never
skipped. Real stages, real ffcv writes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from betonbuild.beton.format import BetonFile
from betonbuild.config.load import load_config
from betonbuild.errors import ConfigError, SampleError, VerificationError
from betonbuild.fields import field_kind
from betonbuild.workflow.stages import build, make_source_manifest, verify_dataset
from betonbuild.write.failure import replay
from betonbuild.write.skips import TooManyBadSamples

FIELDS = {"x": {"type": "ndarray", "dtype": "float32", "shape": [4]}, "y": {"type": "int"}}
BAD = (3, 15, 22)  # one in each part of 10 (3 is also among the 4 smoke samples)

# BAD positions yield float64 arrays (the float32 field's contract refuses them); FAIL_AT (a file)
# makes the iterable itself raise at that position.
STREAM = """
import os
import numpy as np

BAD = (3, 15, 22)


def with_bad(n=25):
    fail_at = int(open("FAIL_AT").read()) if os.path.exists("FAIL_AT") else -1
    for i in range(n):
        if i == fail_at:
            raise RuntimeError("connection reset")
        yield np.full(4, i, dtype=np.float64 if i in BAD else np.float32), i


def last_bad(n=21):  # the last part holds one sample, and it is bad
    for i in range(n):
        yield np.full(4, i, dtype=np.float64 if i == n - 1 else np.float32), i
"""


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "it_skips.py").write_text(STREAM)
    yield tmp_path
    sys.modules.pop("it_skips", None)


def make_spec(max_=5, policy="skip", factory="it_skips:with_bad", **source):
    entry = {
        "source": {"kind": "iterable", "factory": factory, **source},
        "fields": FIELDS,
        "smoke": {"samples": 4},
        "samples_per_partition": 10,
        "bad_samples": {"policy": policy, "max": max_},
        "verify": {"mode": "full"},
    }
    return load_config({"datasets": {"it": entry}}).datasets["it"]


def paths(d: Path) -> dict[str, str]:
    return {
        "manifest": str(d / "source.json"),
        "beton": str(d / "it.beton"),
        "record": str(d / "it.write.json"),
        "report": str(d / "it.verify.json"),
        "failed": str(d / "failed" / "it.verify.json"),
    }


def run_stages(spec, d: Path, verify: bool = True) -> dict:
    d.mkdir(parents=True, exist_ok=True)
    p = paths(d)
    make_source_manifest(spec, p["manifest"], smoke_path=str(d / "smoke.json"))
    build(spec, p["manifest"], str(d / "smoke.beton"), str(d / "smoke.write.json"), smoke=True)
    smoke = verify_dataset(
        spec,
        p["manifest"],
        str(d / "smoke.beton"),
        str(d / "smoke.write.json"),
        str(d / "sv.json"),
        p["failed"],
        smoke=True,
    )
    assert smoke["ok"], smoke
    build(spec, p["manifest"], p["beton"], p["record"], threads=2)
    return verify_full(spec, d) if verify else {}


def verify_full(spec, d: Path) -> dict:
    p = paths(d)
    return verify_dataset(spec, p["manifest"], p["beton"], p["record"], p["report"], p["failed"], threads=2)


def stored_labels(path: str) -> list[int]:
    spec = make_spec()
    beton = BetonFile(path)
    return np.asarray(
        field_kind(spec.fields[1]).stored_column(beton, spec.fields[1], np.arange(beton.num_samples))
    ).tolist()


def test_bad_samples_of_every_part_are_skipped_recorded_and_verified(workdir: Path):
    d = workdir / "results" / "it"
    report = run_stages(make_spec(), d)
    assert report["ok"], report
    assert report["skipped"]["count"] == 3 and report["num_samples"] == {"expected": 22, "found": 22, "planned": 25}
    assert stored_labels(str(d / "it.beton")) == [i for i in range(25) if i not in BAD]
    smoke = json.loads((d / "sv.json").read_text())  # the smoke gate skipped sample 3 of its first 4
    assert smoke["skipped"]["count"] == 1 and smoke["num_samples"]["found"] == 3
    record = json.loads((d / "it.write.json").read_text())
    assert record["num_samples"] == 22 and record["stream"]["count"] == 25
    assert [(s["position"], s["index"], s["field"]) for s in record["skipped"]["samples"]] == [(i, i, "x") for i in BAD]
    for part, position in enumerate(BAD):  # each part's record: positions among its own rows
        part_record = json.loads((d / "parts" / f"{part}.write.json").read_text())
        assert part_record["written"] == part_record["num_samples"] - 1
        assert [(s["position"], s["index"]) for s in part_record["skipped"]["samples"]] == [(position % 10, position)]
    listed = json.loads((d / "skipped.json").read_text())
    assert listed["count"] == 3 and listed["written"] == 22 and listed["by_field"] == {"x": 3}
    assert all("float64" in s["message"] for s in listed["samples"])
    assert len(listed["repro"]) == 3 and all((d / "skipped" / str(i) / "failure.json").is_file() for i in BAD)
    with pytest.raises(SampleError, match="dtype float64 does not match"):  # betonbuild repro replays it
        replay(d / "skipped" / "15")


def test_a_tampered_record_fails_verification(workdir: Path):
    d = workdir / "results" / "it"
    spec = make_spec()
    run_stages(spec, d, verify=False)
    path = d / "it.write.json"
    original = json.loads(path.read_text())
    dropped = json.loads(path.read_text())
    dropped["skipped"]["samples"].pop(1)  # sample 15 is not in the file, the record no longer says so
    path.write_text(json.dumps(dropped))
    with pytest.raises(VerificationError, match="num_samples"):
        verify_full(spec, d)
    moved = json.loads(json.dumps(original))
    moved["skipped"]["samples"][1].update(position=16, index=16)  # counts agree, the rows compared do not
    path.write_text(json.dumps(moved))
    with pytest.raises(VerificationError):
        verify_full(spec, d)
    path.write_text(json.dumps(original))
    assert verify_full(spec, d)["ok"]


def test_more_bad_samples_than_max_across_parts_stop_the_write_with_the_list(workdir: Path):
    d = workdir / "results" / "it"
    with pytest.raises(TooManyBadSamples) as caught:
        run_stages(make_spec(max_=2), d, verify=False)
    message = str(caught.value)
    assert "3 bad samples in the full write, more than bad_samples.max allows (2 of" in message
    assert all(f"index {i} field 'x'" in message for i in BAD)
    assert not (d / "it.beton").exists()
    assert sorted(p.name for p in (d / "parts").iterdir()) == ["0.beton", "0.write.json", "1.beton", "1.write.json"]
    assert json.loads((d / "failure" / "failure.json").read_text())["skipped"][0]["index"] == 3


def test_the_iterable_raising_is_not_skipped_and_the_write_resumes(workdir: Path):
    d = workdir / "results" / "it"
    (workdir / "FAIL_AT").write_text("18")
    with pytest.raises(SampleError, match="raised RuntimeError: connection reset while producing sample 18"):
        run_stages(make_spec(), d, verify=False)
    assert json.loads((d / "parts" / "1.write.json").read_text())["num_samples"] == 8  # 10..17, 15 skipped
    (workdir / "FAIL_AT").unlink()
    build(make_spec(), *(paths(d)[k] for k in ("manifest", "beton", "record")), threads=2)
    record = json.loads((d / "it.write.json").read_text())
    assert record["stream"]["resumed_parts"] == 2 and [s["index"] for s in record["skipped"]["samples"]] == list(BAD)
    assert verify_full(make_spec(), d)["ok"]


def test_a_part_that_skipped_is_rewritten_when_the_policy_becomes_fail(workdir: Path):
    d = workdir / "results" / "it"
    run_stages(make_spec(), d, verify=False)
    with pytest.raises(SampleError, match="sample index 3"):
        build(make_spec(policy="fail"), *(paths(d)[k] for k in ("manifest", "beton", "record")), threads=2)
    assert not (d / "parts" / "0.write.json").exists()


def test_a_fraction_max_needs_the_length_and_says_why():
    with pytest.raises(ConfigError) as caught:
        make_spec(max_=0.01)
    assert "datasets.it.bad_samples.max" in str(caught.value) and "source.length" in str(caught.value)
    assert make_spec(max_=0.2, length=25).bad_samples.limit(25) == 5
    assert make_spec(max_=0).bad_samples.limit(1) == 0  # a count of 0 needs no length


def test_a_last_part_whose_every_sample_is_bad_leaves_no_file_and_the_rest_verifies(workdir: Path):
    d = workdir / "results" / "it"
    spec = make_spec(factory="it_skips:last_bad")
    assert run_stages(spec, d)["ok"]
    last = json.loads((d / "parts" / "2.write.json").read_text())
    assert (last["num_samples"], last["written"], last["skipped"]["count"]) == (1, 0, 1)
    assert not (d / "parts" / "2.beton").exists()
    assert stored_labels(str(d / "it.beton")) == list(range(20))
    build(spec, *(paths(d)[k] for k in ("manifest", "beton", "record")), threads=2)  # every part reused
    record = json.loads((d / "it.write.json").read_text())
    assert record["stream"]["resumed_parts"] == 3 and [s["index"] for s in record["skipped"]["samples"]] == [20]
    assert verify_full(spec, d)["ok"]
