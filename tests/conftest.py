"""Shared fixtures: small real data, and a runner for real `snakemake` in a temp directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from betonbuild.workflow_files import profile, snakefile

REPO = Path(__file__).resolve().parents[1]
# The packaged workflow, as `betonbuild run` and a pip-installed betonbuild run it (no demo config).
SNAKEFILE = snakefile()
BIN = Path(sys.executable).parent
PROFILES = {name: profile(name) for name in ("default", "slurm", "cluster-generic")}


class ListDataset:
    """The simplest indexed dataset: a list of samples (ffcv passes numpy integer indices)."""

    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        return self.samples[int(index)]


def run_snakemake(workdir: Path, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    """Runs the real workflow on ``workdir`` (its config.yaml), the way a user keeps data outside the repo."""
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
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=workdir)
    if check and result.returncode != 0:
        raise AssertionError(
            f"snakemake failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-8000:]}"
        )
    return result


def run_betonbuild(workdir: Path, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    """``betonbuild ARGS`` in ``workdir`` (the entry point a project uses; this tree's package)."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    cmd = [sys.executable, "-m", "betonbuild", *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=workdir)
    if check and result.returncode != 0:
        raise AssertionError(
            f"betonbuild failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-8000:]}"
        )
    return result


def write_config(workdir: Path, datasets: dict) -> Path:
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump({"datasets": datasets}, sort_keys=False))
    return path


def make_digits_npz(path: Path, n: int = 300) -> Path:
    """The first ``n`` real sklearn digits, stored as the demo stores them."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    np.savez(path, images=digits.images[:n].astype(np.uint8), target=digits.target[:n].astype(np.int64))
    return path


def make_photo_folder(root: Path, classes=("astronaut", "coffee"), per_class: int = 3, size: int = 64) -> Path:
    """A small image folder of real photo crops (PNG, one sub-folder per photo)."""
    from PIL import Image

    from betonbuild.demo import colour_photos, crops

    photos = colour_photos()
    for name in classes:
        (root / name).mkdir(parents=True)
        for k, crop in enumerate(crops(photos[name], size=size, count=per_class)):
            Image.fromarray(crop).save(root / name / f"{k}.png")
    return root


@pytest.fixture
def digits_npz(tmp_path: Path) -> Path:
    return make_digits_npz(tmp_path / "digits.npz")


@pytest.fixture
def photo_folder(tmp_path: Path) -> Path:
    return make_photo_folder(tmp_path / "photos")


WORKFLOW_TESTS = Path(__file__).parent / "workflow"


def pytest_collection_modifyitems(items):
    """Tests under tests/workflow/ run real snakemake (or the SLURM cluster): marked, so that
    ``make test-quick`` (``-m "not workflow"``) runs only the unit tests."""
    for item in items:
        if WORKFLOW_TESTS in Path(item.path).parents:
            item.add_marker(pytest.mark.workflow)
