"""The wheel as a user gets it: built, installed into a fresh venv from the lock, used outside the repository.

`betonbuild init` + `betonbuild run` on a project of one image folder and one arrays dataset, then the
same workflow as a module of a pipeline's own Snakefile. Nothing here can reach the clone: the venv
has no editable install and no PYTHONPATH, and the projects live in temp directories.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, make_digits_npz, make_photo_folder, run_betonbuild

# --no-compile: no .pyc of all of torch up front (half the install's CPU); imports compile what they use.
PIP = ("-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "--no-compile")
DIGITS = """\
  digits:
    source: {kind: arrays, path: digits.npz, columns: {image: images, label: target}}
    fields:
      image: {type: ndarray, dtype: uint8, shape: [8, 8]}
      label: {type: int}
"""


def run(cmd: list[str], cwd: Path, env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout[-4000:]}\n{result.stderr[-6000:]}"
    return result


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> dict:
    """A fresh venv holding requirements.lock (pip's caches: no build, no download) and the built wheel."""
    tmp = tmp_path_factory.mktemp("package")
    source = tmp / "source"  # a copy: the build writes build/ and *.egg-info beside its sources
    shutil.copytree(REPO / "betonbuild", source / "betonbuild", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp / "dist"), "."], source, env)
    (wheel,) = (tmp / "dist").glob("betonbuild-*.whl")
    bin_dir = tmp / "venv" / "bin"
    run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(tmp / "venv")], tmp, env)
    run([str(bin_dir / "python"), *PIP, "-r", str(REPO / "requirements.lock")], tmp, env)
    run([str(bin_dir / "python"), *PIP, str(wheel)], tmp, env)
    run([str(bin_dir / "python"), "-m", "pip", "check"], tmp, env)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    return {"env": env, "bin": bin_dir, "wheel": wheel}


def module_example() -> str:
    """The Snakefile that docs/snakemake-module.md shows: the documented example is the tested one."""
    text = (REPO / "docs" / "snakemake-module.md").read_text()
    (body,) = [b for b in re.findall(r"^```python\n(.*?)^```", text, flags=re.M | re.S) if "module betonbuild:" in b]
    return body


def assert_verified(project: Path, names: list[str]) -> None:
    for name in names:
        for report in ("smoke.verify.json", f"{name}.verify.json"):
            rep = json.loads((project / "results" / name / report).read_text())
            assert rep["ok"] is True, (name, report, rep["worst"])


def test_the_installed_package_carries_the_workflow_not_a_path_into_the_clone(venv, tmp_path):
    code = "from betonbuild.workflow_files import snakefile, profile; print(snakefile()); print(profile('slurm'))"
    out = run([str(venv["bin"] / "python"), "-c", code], tmp_path, venv["env"]).stdout.split()
    assert all("site-packages" in line and str(REPO) not in line for line in out), out
    assert Path(out[0]).is_file() and (Path(out[1]) / "config.yaml").is_file()


def test_init_and_run_build_an_image_folder_and_arrays_then_nothing_to_do(venv, tmp_path):
    project = tmp_path / "project"
    make_photo_folder(project / "photos", per_class=2, size=32)
    make_digits_npz(project / "digits.npz", n=100)
    betonbuild = str(venv["bin"] / "betonbuild")
    guessed = run([betonbuild, "init", str(project), "--from", str(project / "photos")], tmp_path, venv["env"])
    assert "an image folder of 2 classes (astronaut, coffee)" in guessed.stdout
    with open(project / "config.yaml", "a") as fh:
        fh.write(DIGITS)
    result = run([betonbuild, "run", "--cores", "2"], project, venv["env"])
    assert "site-packages/betonbuild/workflow_files/Snakefile" in result.stdout + result.stderr
    assert_verified(project, ["photos", "digits"])
    assert sorted(p.name for p in (project / "results").iterdir()) == ["digits", "photos"]  # no demo dataset
    again = run([betonbuild, "run", "--cores", "2", "-n"], project, venv["env"])
    assert "Nothing to be done" in again.stdout + again.stderr
    status = run([betonbuild, "status"], project, venv["env"]).stdout
    assert "photos  up to date" in status and "digits  up to date" in status
    run([betonbuild, "run", "--report", "report.html"], project, venv["env"])
    report = (project / "report.html").read_text()
    assert "photos" in report and "digits" in report


def test_the_workflow_as_a_module_of_your_own_snakefile(venv, tmp_path):
    make_digits_npz(tmp_path / "digits.npz", n=100)
    (tmp_path / "config.yaml").write_text("datasets:\n" + DIGITS)
    (tmp_path / "Snakefile").write_text(module_example())
    snakemake = str(venv["bin"] / "snakemake")
    run([snakemake, "--cores", "2"], tmp_path, venv["env"])
    assert_verified(tmp_path, ["digits"])
    assert (tmp_path / "digits.summary.txt").read_text().startswith("verified OK: 100 samples")
    again = run([snakemake, "--cores", "2", "-n"], tmp_path, venv["env"])
    assert "Nothing to be done" in again.stdout + again.stderr


def test_a_config_error_is_one_line_naming_the_key(tmp_path):
    (tmp_path / "config.yaml").write_text(
        "datasets:\n" + DIGITS.replace("label: {type: int}", "label: {type: integer}")
    )
    result = run_betonbuild(tmp_path, "run", "--cores", "1", check=False)
    assert result.returncode == 1
    assert result.stderr.startswith("betonbuild error: datasets.digits.fields.label.type: "), result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_an_ffcv_that_cannot_load_its_library_prints_the_apt_get_line(tmp_path):
    """A compiled _libffcv that does not load (as when libturbojpeg or OpenCV are missing)."""
    fake = tmp_path / "site" / "ffcv"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "_libffcv.cpython-311-x86_64-linux-gnu.so").write_bytes(b"not a shared object")
    make_digits_npz(tmp_path / "digits.npz", n=10)
    (tmp_path / "config.yaml").write_text("datasets:\n" + DIGITS)
    env_path = f"{tmp_path / 'site'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    result = subprocess.run(
        [sys.executable, "-m", "betonbuild", "run", "--cores", "1"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": env_path},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "apt-get install -y --no-install-recommends libopencv-dev libturbojpeg0-dev pkg-config" in result.stderr
    assert "_libffcv.cpython-311-x86_64-linux-gnu.so" in result.stderr  # which file failed, and why
    assert not (tmp_path / "results").exists()
