"""WebDataset sources end to end: the directly decoded .beton, the workflow, bad shards, incremental runs.

The unit tests of the shard list, the tar parser, the direct JPEG decode and the source class (this
process, no ffcv) are in tests/unit/sources/test_{shards,tar,jpeg,webdataset_source}.py; the real
samples and shards both use are in tests/wds_samples.py.

How the cases run (2 cores; a process that imports ffcv costs ~4 s):
- the .beton written with the direct decode against the one written with PIL only (one driver process);
- one module-scoped project built once by real ``snakemake all``: ``photos`` (a glob of photo
  shards, keys + decode) and ``digits`` (a brace pattern of ShardWriter shards read through a
  ``pipeline: module:function``); its content tests read the .beton files back; the incremental
  test (last) then edits its shards;
- the bad-shard matrix: ``betonbuild write`` per case (in this process for the cases that must fail
  in the shard list, before ffcv is imported; a process of its own for the others), then one
  ``snakemake --keep-going`` over all of them;
- a shard changed between its shard list and the write: one driver process runs the stages by hand;
- webdataset not installed: snakemake with a ``sitecustomize`` on PYTHONPATH that hides the package.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from conftest import BIN, SNAKEFILE, make_digits_npz, run_snakemake, write_config
from wds_samples import (
    PHOTO_FIELDS,
    decoded_image,
    digit_samples,
    image_payloads,
    photo_dataset,
    photo_samples,
    tar_offsets,
    write_shard,
)

from betonbuild.workflow.status import plan

wds = pytest.importorskip("webdataset")

BETONBUILD = str(BIN / "betonbuild")
PYTHON = str(BIN / "python")
CASE_LIMIT = 60.0  # a bad-shard case that takes longer than this is a hang
JPEG_TOLERANCE = 8.0  # mean absolute error (0-255) of ffcv's q90 JPEG against the source pixels (verify's default)


def ran(result: subprocess.CompletedProcess) -> dict[str, set[str]]:
    return {ds: {rule for rule, _ in jobs} for ds, jobs in plan(result.stdout + result.stderr).items()}


# ---------------------------------------------------------------------------------------------
# Decoding: plain JPEGs decoded directly write the same .beton as webdataset's rgb8
# ---------------------------------------------------------------------------------------------


FAST_DECODE_DRIVER = textwrap.dedent(
    '''
    """Writes the same shards twice: rgb8 JPEGs decoded directly (the default), then all through PIL."""
    import json, os
    from pathlib import Path

    import betonbuild.sources.jpeg as J
    from betonbuild.config.load import load_config
    from betonbuild.workflow.stages import build, make_shard_list, make_source_manifest

    spec = load_config({"datasets": {"images": json.loads(Path("entry.json").read_text())}}).datasets["images"]
    make_shard_list(spec, "results/shards.json")
    make_source_manifest(spec, "results/source.json")
    real = J.fast_rgb8

    def counted(data):  # runs in the writer's worker processes: a file per process counts the calls
        with open(f"direct-calls-{os.getpid()}", "a") as fh:
            fh.write("x")
        return real(data)

    J.fast_rgb8 = counted
    build(spec, "results/source.json", "results/cv2.beton", "results/cv2.json", threads=2)
    J.jpeg_kind = lambda data: None  # every image through webdataset's decoder
    build(spec, "results/source.json", "results/pil.beton", "results/pil.json", threads=2)
    '''
)


def test_the_written_beton_is_the_same_with_the_direct_decode(tmp_path):
    from betonbuild.beton.format import BetonFile

    payloads = list(image_payloads().values())
    samples = [{"__key__": f"s{i:03d}", ext: payload, "cls": i} for i, (ext, payload, _) in enumerate(payloads)]
    half = len(samples) // 2
    write_shard(tmp_path / "images-0.tar", samples[:half])
    write_shard(tmp_path / "images-1.tar", samples[half:])
    entry = {
        "source": {
            "kind": "webdataset",
            "shards": "images-{0..1}.tar",
            "keys": {"image": "jpg;jpeg;png", "label": "cls"},
        },
        "fields": {"image": {"type": "rgb_image", "write_mode": "jpg"}, "label": {"type": "int"}},
    }
    (tmp_path / "entry.json").write_text(json.dumps(entry))
    (tmp_path / "results").mkdir()
    proc = subprocess.run([PYTHON, "-c", FAST_DECODE_DRIVER], cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-4000:]

    direct_calls = sum(len(p.read_text()) for p in tmp_path.glob("direct-calls-*"))
    assert direct_calls == sum(plain for _, _, plain in payloads)  # each plain JPEG once, decoded directly
    fast, reference = BetonFile(tmp_path / "results/cv2.beton"), BetonFile(tmp_path / "results/pil.beton")
    assert fast.num_samples == reference.num_samples == len(samples)
    assert fast.metadata["label"].tolist() == reference.metadata["label"].tolist() == list(range(len(samples)))
    for row in range(len(samples)):
        assert np.array_equal(fast.variable_payload("image", row), reference.variable_payload("image", row)), row


# -- config checks ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# The workflow: one project built once by real snakemake
# ---------------------------------------------------------------------------------------------

PIPELINE_MODULE = '''
"""Written by tests/workflow/test_webdataset.py: the pipelines of its webdataset datasets."""


def digits(dataset):
    return dataset.decode().to_tuple("npy", "cls").map_tuple(None, lambda c: c + 100)


def drop_coffee(dataset):
    dataset = dataset.select(lambda s: not s["__key__"].startswith("coffee"))
    return dataset.decode("rgb8").to_tuple("jpg;png", "cls", "json")
'''


def project_datasets() -> dict:
    return {
        "photos": photo_dataset("photos/p-*.tar"),
        "digits": {  # through the user's pipeline (module:function), not keys/decode
            "source": {"kind": "webdataset", "shards": "digits/d-{000000..000002}.tar", "pipeline": "wdspipe:digits"},
            "fields": {"image": {"type": "ndarray", "dtype": "uint8", "shape": [8, 8]}, "label": {"type": "int"}},
            "smoke": {"samples": 4},
        },
    }


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("wds_project")
    photos = photo_samples()
    for i in range(3):
        write_shard(workdir / f"photos/p-{i:04d}.tar", photos[i * 7 : (i + 1) * 7])
    (workdir / "digits").mkdir()
    with wds.ShardWriter(str(workdir / "digits/d-%06d.tar"), maxcount=25, verbose=0) as sink:
        for sample in digit_samples(60):
            sink.write(sample)
    (workdir / "wdspipe.py").write_text(PIPELINE_MODULE)
    write_config(workdir, project_datasets())
    started = time.monotonic()
    result = run_snakemake(workdir, "all")
    return {"workdir": workdir, "result": result, "seconds": time.monotonic() - started}


def _beton(workdir: Path, name: str):
    from betonbuild.beton.format import BetonFile

    return BetonFile(workdir / "results" / name / f"{name}.beton")


def test_photo_shards_beton_equals_the_samples_in_shard_order(project):
    from betonbuild.beton.payloads import decode_image, decode_json

    beton = _beton(project["workdir"], "photos")
    expected = photo_samples()
    assert beton.num_samples == len(expected) == 20
    assert beton.metadata["label"].tolist() == [s["cls"] for s in expected]
    for row, sample in enumerate(expected):
        assert decode_json(beton.variable_payload("meta", row)) == sample["json"]
        image, source = decode_image(beton, "image", row), decoded_image(sample)
        assert image.shape == source.shape == (64, 64, 3)
        error = np.abs(image.astype(np.int16) - source.astype(np.int16)).mean()
        assert error < JPEG_TOLERANCE, f"row {row} ({sample['__key__']}): mean abs error {error:.2f}"


def test_pipeline_dataset_holds_what_the_pipeline_yields_exactly(project):
    """The digits' pipeline decodes .npy and adds 100 to the class; read back with ffcv's own Reader too."""
    from ffcv.reader import Reader

    beton = _beton(project["workdir"], "digits")
    expected = digit_samples(60)
    assert np.array_equal(beton.ndarray_column("image"), np.stack([s["npy"] for s in expected]))
    assert beton.metadata["label"].tolist() == [s["cls"] + 100 for s in expected]
    reader = Reader(str(project["workdir"] / "results/digits/digits.beton"))
    assert reader.num_samples == 60 and reader.field_names == ["image", "label"]
    assert reader.metadata["f1"].tolist() == [s["cls"] + 100 for s in expected]


@pytest.mark.parametrize("name, samples", [("photos", 20), ("digits", 60)])
def test_reports_are_ok(project, name, samples):
    results = project["workdir"] / "results" / name
    for report_name in ("smoke.verify.json", f"{name}.verify.json"):
        report = json.loads((results / report_name).read_text())
        assert report["ok"], report.get("worst") or report
    assert report["num_samples"] == {"expected": samples, "found": samples}


def test_shard_list_is_derived_per_shard(project):
    listing = json.loads((project["workdir"] / "results/digits/shards.json").read_text())
    assert [(e["path"], e["samples"], e["keys"]) for e in listing["shards"]] == [
        ("digits/d-000000.tar", 25, ["cls", "npy"]),
        ("digits/d-000001.tar", 25, ["cls", "npy"]),
        ("digits/d-000002.tar", 10, ["cls", "npy"]),
    ]
    assert all(len(e["sha256"]) == 64 and e["size"] > 0 and e["mtime_ns"] > 0 for e in listing["shards"])
    # each shard's largest samples by payload bytes (for the pre-flight), here all the same size
    assert [len(e["largest"]) for e in listing["shards"]] == [8, 8, 8]
    source = json.loads((project["workdir"] / "results/digits/source.json").read_text())
    assert source["length"] == 60


def test_progress_is_counted_in_samples(project):
    log = (project["workdir"] / "logs/write/photos.log").read_text()
    assert "photos (full): 20/20 samples" in log, log[-2000:]


def test_nothing_changed_runs_nothing(project):
    assert ran(run_snakemake(project["workdir"], "all")) == {}


def test_editing_the_pipeline_module_rebuilds_only_the_dataset_that_uses_it(project):
    workdir = project["workdir"]
    (workdir / "wdspipe.py").write_text(PIPELINE_MODULE + "\n# the pipeline's module changed\n")
    jobs = ran(run_snakemake(workdir, "all"))
    assert set(jobs) == {"digits"}, jobs
    assert {"source_manifest", "write", "verify"} <= jobs["digits"], jobs  # write: its smoke gate first


def test_adding_changing_and_removing_shards_rebuilds_only_that_dataset_and_recounts_only_them(project):
    """Runs last in this module: it edits the project's shards."""
    workdir = project["workdir"]
    cache_path = workdir / "results/photos/.shards-cache.json"
    cache = json.loads(cache_path.read_text())
    assert sorted(cache) == [f"photos/p-{i:04d}.tar" for i in range(3)]
    for entry in cache.values():
        entry["probe"] = "kept from the cache"  # survives into shards.json only if NOT recounted
    cache_path.write_text(json.dumps(cache))

    photos = photo_samples()
    write_shard(workdir / "photos/p-0003.tar", photos[:3])  # added
    write_shard(workdir / "photos/p-0002.tar", photos[14:19])  # changed: 6 -> 5 samples
    (workdir / "photos/p-0001.tar").unlink()  # removed
    result = run_snakemake(workdir, "all")
    jobs = ran(result)
    assert set(jobs) == {"photos"}, jobs
    assert {"shard_list", "source_manifest", "write", "verify"} <= jobs["photos"], jobs

    listing = json.loads((workdir / "results/photos/shards.json").read_text())
    assert [(e["path"], e["samples"], "probe" in e) for e in listing["shards"]] == [
        ("photos/p-0000.tar", 7, True),  # from the cache
        ("photos/p-0002.tar", 5, False),  # recounted
        ("photos/p-0003.tar", 3, False),  # counted
    ]
    expected = photos[0:7] + photos[14:19] + photos[:3]
    assert _beton(workdir, "photos").metadata["label"].tolist() == [s["cls"] for s in expected]
    report = json.loads((workdir / "results/photos/photos.verify.json").read_text())
    assert report["ok"] and report["num_samples"]["found"] == 15


# ---------------------------------------------------------------------------------------------
# Bad shards: `betonbuild write` per case, then one snakemake --keep-going over them all
# ---------------------------------------------------------------------------------------------


def _bad_cases(workdir: Path) -> dict[str, dict]:
    """name -> {dataset entry, what the message must contain, xfail reason}; writes the shards."""
    photos = photo_samples()
    good = write_shard(workdir / "good.tar", photos[:5])
    data = good.read_bytes()
    members = tar_offsets(good)
    cases: dict[str, dict] = {}

    def case(name, shard_bytes=None, samples=None, expect=(), shards=None, xfail=None):
        path = workdir / f"{name}.tar"
        if samples is not None:
            write_shard(path, samples)
        elif shard_bytes is not None:
            path.write_bytes(shard_bytes)
        cases[name] = {
            "entry": photo_dataset(shards or ["good.tar", f"{name}.tar"]),
            "expect": [f"{name}.tar", *expect],
            "xfail": xfail,
        }

    case(
        "corrupt",
        shard_bytes=np.random.default_rng(0).integers(0, 256, 30000, dtype=np.uint8).tobytes(),
        expect=["not a readable tar file"],
    )
    jpg_end = next(end for name, _, end in members if name == f"{photos[2]['__key__']}.jpg")
    case("truncated", shard_bytes=data[: jpg_end - 1000], expect=["truncated", "unexpected end of data"])
    case("empty", samples=[], expect=["holds no sample"])
    case("zero_bytes", shard_bytes=b"", expect=["not a readable tar file"])
    case("missing", expect=["does not exist"])
    missing_key = [dict(s) for s in photos[:4]]
    del missing_key[2]["cls"]
    case("missing_key", samples=missing_key, expect=[f"key {photos[2]['__key__']}", "field 'label'", "cls"])
    case("duplicate_key", samples=photos[:3] + [photos[1]], expect=[repr(photos[1]["__key__"]), "twice"])
    undecodable = [dict(s) for s in photos[:4]]
    undecodable[1]["jpg"] = b"\xff\xd8\xff\xe0 this is not really a JPEG" * 20
    case("undecodable", samples=undecodable, expect=[f"key {photos[1]['__key__']}", "field 'image'", "'jpg'"])
    # A tar cut exactly between two samples (or inside a header block) reads as a shorter, valid tar.
    third_sample = next(start for name, start, _ in members if name.startswith(photos[3]["__key__"]))
    case("truncated_at_sample", shard_bytes=data[:third_sample], expect=["truncated"])
    scrambled = bytearray(data)
    scrambled[third_sample : third_sample + 512] = (
        np.random.default_rng(1).integers(0, 256, 512, dtype=np.uint8).tobytes()
    )
    case("corrupt_middle", shard_bytes=bytes(scrambled), expect=["corrupt"])
    return cases


IN_PROCESS = {"corrupt", "truncated", "empty", "zero_bytes", "missing", "missing_key", "duplicate_key"}


def _run_case_in_process(workdir: Path, name: str) -> dict:
    """`betonbuild write` in this process, for a case that must fail in the shard list (before ffcv)."""
    import contextlib

    from betonbuild.cli import main

    target = workdir / "results" / name / f"{name}.beton"
    stderr = io.StringIO()
    started = time.monotonic()
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        with contextlib.redirect_stderr(stderr):
            rc = main(
                ["write", "--config", "config.yaml", "--dataset", name, "--output", str(target), "--workers", "2"]
            )
    except Exception:  # noqa: BLE001 - reported like a subprocess's traceback
        import traceback

        rc, stderr = 1, io.StringIO(stderr.getvalue() + traceback.format_exc())
    finally:
        os.chdir(cwd)
    return {"rc": rc, "stderr": stderr.getvalue(), "seconds": time.monotonic() - started}


def _run_case(workdir: Path, name: str) -> dict:
    target = workdir / "results" / name / f"{name}.beton"
    cmd = [BETONBUILD, "write", "--config", "config.yaml", "--dataset", name, "--output", str(target), "--workers", "2"]
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=CASE_LIMIT)
        rc, stderr = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, stderr = (
            None,
            (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else str(exc.stderr),
        )
    return {"rc": rc, "stderr": stderr, "seconds": time.monotonic() - started}


@pytest.fixture(scope="module")
def bad_shards(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("wds_bad")
    cases = _bad_cases(workdir)
    write_config(workdir, {name: c["entry"] for name, c in cases.items()})
    runs = {name: _run_case_in_process(workdir, name) for name in cases if name in IN_PROCESS}
    with ThreadPoolExecutor(2) as pool:
        others = [name for name in cases if name not in IN_PROCESS]
        runs.update(zip(others, pool.map(lambda n: _run_case(workdir, n), others)))
    failure = workdir / "results/undecodable/failure"
    saved = {"record": json.loads((failure / "failure.json").read_text()) if failure.is_dir() else None}
    if failure.is_dir():
        saved["repro"] = subprocess.run(
            [BETONBUILD, "repro", str(failure)], cwd=workdir, capture_output=True, text=True, timeout=CASE_LIMIT
        )
    for name in cases:  # what the `betonbuild write` runs left (failure records), before snakemake runs
        shutil.rmtree(workdir / "results" / name, ignore_errors=True)
    return workdir, cases, runs, saved


def _leftovers(directory: Path, name: str) -> list[str]:
    if not directory.is_dir():
        return []
    return sorted(p.name for p in directory.iterdir() if p.name.startswith((f"{name}.beton", f".{name}.beton")))


BAD_CASES = [
    "corrupt",
    "truncated",
    "empty",
    "zero_bytes",
    "missing",
    "missing_key",
    "duplicate_key",
    "undecodable",
    "truncated_at_sample",
    "corrupt_middle",
]


@pytest.mark.parametrize("name", BAD_CASES)
def test_bad_shard_fails_fast_naming_shard_and_key(bad_shards, name, request):
    workdir, cases, runs, _ = bad_shards
    case, run = cases[name], runs[name]
    if case["xfail"]:
        request.applymarker(pytest.mark.xfail(strict=True, reason=case["xfail"]))
    assert run["rc"] is not None, f"{name}: no exit within {CASE_LIMIT} s (a hang)"
    assert run["seconds"] < 30, f"{name} took {run['seconds']:.1f} s"
    stderr = run["stderr"]
    assert run["rc"] == 1, f"{name}: exit {run['rc']}\n{stderr[-3000:]}"
    assert "Traceback" not in stderr, stderr[-3000:]
    line = next((ln for ln in stderr.splitlines() if ln.startswith("betonbuild error:")), "")
    assert f"dataset '{name}'" in line, stderr[-3000:]
    for part in case["expect"]:
        assert part in line, f"{part!r} not in {line!r}"
    assert _leftovers(workdir / "results" / name, name) == []


def test_an_undecodable_payload_is_saved_as_a_failure_record(bad_shards):
    workdir, _, runs, saved = bad_shards
    record = saved["record"]
    assert record, "no results/undecodable/failure/failure.json"
    assert record["field"] == "image" and record["index"] == 6  # 5 samples of good.tar, then its 2nd
    assert "(shard undecodable.tar, key astronaut_1): cannot decode its 'jpg' member" in record["message"]
    assert "replay it with: betonbuild repro" in runs["undecodable"]["stderr"]


def test_betonbuild_repro_replays_an_undecodable_payload(bad_shards):
    _, _, _, saved = bad_shards
    repro = saved["repro"]
    assert repro.returncode == 1, repro.stderr[-3000:]
    assert f"reproduced: {saved['record']['message']}" in repro.stderr, repro.stderr[-3000:]


def test_snakemake_keep_going_reports_every_bad_shard_and_writes_nothing(bad_shards):
    """The cases above through the workflow (a missing shard is Snakemake's missing input: next test)."""
    workdir, all_cases, _, _ = bad_shards
    cases = {name: c for name, c in all_cases.items() if not c["xfail"] and name != "missing"}
    write_config(workdir, {name: c["entry"] for name, c in cases.items()})
    started = time.monotonic()
    result = run_snakemake(workdir, "all", "--keep-going", check=False)
    seconds = time.monotonic() - started
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert seconds < 120, f"{seconds:.0f} s"
    for name, case in cases.items():
        line = next((ln for ln in output.splitlines() if ln.startswith(f"betonbuild error: dataset '{name}'")), "")
        assert line, f"{name}: no error line in the console output\n{output[-4000:]}"
        for part in case["expect"]:
            assert part in line, f"{part!r} not in {line!r}"
        assert _leftovers(workdir / "results" / name, name) == [], name
    assert (workdir / "results/undecodable/failure/failure.json").is_file()  # the smoke write caught it


def test_snakemake_names_a_missing_shard_before_any_job_runs(bad_shards):
    workdir, cases, _, _ = bad_shards
    write_config(workdir, {"missing": cases["missing"]["entry"]})
    result = run_snakemake(workdir, "-n", "all", check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "MissingInputException" in output and "missing.tar" in output, output[-3000:]


# ---------------------------------------------------------------------------------------------
# A shard changed between its shard list and the write; a pipeline that drops samples
# ---------------------------------------------------------------------------------------------

DRIVER = textwrap.dedent(
    '''
    """Runs the stages by hand: shard list + manifest, then the shard changes, then the write."""
    import json, os, shutil, sys, time
    from pathlib import Path

    sys.path.insert(0, os.getcwd())
    import webdataset as wds
    from betonbuild.errors import BetonbuildError
    from betonbuild.config.load import load_config
    from betonbuild.workflow.stages import build, make_shard_list, make_source_manifest

    scenarios = json.loads(Path("scenarios.json").read_text())
    samples = {}
    for name, scenario in scenarios.items():
        spec = load_config({"datasets": {name: scenario["entry"]}}).datasets[name]
        results = Path("results") / name
        make_shard_list(spec, str(results / "shards.json"))
        make_source_manifest(spec, str(results / "source.json"))
        for path, shard_samples in scenario["rewrite"].items():
            with wds.TarWriter(path) as sink:
                for sample in shard_samples:
                    sink.write({k: (bytes.fromhex(v) if k in ("jpg", "png") else v) for k, v in sample.items()})
        target = results / f"{name}.beton"
        started = time.monotonic()
        try:
            build(spec, str(results / "source.json"), str(target), str(results / "write.json"), threads=2)
            outcome = {"error": None}
        except BetonbuildError as exc:
            outcome = {"error": str(exc), "type": type(exc).__name__}
        outcome.update(seconds=time.monotonic() - started, target_exists=target.exists(),
                       leftovers=sorted(p.name for p in results.iterdir() if ".beton" in p.name))
        print(json.dumps({name: outcome}), flush=True)
    '''
)


def _json_sample(sample: dict) -> dict:
    return {k: (v.hex() if isinstance(v, bytes) else v) for k, v in sample.items()}


@pytest.fixture(scope="module")
def changed_underneath(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("wds_changed")
    photos = photo_samples()
    scenarios = {}
    for name, rewrite in {
        "one_fewer": photos[7:13],  # p-1 listed with 7 samples, has 6 at write time
        "one_more": photos[7:14] + photos[:1],  # 8 at write time
    }.items():
        for i in range(3):
            write_shard(workdir / name / f"p-{i}.tar", photos[i * 7 : (i + 1) * 7])
        entry = photo_dataset(f"{name}/p-{{0..2}}.tar")
        scenarios[name] = {"entry": entry, "rewrite": {f"{name}/p-1.tar": [_json_sample(s) for s in rewrite]}}
    for i in range(3):
        write_shard(workdir / "dropping" / f"p-{i}.tar", photos[i * 7 : (i + 1) * 7])
    scenarios["dropping"] = {
        "entry": {
            "source": {"kind": "webdataset", "shards": "dropping/p-{0..2}.tar", "pipeline": "wdspipe:drop_coffee"},
            "fields": PHOTO_FIELDS,
        },
        "rewrite": {},
    }
    (workdir / "wdspipe.py").write_text(PIPELINE_MODULE)
    (workdir / "scenarios.json").write_text(json.dumps(scenarios))
    (workdir / "driver.py").write_text(DRIVER)
    proc = subprocess.run([PYTHON, "driver.py"], cwd=workdir, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-4000:]
    outcomes = {}
    for line in proc.stdout.splitlines():
        outcomes.update(json.loads(line))
    return workdir, outcomes


def _assert_count_mismatch(outcome: dict, shard: str, expected: int, found: int, index: int) -> None:
    message = outcome["error"]
    assert message, "the write succeeded"
    assert outcome["type"] == "SampleError" and outcome["seconds"] < 30, outcome
    assert f"shard {shard} yields {found} samples, but the shard list counted {expected}" in message, message
    assert message.startswith(f"dataset '{shard.split('/')[0]}', sample index {index} (shard {shard})"), message
    assert not outcome["target_exists"] and outcome["leftovers"] == [], outcome


def test_a_shard_with_one_sample_fewer_than_listed_fails_naming_it_and_both_counts(changed_underneath):
    _, outcomes = changed_underneath
    # p-1 holds samples 7..13; its 7th (index 13) is missing at write time
    _assert_count_mismatch(outcomes["one_fewer"], "one_fewer/p-1.tar", expected=7, found=6, index=13)


def test_a_shard_with_one_sample_more_than_listed_fails_naming_it_and_both_counts_never_overrunning(changed_underneath):
    _, outcomes = changed_underneath
    # detected after p-1's last listed sample (index 13), before anything is written from it into p-2's rows
    _assert_count_mismatch(outcomes["one_more"], "one_more/p-1.tar", expected=7, found=8, index=13)


def test_a_pipeline_that_drops_samples_fails_naming_the_shard_and_counts(changed_underneath):
    """Counts come from tar headers: a pipeline must yield one sample per sample key."""
    _, outcomes = changed_underneath
    # p-0 holds astronaut_0..china_1 and coffee_0, which the pipeline drops (p-1, which starts with coffee_1,
    # fails too, at a larger index: the smallest is reported)
    _assert_count_mismatch(outcomes["dropping"], "dropping/p-0.tar", expected=7, found=6, index=6)


# ---------------------------------------------------------------------------------------------
# webdataset not installed
# ---------------------------------------------------------------------------------------------

HIDE_PACKAGES = '''
"""Written by tests/workflow/test_webdataset.py: makes {hidden} look not installed (find_spec -> None)."""
import sys
from importlib.machinery import PathFinder

HIDDEN = {hidden!r}


class HidingPathFinder(PathFinder):
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname.partition(".")[0] in HIDDEN:
            return None
        return super().find_spec(fullname, path, target)


sys.meta_path[:] = [HidingPathFinder if f is PathFinder else f for f in sys.meta_path]
'''

BROKEN_PACKAGE = 'raise ImportError("webdataset is broken here (written by tests/workflow/test_webdataset.py)")\n'


def _without_webdataset_project(workdir: Path, hidden: set[str] | None, broken: bool = False) -> dict:
    blocker = workdir / "blocker"
    blocker.mkdir()
    if hidden:
        (blocker / "sitecustomize.py").write_text(HIDE_PACKAGES.format(hidden=sorted(hidden)))
    if broken:
        (blocker / "webdataset.py").write_text(BROKEN_PACKAGE)
    write_shard(workdir / "shards/p-0000.tar", photo_samples()[:4])
    make_digits_npz(workdir / "digits.npz", n=40)
    write_config(
        workdir,
        {
            "digits": {
                "source": {"kind": "arrays", "path": "digits.npz", "columns": {"image": "images", "label": "target"}},
                "fields": {"image": {"type": "ndarray", "dtype": "uint8", "shape": [8, 8]}, "label": {"type": "int"}},
                "smoke": {"samples": 4},
            },
            "shards": photo_dataset("shards/p-{0000..0000}.tar"),
        },
    )
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(blocker), os.environ.get("PYTHONPATH")]))}


def _snakemake_env(workdir: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    from conftest import SNAKEFILE

    cmd = [
        str(BIN / "snakemake"),
        "-s",
        str(SNAKEFILE),
        "-d",
        str(workdir),
        "--configfile",
        str(workdir / "config.yaml"),
        "--cores",
        "2",
        *args,
    ]
    env = {**env, "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=workdir)


WARNING = "dataset 'shards' reads WebDataset shards but the optional package `webdataset` is not installed"


def test_without_webdataset_the_dag_warns_and_other_datasets_still_build(tmp_path):
    """webdataset hidden (braceexpand, which betonbuild also imports, still importable)."""
    env = _without_webdataset_project(tmp_path, {"webdataset"})
    result = _snakemake_env(tmp_path, env, "all", "--keep-going")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    before_dag = output.split("Building DAG of jobs")[0]
    assert WARNING in before_dag, output[-4000:]
    assert (
        "betonbuild error: dataset 'shards': this dataset reads WebDataset shards, but the optional package "
        "`webdataset` is not installed"
    ) in output, output[-4000:]
    assert json.loads((tmp_path / "results/digits/digits.verify.json").read_text())["ok"]
    assert not (tmp_path / "results/shards/shards.beton").exists()


def test_without_webdataset_and_braceexpand_other_datasets_still_build(tmp_path):
    """What `pip install betonbuild` without the [webdataset] extra gives: neither package."""
    env = _without_webdataset_project(tmp_path, {"webdataset", "braceexpand"})
    result = _snakemake_env(tmp_path, env, "-n", "all")
    output = result.stdout + result.stderr
    assert "InputFunctionException" not in output and "ModuleNotFoundError" not in output, output[-3000:]
    assert result.returncode == 0, output[-3000:]


def test_a_webdataset_that_fails_to_import_fails_its_dataset_alone(tmp_path):
    """Installed but broken. The workflow does not import webdataset to look (it imports torch: 1.3 s
    at every start), so the dataset's first job that decodes a sample says what is wrong."""
    env = _without_webdataset_project(tmp_path, None, broken=True)
    result = _snakemake_env(tmp_path, env, "all", "--keep-going")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert (
        "betonbuild error: dataset 'shards': this dataset reads WebDataset shards, but the optional package "
        "`webdataset` is installed and fails to import (webdataset is broken here"
    ) in output, output[-4000:]
    assert json.loads((tmp_path / "results/digits/digits.verify.json").read_text())["ok"]
    assert not (tmp_path / "results/shards/shards.beton").exists()


def test_the_workflow_does_not_import_torch_to_build_its_dag(tmp_path):
    """webdataset imports torch (1.3 s): checking that it is installed must not import it."""
    _without_webdataset_project(tmp_path, None)
    cmd = [
        PYTHON,
        "-X",
        "importtime",
        "-m",
        "snakemake",
        "-s",
        str(SNAKEFILE),
        "-d",
        str(tmp_path),
        "--configfile",
        str(tmp_path / "config.yaml"),
        "--cores",
        "2",
        "-n",
        "all",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert "snakemake.workflow" in imported
    assert not imported & {"torch", "webdataset", "ffcv"}
