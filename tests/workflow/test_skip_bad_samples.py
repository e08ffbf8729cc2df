"""bad_samples: {policy: skip} through real snakemake: a single write and a partitioned one skip,
verify and report their bad samples; more than max, or every sample bad, stops with the list and
leaves no .beton; `fail` (the default) still stops at the first bad sample."""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
from pathlib import Path

import pytest
from conftest import BIN, run_snakemake, write_config

from betonbuild.config.spec import smoke_positions

N = 200
SMOKE = 8  # smoke samples: the first 8 and 8 seeded-random others

ADAPTER = textwrap.dedent(
    '''
    """Written by tests/workflow/test_skip_bad_samples.py: samples that raise at the listed indices."""

    import numpy as np


    class Records:
        def __init__(self, n, bad):
            self.n, self.bad = n, set(bad)

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            i = int(i)
            if i in self.bad:
                raise ValueError(f"record {i} is corrupt")
            return np.full(4, i % 251, dtype=np.uint8), i


    def make(n, bad):
        return Records(n, bad)
    '''
)


def outside_smoke(count: int, start: int = 20) -> list[int]:
    """``count`` source indices the smoke stage does not read (the order is the identity here)."""
    smoke = set(smoke_positions(N, SMOKE, 0).tolist())
    return [i for i in range(start, N) if i not in smoke][:count]


# one bad sample per part of 70; index 5 is a smoke sample too (the smoke stage's share of max 5 is 1)
SKIPPED = [5, outside_smoke(1, start=80)[0], outside_smoke(1, start=150)[0]]
TOO_MANY = outside_smoke(4)


def dataset(bad, policy="skip", max_=5, **extra) -> dict:
    return {
        "source": {"kind": "python", "factory": "records:make", "args": {"n": N, "bad": list(bad)}},
        "fields": {"x": {"type": "ndarray", "dtype": "uint8", "shape": [4]}, "y": {"type": "int"}},
        "smoke": {"samples": SMOKE},
        **({"bad_samples": {"policy": policy, "max": max_}} if policy else {}),
        **extra,
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    workdir = tmp_path_factory.mktemp("skipping")
    (workdir / "records.py").write_text(ADAPTER)
    datasets = {
        "skipping": dataset(SKIPPED),
        "parted": dataset(SKIPPED, samples_per_partition=70),
        "parts_over": dataset(SKIPPED, max_=2, samples_per_partition=70),  # 1 per part, 3 together
        "too_many": dataset(TOO_MANY, max_=2),
        "all_bad": dataset(range(N), max_=0.5),
        "failing": dataset(TOO_MANY[:1], policy=None),
    }
    write_config(workdir, datasets)
    return workdir, run_snakemake(workdir, "all", "--keep-going", timeout=600, check=False)


def test_skip_builds_verifies_and_reports_the_count(built):
    workdir, result = built
    for ds in ("skipping", "parted"):
        report = json.loads((workdir / f"results/{ds}/{ds}.verify.json").read_text())
        assert report["ok"], (ds, report["worst"], result.stderr[-3000:])
        assert report["num_samples"] == {"expected": N - 3, "found": N - 3, "planned": N}
        assert report["skipped"]["count"] == 3 and report["skipped"]["limit"] == 5
        assert [s["index"] for s in report["skipped"]["samples"]] == SKIPPED
        assert next(c for c in report["checks"] if c["name"] == "skipped_samples")["ok"]
        listed = json.loads((workdir / f"results/{ds}/skipped.json").read_text())
        assert [s["index"] for s in listed["samples"]] == SKIPPED
        assert [s["position"] for s in listed["samples"]] == SKIPPED  # the order is the identity
        assert listed["written"] == N - 3
        assert all("ValueError: record" in s["message"] for s in listed["samples"])
        page = (workdir / f"results/{ds}/report/summary.html").read_text()
        assert "3 bad sample(s) skipped of 200" in page
    smoke = json.loads((workdir / "results/skipping/smoke.verify.json").read_text())
    assert smoke["ok"] and smoke["skipped"]["count"] == 1  # index 5, within the smoke stage's share
    parted = json.loads((workdir / "results/parted/parted.write.json").read_text())
    assert [p["num_samples"] for p in parted["partitions"]] == [69, 69, 59]
    merged = json.loads((workdir / "results/parted/parted.verify.json").read_text())
    assert next(c for c in merged["checks"] if c["name"] == "parts")["ok"]


def test_a_skipped_sample_is_kept_for_repro(built):
    workdir, _ = built
    listed = json.loads((workdir / "results/skipping/skipped.json").read_text())
    assert listed["repro"][0] == f"betonbuild repro {Path('results/skipping/skipped/5')}"
    replay = subprocess.run(
        [str(BIN / "betonbuild"), "repro", "results/skipping/skipped/5"], cwd=workdir, capture_output=True, text=True
    )
    assert replay.returncode != 0
    assert "sample index 5: the source's __getitem__ raised ValueError: record 5 is corrupt" in replay.stderr


def test_more_bad_samples_than_max_stop_with_the_list_and_no_beton(built):
    workdir, result = built
    assert result.returncode != 0
    assert not (workdir / "results/too_many/too_many.beton").exists()
    assert "dataset 'too_many'" in result.stderr
    # the write stops at the third (a second worker may find one more before it is stopped)
    assert re.search(
        r"[34] bad samples in the full write, more than bad_samples.max allows \(2 of 200\)", result.stderr
    )
    for i in TOO_MANY[:3]:
        assert f"index {i}: the source's __getitem__ raised ValueError: record {i} is corrupt" in result.stderr
    failure = json.loads((workdir / "results/too_many/failure/failure.json").read_text())
    assert [s["index"] for s in failure["skipped"]][:3] == TOO_MANY[:3]
    assert failure["index"] == TOO_MANY[0]


def test_parts_each_within_max_but_over_it_together_are_not_merged(built):
    workdir, result = built
    assert not (workdir / "results/parts_over/parts_over.beton").exists()
    for i in range(3):
        part = json.loads((workdir / f"results/parts_over/parts/{i}.write.json").read_text())
        assert part["skipped"]["count"] == 1 and part["skipped"]["limit"] == 2
    assert "dataset 'parts_over'" in result.stderr
    assert "3 bad samples in the merge write, more than bad_samples.max allows (2 of 200)" in result.stderr


def test_every_sample_bad_stops_in_the_smoke_stage_not_with_an_empty_beton(built):
    workdir, result = built
    assert not (workdir / "results/all_bad/all_bad.beton").exists()
    assert not (workdir / "results/all_bad/smoke.beton").exists()
    # max 0.5 of 200 allows 100: the smoke stage allows its share, 8 of its 16, and stops at the 9th
    assert f"9 bad samples in the smoke write, more than bad_samples.max allows ({SMOKE} of {2 * SMOKE})" in (
        result.stderr
    )


def test_fail_still_stops_at_the_first_bad_sample(built):
    workdir, result = built
    assert not (workdir / "results/failing/failing.beton").exists()
    assert f"dataset 'failing', sample index {TOO_MANY[0]}: the source's __getitem__ raised ValueError" in (
        result.stderr
    )
    assert not (workdir / "results/failing/skipped.json").exists()
