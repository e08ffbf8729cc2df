"""Shared fixtures: small real data, and a runner for real `snakemake` in a temp directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SNAKEFILE = REPO / "Snakefile"
BIN = Path(sys.executable).parent


def run_snakemake(workdir: Path, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    """Runs the real workflow on ``workdir`` (its config.yaml), the way a user keeps data outside the repo."""
    cmd = [
        str(BIN / "snakemake"), "-s", str(SNAKEFILE), "-d", str(workdir),
        "--configfile", str(workdir / "config.yaml"), "--cores", "2", *args,
    ]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=workdir)
    if check and result.returncode != 0:
        raise AssertionError(f"snakemake failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-8000:]}")
    return result


def write_config(workdir: Path, datasets: dict) -> Path:
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump({"datasets": datasets}, sort_keys=False))
    return path


@pytest.fixture
def digits_npz(tmp_path: Path) -> Path:
    """The first 300 real sklearn digits, as the demo stores them."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    path = tmp_path / "digits.npz"
    np.savez(path, images=digits.images[:300].astype(np.uint8), target=digits.target[:300].astype(np.int64))
    return path


@pytest.fixture
def photo_folder(tmp_path: Path) -> Path:
    """A small image folder of real photo crops (2 classes x 3 PNGs, 64x64)."""
    from PIL import Image

    from betonbuild.demo import colour_photos, crops

    root = tmp_path / "photos"
    photos = colour_photos()
    for name in ("astronaut", "coffee"):
        (root / name).mkdir(parents=True)
        for k, crop in enumerate(crops(photos[name], size=64, count=3)):
            Image.fromarray(crop).save(root / name / f"{k}.png")
    return root
