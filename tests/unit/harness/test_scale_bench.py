"""The scaling benchmark's pieces (bench/harness/b9_scale.py), at tiny sizes: its generated data, the
per-job records it reads from Snakemake's benchmark files, the growth and the targets it derives, the
growth curve drawn beside RESULTS.md, and its plain ffcv sides writing the content betonbuild writes."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from braceexpand import braceexpand
from PIL import Image

from bench.harness import b9_scale, data, plots
from bench.harness.runner import digest
from bench.harness.workflow import rule_records, write_config

REPO = Path(__file__).resolve().parents[3]
SIDES = REPO / "bench" / "harness" / "sides"


@pytest.fixture(scope="module")
def pool() -> list[bytes]:
    return data.tiny_jpegs(5)


def pixels(jpeg: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(jpeg)) as image:
        return np.asarray(image.convert("RGB"))


def test_the_pool_is_distinct_32x32_jpegs(pool):
    assert len({hashlib.sha256(j).hexdigest() for j in pool}) == 5
    for jpeg in pool:
        with Image.open(io.BytesIO(jpeg)) as image:
            assert (image.format, image.size, image.mode) == ("JPEG", (32, 32), "RGB")


def test_the_folder_is_an_imagenet_layout_of_unique_valid_jpegs(tmp_path, pool):
    n = 2500
    root = data.scale_folder(tmp_path / "folder", n, pool)
    classes = sorted(os.listdir(root))
    assert classes == [f"n{c:08d}" for c in range(1000)]
    files = [root / name / file for name in classes for file in sorted(os.listdir(root / name))]
    assert len(files) == n
    assert sorted(len(os.listdir(root / name)) for name in classes)[::999] == [2, 3]  # 2,500 over 1,000 classes
    digests = set()
    for path in files:
        k = int(path.stem.split("_")[1])
        assert path.parent.name == classes[k % 1000] and path.suffix == ".JPEG"
        payload = path.read_bytes()
        digests.add(hashlib.sha256(payload).hexdigest())
        assert payload != pool[k % 5] and np.array_equal(pixels(payload), pixels(pool[k % 5]))
    assert len(digests) == n  # every file unique, as a real dataset's


def test_few_samples_give_one_class_each(tmp_path, pool):
    root = data.scale_folder(tmp_path / "folder", 7, pool)
    assert [len(os.listdir(root / name)) for name in sorted(os.listdir(root))] == [1] * 7


def test_the_shards_hold_the_folder_samples_in_index_order(tmp_path, pool):
    n = 2500
    pattern = data.scale_shards(tmp_path / "shards", n, pool, per_shard=1000)
    shards = list(braceexpand(pattern))
    assert [Path(s).name for s in shards] == ["train-000000.tar", "train-000001.tar", "train-000002.tar"]
    members = []
    for shard in shards:
        with tarfile.open(shard) as tar:
            members += [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
    assert len(members) == 2 * n
    for k in (0, 999, 1000, 2499):
        (jpg_name, jpg), (cls_name, cls) = members[2 * k], members[2 * k + 1]
        assert (jpg_name, cls_name) == (f"{k:09d}.jpg", f"{k:09d}.cls")
        assert (jpg, int(cls)) == data.scale_sample(pool, k)


def test_the_arrays_are_blockwise_seeded_columns(tmp_path):
    x, label = data.scale_arrays(tmp_path / "a", 2005, block=1000)
    xs, labels = np.load(x), np.load(label)
    assert (xs.dtype, xs.shape, labels.dtype) == (np.float32, (2005, 4), np.int64)
    assert np.array_equal(labels, np.arange(2005) % 1000)
    again, _ = data.scale_arrays(tmp_path / "b", 2005, block=1000)
    assert np.array_equal(np.load(again), xs) and len(np.unique(xs[:, 0])) == 2005


def test_rule_records_read_snakemake_benchmark_files(tmp_path):
    header = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    files = {
        "write/ds.tsv": "12.5\t0:00:12\t812.3\t900\t700\t640.1\t1\t2\t150\t20\n",
        "verify_smoke/ds.tsv": "0.4\t0:00:00\tNA\tNA\tNA\tNA\tNA\tNA\tNA\tNA\n",  # shorter than the first poll
        "write_part/ds.0.tsv": "3.0\t0:00:03\t100\t1\t1\t90\t0\t0\t0\t1\n",
        "write_part/ds.1.tsv": "4.0\t0:00:04\t300\t1\t1\t80\t0\t0\t0\t1\n",
    }
    for name, row in files.items():
        (tmp_path / "benchmarks" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "benchmarks" / name).write_text(header + row)
    found = rule_records(tmp_path)
    assert found["write"] == {"s": 12.5, "max_rss": 812.3, "max_pss": 640.1, "jobs": 1}
    assert found["verify_smoke"] == {"s": 0.4, "max_rss": None, "max_pss": None, "jobs": 1}
    assert found["write_part"] == {"s": 7.0, "max_rss": 300.0, "max_pss": 90.0, "jobs": 2}
    assert rule_records(tmp_path, since=os.path.getmtime(tmp_path / "benchmarks" / "write" / "ds.tsv") + 60) == {}


def job(s: float, rss: float | None = None) -> dict:
    return {"s": s, "max_rss": rss, "max_pss": rss, "jobs": 1}


def case(family: str, n: int, jobs: dict, build: float, plain: float, dry: float = 1.0, noop: float = 1.0, tag=""):
    """A measured case as ``_measure`` returns it, built from fixture numbers by the benchmark's own code."""
    tag = tag or f"{family}_{n}"
    names = {k: f"{tag}_{k}" for k in ("plain_ffcv", "build")}
    rounds = [
        {
            names["plain_ffcv"]: {"seconds": plain, "other_cores": 0.0},
            names["build"]: {"seconds": build, "other_cores": 0.0},
        }
    ]
    found = {
        "family": family,
        "n": n,
        "tag": tag,
        "seconds": {"plain_ffcv": plain, "build": build, "dry_run": dry, "noop": noop},
        "jobs": b9_scale.job_costs([jobs], n, build),
        "ratios": [b9_scale.ratio(rounds, names["build"], names["plain_ffcv"])],
        "not_noop": [],
        "plain_rss_mib": 600,
        "plain_in_process_s": plain - 3.0,
        "build_largest_process_rss_mib": 700,
    }
    if family == "arrays":
        found["ratios"].append(b9_scale.write_job_ratio(rounds, [jobs], names, family, n))
    return found


def test_job_costs_per_sample_and_snakemake_itself():
    costs = b9_scale.job_costs([{"write": job(8.0, 500), "verify": job(2.0)}], 1000, build_seconds=14.0)
    assert costs["write"]["s_per_sample"] == pytest.approx(0.008)
    assert costs["write"]["max_rss_mib"] == 500 and costs["verify"]["max_rss_mib"] is None
    assert costs[b9_scale.SNAKEMAKE_ITSELF]["s"] == pytest.approx(4.0)  # 14 s of build, 10 s of jobs


def fixture_cases() -> list[dict]:
    return [
        # per sample: write 1.0 -> 1.2 ms (1.2x), manifest 0.5 -> 1.0 ms (2x), the rest of the build 1.5 -> 0.8 ms
        case("folder", 10_000, {"write": job(10.0, 600), "source_manifest": job(5.0, 300)}, build=30.0, plain=20.0),
        case(
            "folder",
            1_000_000,
            {"write": job(1200.0, 900), "source_manifest": job(1000.0, 2000)},
            build=3000.0,
            plain=2000.0,
            dry=12.0,
            noop=4.0,
        ),
        case("arrays", 10_000, {"write": job(1.0, 100)}, build=5.0, plain=1.0),
        case(
            "arrays",
            20_000_000,
            {"write": job(150.0, 3000), "verify": job(60.0, 2000)},
            build=260.0,
            plain=180.0,
            tag="rows_20000000",
        ),
    ]


def test_growth_is_per_sample_cost_at_the_largest_n_over_the_smallest():
    growths = b9_scale.growth(fixture_cases())
    assert set(growths) == {"folder"}  # arrays: one N case (the rows case is not one of them)
    folder = growths["folder"]
    assert (folder["from"], folder["to"]) == (10_000, 1_000_000)
    assert folder["stages"]["write"] == pytest.approx(1.2)
    assert folder["stages"]["source_manifest"] == pytest.approx(2.0)
    assert folder["stages"][b9_scale.SNAKEMAKE_ITSELF] == pytest.approx((800 / 1e6) / (15 / 1e4), abs=1e-3)


def test_targets_say_met_and_missed_against_the_issue():
    cases = fixture_cases()
    found = {t["of"]: t for t in b9_scale.targets(cases, b9_scale.growth(cases))}
    build = found["folder_1000000_build / folder_1000000_plain_ffcv"]
    assert (build["value"], build["measured"], build["met"]) == (1.3, 1.5, False)
    assert found["folder_1000000 `snakemake -n all` seconds"]["met"] is False  # 12 s > 10 s
    assert found["folder_1000000 no-op `snakemake all` seconds"]["met"] is True  # 4 s <= 5 s
    growth = found["folder worst stage: s/sample at 1000000 / at 10000"]
    assert growth["measured"] == pytest.approx(2.0) and growth["met"] is False and "source_manifest" in growth["text"]
    write = next(t for of, t in found.items() if of.startswith("rows_20000000_build write job"))
    assert (write["measured"], write["met"]) == (pytest.approx(150 / 180, abs=1e-3), True)
    rss = found["rows_20000000 largest job (write) max_rss MiB"]
    assert (rss["value"], rss["measured"], rss["met"]) == (2384, 3000, False)
    assert len(found) == 6


def test_a_rows_case_above_what_plain_ffcv_survives_is_the_build_alone_against_4_gb():
    """100M rows: plain ffcv (~500 bytes a sample) is not run; the target is completing within 4 GB per job."""
    rows = case("arrays", 100_000_000, {"write": job(900.0, 3500), "verify": job(300.0, 3900)}, 1400.0, 1.0)
    rows.update(tag="rows_100000000", ratios=[], plain_rss_mib=None, plain_in_process_s=None)
    rows["seconds"]["plain_ffcv"] = None
    (found,) = b9_scale.targets([rows], {})
    assert found["of"] == "rows_100000000 largest job (verify) max_rss MiB"
    assert (found["value"], found["measured"], found["met"]) == (3815, 3900, False)  # 4 GB = 3815 MiB
    assert "plain ffcv not run" in b9_scale.case_note(rows)


def test_assembled_entry_renders_and_draws_the_growth_curve(tmp_path):
    from bench.harness import report  # why: the renderer under test, after the benchmark's own functions

    entry = b9_scale.assemble([{**c, "sides": {}, "rounds": []} for c in fixture_cases()])
    entry.update(status="measured", measured_at="2026-12-01 12:00 UTC", command="x", tree="abc1234 (t)")
    entry.update(pairs=1, duration_s=1, load1={"min": 0.0, "max": 0.0})
    report.update_markdown(tmp_path / "RESULTS.md", {"benchmarks": {"scale": entry}, "last_run": {}})
    text = (tmp_path / "RESULTS.md").read_text()
    assert (
        "[scale.png](scale.png)" in text
        and "| folder | source_manifest (1000000 vs 10000) | 2.00 | **missed** |" in text
    )
    assert (tmp_path / "scale.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = (tmp_path / "scale.csv").read_text().splitlines()
    assert rows[0] == "family,stage,samples,us_per_sample" and "folder,write,1000000,1200.0" in rows
    assert "folder,plain_ffcv (whole),1000000,2000.0" in rows  # 2,000 s for 1M samples
    assert "(no warm-up round)" in text


def test_a_failed_entry_draws_nothing(tmp_path):
    plots.draw(tmp_path, {"status": "error", "plot": {"file": "x.png", "csv": "x.csv", "curves": {"a": {}}}}, "abc1234")
    assert list(tmp_path.iterdir()) == []


def run(*command, cwd: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, *map(str, command)], cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("family", ["folder", "arrays"])
def test_the_plain_side_writes_what_betonbuild_writes(tmp_path, pool, family):
    """The benchmark's content check can hold: plain ffcv's file and betonbuild's have one content digest."""
    if family == "folder":
        root = data.scale_folder(tmp_path / "folder", 1050, pool)  # 2 files in 50 classes
        spec = {"source": {"kind": "image_folder", "root": str(root)}, "fields": b9_scale.FIELDS_IMAGE}
        run(SIDES / "plain_folder.py", root, tmp_path / "plain.beton", 1, 16, cwd=tmp_path)
    else:
        x, label = data.scale_arrays(tmp_path / "arrays", 500)
        spec = {
            "source": {"kind": "arrays", "columns": {"x": str(x), "label": str(label)}},
            "fields": {"x": {"type": "ndarray", "dtype": "float32", "shape": [4]}, "label": {"type": "int"}},
        }
        run(SIDES / "plain_columns.py", x, label, tmp_path / "plain.beton", 1, 16, cwd=tmp_path)
    write_config(tmp_path, {"scale": {**spec, "writer": {"chunksize": 16}}})
    out = tmp_path / "ours.beton"
    run("-m", "betonbuild", "write", "--config", "config.yaml", "--dataset", "scale", "--output", out, cwd=tmp_path)
    assert digest(tmp_path / "plain.beton") == digest(out)
