"""Benchmark 10's input: an ImageNet-like folder with ImageNet's quirks, and its content check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from bench.harness import b10_imagenet_like
from bench.harness.b10_data import CMYK_AT, GREY_EVERY, PNG_AT, SIDES, imagenet_like
from bench.harness.runner import ContentMismatch, Side


def test_the_folder_has_the_quirks_and_sizes_of_imagenet(tmp_path: Path):
    root = imagenet_like(tmp_path, GREY_EVERY + 3, classes=5)
    files = sorted(root.rglob("*.JPEG"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    assert len(files) == GREY_EVERY + 3 and len({p.parent for p in files}) == 5
    formats = {}
    for k, path in enumerate(files):
        with Image.open(path) as image:
            formats[k] = (image.format, image.mode)
            assert SIDES[0] <= max(image.size) <= SIDES[1]
    assert formats[CMYK_AT] == ("JPEG", "CMYK")
    assert formats[PNG_AT][0] == "PNG"
    assert formats[GREY_EVERY - 1] == ("JPEG", "L")
    assert sum(f == ("JPEG", "RGB") for f in formats.values()) == len(files) - 3
    made = (root / "spec.json").stat().st_mtime_ns
    assert imagenet_like(tmp_path, GREY_EVERY + 3, classes=5) == root
    assert (root / "spec.json").stat().st_mtime_ns == made  # reused, not made again (its spec holds tuples)


def test_the_content_check_compares_reencode_with_plain_and_keep_with_keep():
    sides = [Side(n, [], Path(".")) for n in ("r_plain_ffcv", "r_write_reencode", "r_write_keep", "r_snakemake_keep")]
    check = b10_imagenet_like.content_check(sides)
    row = {"r_plain_ffcv": {"digest": "a"}, "r_write_reencode": {"digest": "a"}}
    row.update({"r_write_keep": {"digest": "k"}, "r_snakemake_keep": {"digest": "k"}})
    assert check(row) == {"plain": "a", "keep": "k"}
    row["r_write_reencode"] = {"digest": "b"}
    with pytest.raises(ContentMismatch, match="plain"):
        check(row)


def _case(tag: str, modes, writes: bool, seconds: dict[str, float], rules: dict[str, dict]) -> dict:
    kinds = ("write", "snakemake") if writes else ("snakemake",)
    names = [f"{tag}_plain_ffcv"] + [f"{tag}_{kind}_{m}" for m in modes for kind in kinds]
    stats = {"seconds": {"median": 1.0, "min": 1.0, "max": 1.0}, "cpu_seconds": 1.0, "max_rss_mib": 1}
    stats.update(load1={"median": 0.1, "min": 0.1, "max": 0.1}, other_cores={"median": 0.0, "min": 0.0, "max": 0.0})
    ratios = [
        {"of": f"{n} / {names[0]}", "median": seconds.get(n, 1.0), "min": 0, "max": 0, "per_pair": [1.0]}
        for n in names[1:]
    ]
    return {
        "max_resolution": 256,
        "sides": {n: {"command": "x", **stats} for n in names},
        "ratios": ratios,
        "snakemake_rule_seconds": rules,
        "rounds": [{n: {"load1": 0.5, "seconds": 1.0} for n in names}],
    }


def test_run_assembles_the_cases_into_the_issues_targets(monkeypatch, tmp_path: Path):
    from bench.harness import report
    from bench.harness.runner import Context

    def fake_case(ctx, root, max_resolution, tag, modes=b10_imagenet_like.MODES, writes=True):
        rules = {m: {"write": 2.0, "verify": 0.8} for m in modes}
        return _case(tag, modes, writes, {f"{tag}_snakemake_reencode": 0.9, f"{tag}_snakemake_keep": 0.3}, rules)

    monkeypatch.setattr(b10_imagenet_like, "measure_case", fake_case)
    monkeypatch.setattr(b10_imagenet_like, "imagenet_like", lambda root, n, classes=1: tmp_path)
    sizes = {"imagenet_samples": 10, "imagenet_classes": 2}
    ctx = Context(cache=tmp_path, tree=tmp_path, cores=2, pairs=1, quick=True, sizes=sizes)
    entry = b10_imagenet_like.run(ctx)
    assert [(t["of"], t["measured"], t["met"]) for t in entry["targets"]] == [
        ("r256_snakemake_reencode / r256_plain_ffcv", 0.9, True),
        ("r512_snakemake_keep / r512_plain_ffcv", 0.3, True),
        ("verify job / write job", 0.4, True),
        ("one_snakemake_reencode / one_plain_ffcv", 0.9, True),
    ]
    entry.update(status="measured", measured_at="now", command="c", duration_s=1, tree="t", pairs=1, commit="abc")
    loads = [run["load1"] for r in entry["rounds"] for run in r.values() if "load1" in run]  # as __main__ does
    assert len(loads) == 5 + 5 + 2
    entry["load1"] = {"min": min(loads), "max": max(loads)}
    assert len(report.table({"benchmarks": {"imagenet_like": entry}})) > 2
    text = "\n".join(report.details(entry))
    assert "verify job / write job" in text and "r512_snakemake_keep" in text


def test_the_verification_is_measured_against_the_write_jobs_full_write(tmp_path: Path):
    """The write job also writes and gates on the smoke file, whose Loader batch is awaited during
    the full write: the denominator is the full write's own seconds, from its record."""
    (tmp_path / "smoke.write.json").write_text(json.dumps({"seconds": 0.25}))
    (tmp_path / "smoke.verify.json").write_text(json.dumps({"seconds": 3.5}))  # overlaps the full write
    (tmp_path / "imagenet.write.json").write_text(json.dumps({"seconds": 4.0}))
    runs = []
    job = {"write": 6.0, "verify": 1.0}
    hook = b10_imagenet_like._with_full_write_stage(tmp_path, runs, lambda *_: runs.append(dict(job)))
    hook({}, "", "")
    assert runs == [{"write": 6.0, "verify": 1.0, "write_full_stage": 4.0}]
    found = b10_imagenet_like._verify_target({"snakemake_rule_seconds": {"reencode": runs[0]}})
    assert (found["of"], found["measured"], found["met"]) == ("verify job / write job's full write", 0.25, True)
