"""Incremental rebuilds: what changed is rebuilt, nothing else. Each case runs real snakemake and
asserts which jobs ran (from Snakemake's own job listing)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import BIN, SNAKEFILE, make_digits_npz, make_photo_folder, run_snakemake, write_config
from PIL import Image

from betonbuild.workflow.status import plan

# `write` writes the smoke file, runs its gate (smoke.verify.json), then writes the full file: one job
ALL_STAGES = {"source_manifest", "write", "verify"}  # verify also makes the report's assets
FOLDER_STAGES = ALL_STAGES | {"file_list"}  # an image folder is read through its file list

ADAPTER = """
import numpy as np


class Squares:
    def __len__(self):
        return 40

    def __getitem__(self, i):
        return {"x": np.full(4, i * i, dtype=np.int64), "y": i}


def make():
    return Squares()
"""

TAGS_ADAPTER = """
def make():
    return [{"name": f"tag-{i}", "y": i} for i in range(12)]
"""

# A custom field class in a module of its own: editing it must rebuild the datasets that use it.
TAG_FIELD = """
from betonbuild.custom import FixedUTF8Field


class TagField(FixedUTF8Field):
    pass
"""

SLOW_ADAPTER = """
import time

import numpy as np


class Slow:
    def __init__(self, n, delay):
        self.n, self.delay = n, delay

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.delay)
        return (np.full(16, i % 251, dtype=np.uint8), int(i))


def make(n=2000, delay=0.004):
    return Slow(n, delay)
"""


def base_datasets() -> dict:
    return {
        "digits": {
            "source": {"kind": "arrays", "path": "digits.npz", "columns": {"image": "images", "label": "target"}},
            "fields": {"image": {"type": "ndarray", "dtype": "uint8", "shape": [8, 8]}, "label": {"type": "int"}},
            "smoke": {"samples": 4},
        },
        "photos": {
            "source": {"kind": "image_folder", "root": "photos"},
            "fields": {
                "image": {"type": "rgb_image", "write_mode": "raw", "max_resolution": 16},
                "label": {"type": "int"},
            },
            "smoke": {"samples": 2},
        },
        "squares": {
            "source": {"kind": "python", "factory": "squares:make"},
            "fields": {"x": {"type": "ndarray", "dtype": "int64", "shape": [4]}, "y": {"type": "int"}},
            "smoke": {"samples": 4},
        },
        "tags": {
            "source": {"kind": "python", "factory": "tags:make"},
            "fields": {
                "name": {"type": "custom", "class": "tagfield:TagField", "args": {"width": 8}},
                "y": {"type": "int"},
            },
            "smoke": {"samples": 4},
        },
    }


def ran(result: subprocess.CompletedProcess) -> dict[str, set[str]]:
    """dataset -> rules of the jobs this run executed."""
    return {ds: {rule for rule, _ in jobs} for ds, jobs in plan(result.stdout + result.stderr).items()}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("incremental")
    make_digits_npz(workdir / "digits.npz", n=120)
    make_photo_folder(workdir / "photos", per_class=2, size=32)
    (workdir / "squares.py").write_text(ADAPTER)
    (workdir / "tags.py").write_text(TAGS_ADAPTER)
    (workdir / "tagfield.py").write_text(TAG_FIELD)
    write_config(workdir, base_datasets())
    run_snakemake(workdir, "all")
    return workdir


def test_nothing_changed_runs_nothing(project):
    result = run_snakemake(project, "all")
    assert "Nothing to be done" in result.stdout + result.stderr
    assert ran(result) == {}


def test_changed_source_content_rebuilds_only_that_dataset(project):
    """Row 7 is not a smoke sample (those are rows 0-3 and 4 seeded-random others), row 0 is one:
    either way the write job reruns, its smoke gate first (one job); the other datasets stay."""
    from betonbuild.config.spec import smoke_positions

    assert 7 not in smoke_positions(120, 4, 0) and 0 in smoke_positions(120, 4, 0)
    for row in (7, 0):
        smoke_before = (project / "results/digits/smoke.verify.json").stat().st_mtime_ns
        data = dict(np.load(project / "digits.npz"))
        data["images"][row, 0, 0] += 1
        np.savez(project / "digits.npz", **data)
        assert ran(run_snakemake(project, "all")) == {"digits": ALL_STAGES}
        assert (project / "results/digits/smoke.verify.json").stat().st_mtime_ns != smoke_before


def test_an_added_and_a_removed_image_rebuild_only_the_image_dataset(project):
    extra = project / "photos" / "coffee" / "extra.png"
    extra.write_bytes((project / "photos" / "coffee" / "0.png").read_bytes())
    assert ran(run_snakemake(project, "all")) == {"photos": FOLDER_STAGES}
    assert json.loads((project / "results/photos/photos.verify.json").read_text())["num_samples"]["found"] == 5
    extra.unlink()
    assert ran(run_snakemake(project, "all")) == {"photos": FOLDER_STAGES}


def test_a_touched_image_is_listed_again_and_nothing_is_rewritten(project):
    """Its stat changed, its content did not: the file list and the manifest rerun (the list hashes
    that one file again), the manifest comes out the same, and no .beton is rewritten."""
    beton = project / "results/photos/photos.beton"
    before = beton.stat().st_mtime_ns
    os.utime(project / "photos" / "coffee" / "0.png")
    assert ran(run_snakemake(project, "all")) == {"photos": {"file_list", "source_manifest"}}
    assert "4 files listed, 1 hashed" in (project / "logs/file_list/photos.log").read_text()
    assert beton.stat().st_mtime_ns == before


def test_an_image_rewritten_in_place_rebuilds_its_dataset(project):
    target = project / "photos" / "astronaut" / "1.png"
    original = target.read_bytes()
    pixels = np.asarray(Image.open(target)).copy()
    pixels[0, 0] ^= 1
    Image.fromarray(pixels).save(target)
    try:
        assert ran(run_snakemake(project, "all")) == {"photos": FOLDER_STAGES}
    finally:
        target.write_bytes(original)
        run_snakemake(project, "all")


def test_identical_rewrite_of_a_small_source_rebuilds_nothing(project):
    path = project / "digits.npz"
    path.write_bytes(path.read_bytes())  # same bytes, new mtime: Snakemake's checksum says unchanged
    assert ran(run_snakemake(project, "all")) == {}


def test_identical_rewrite_of_a_large_source_only_refingerprints_it(tmp_path):
    """Above Snakemake's checksum limit (1 MB) the manifest is derived again; its content is the
    same, so the checkpoint lets every later stage stand."""
    np.save(tmp_path / "x.npy", np.random.default_rng(0).integers(0, 255, (1500, 32, 32), dtype=np.uint8))
    np.save(tmp_path / "y.npy", np.arange(1500))
    write_config(
        tmp_path,
        {
            "big": {
                "source": {"kind": "arrays", "columns": {"x": "x.npy", "y": "y.npy"}},
                "fields": {"x": {"type": "ndarray", "dtype": "uint8", "shape": [32, 32]}, "y": {"type": "int"}},
                "smoke": {"samples": 4},
            }
        },
    )
    run_snakemake(tmp_path, "all")
    os.utime(tmp_path / "x.npy")
    # nothing is rewritten, nor verified again (the timings table is of the build that made the file)
    assert ran(run_snakemake(tmp_path, "all")) == {"big": {"source_manifest"}}


def test_editing_one_datasets_fields_rebuilds_only_it(project):
    config = base_datasets()
    config["photos"]["fields"]["image"]["max_resolution"] = 12
    write_config(project, config)
    try:
        assert ran(run_snakemake(project, "all")) == {"photos": FOLDER_STAGES}
    finally:
        write_config(project, base_datasets())
        run_snakemake(project, "all")


def test_editing_the_adapter_rebuilds_only_the_datasets_that_use_it(project):
    adapter = project / "squares.py"
    adapter.write_text(ADAPTER.replace("i * i", "i * i + 1"))
    assert ran(run_snakemake(project, "all")) == {"squares": ALL_STAGES}
    x = json.loads((project / "results/squares/squares.verify.json").read_text())
    assert x["ok"] is True


def test_editing_a_custom_field_class_rebuilds_only_the_datasets_that_use_it(project):
    field = project / "tagfield.py"
    field.write_text(TAG_FIELD + "\n# the class's module changed\n")
    assert ran(run_snakemake(project, "all")) == {"tags": ALL_STAGES}
    assert json.loads((project / "results/tags/tags.verify.json").read_text())["ok"] is True


def test_adding_a_dataset_builds_only_it_and_removing_it_reruns_nothing(project):
    config = base_datasets()
    config["digits_again"] = {**config["digits"], "writer": {"indices": "0:50"}}
    write_config(project, config)
    assert ran(run_snakemake(project, "all")) == {"digits_again": ALL_STAGES}
    write_config(project, base_datasets())
    assert ran(run_snakemake(project, "all")) == {}


def test_a_file_from_another_ffcv_build_fails_verification_with_how_to_rebuild(project):
    for stage in ("smoke", "digits"):  # the smoke file and the full file, as if written by another build
        record_path = project / f"results/digits/{stage}.write.json"
        record = json.loads(record_path.read_text())
        record["provenance"]["libffcv_sha256"] = "0" * 64
        record_path.write_text(json.dumps(record))
    result = run_snakemake(project, "all", check=False)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "written by another ffcv build" in output
    assert "libffcv_sha256: written by '0000" in output
    advice = (
        "`snakemake --forcerun smoke write write_part --cores 32 all` (only dataset 'digits': its "
        "results/digits/smoke.verify.json and results/digits/digits.verify.json as the targets"
    )
    assert advice in output
    # the advice for this dataset alone, as given (cores 2 here)
    rerun = run_snakemake(
        project,
        "--forcerun",
        "smoke",
        "write",
        "write_part",
        "--cores",
        "2",
        "results/digits/smoke.verify.json",
        "results/digits/digits.verify.json",
    )
    assert ran(rerun) == {"digits": {"write", "verify"}}
    for stage in ("smoke", "digits"):
        assert json.loads((project / f"results/digits/{stage}.verify.json").read_text())["ok"] is True
    run_snakemake(project, "all")  # the report assets


def snakemake_cmd(workdir: Path) -> list[str]:
    return [
        str(BIN / "snakemake"),
        "-s",
        str(SNAKEFILE),
        "-d",
        str(workdir),
        "--configfile",
        str(workdir / "config.yaml"),
        "--cores",
        "2",
        "all",
    ]


def start_slow_run(workdir: Path) -> subprocess.Popen:
    (workdir / "slow.py").write_text(SLOW_ADAPTER)
    write_config(
        workdir,
        {
            "slow": {
                "source": {"kind": "python", "factory": "slow:make"},
                "fields": {"x": {"type": "ndarray", "dtype": "uint8", "shape": [16]}, "y": {"type": "int"}},
            }
        },
    )
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.Popen(
        snakemake_cmd(workdir),
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def wait_for(condition, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_a_run_killed_mid_write_is_completed_by_the_next_run(tmp_path):
    run = start_slow_run(tmp_path)
    results = tmp_path / "results/slow"
    wait_for(lambda: results.is_dir() and any(p.name.startswith(".slow.beton.tmp-") for p in results.iterdir()))
    os.killpg(run.pid, signal.SIGKILL)
    run.wait(timeout=30)
    assert not (results / "slow.beton").exists()  # the partial file never had the target's name
    result = run_snakemake(tmp_path, "all")
    assert "removed the lock left by snakemake process" in result.stdout + result.stderr
    assert json.loads((results / "slow.verify.json").read_text())["ok"] is True
    assert not [p for p in results.iterdir() if ".tmp-" in p.name]


def test_a_concurrent_second_run_is_refused_by_the_lock(tmp_path):
    first = start_slow_run(tmp_path)
    try:
        wait_for(lambda: (tmp_path / ".snakemake/betonbuild-lock-owner.json").exists())
        second = run_snakemake(tmp_path, "all", check=False)
        assert second.returncode != 0
        assert "Directory cannot be locked" in second.stdout + second.stderr
        output, _ = first.communicate(timeout=240)
        assert first.returncode == 0, output[-3000:]
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert json.loads((tmp_path / "results/slow/slow.verify.json").read_text())["ok"] is True


def test_status_names_up_to_date_and_stale_datasets(project):
    config = base_datasets()
    config["digits"]["writer"] = {"seed": 9}
    write_config(project, config)
    try:
        result = subprocess.run(
            [str(BIN / "betonbuild"), "status", "-d", str(project), "--configfile", str(project / "config.yaml")],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=project,
        )
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert any(line.startswith("photos") and "up to date" in line for line in lines)
        assert any(line.startswith("digits") and "would rebuild" in line for line in lines)
        assert "source_manifest: Params have changed since last execution" in result.stdout
    finally:
        write_config(project, base_datasets())
