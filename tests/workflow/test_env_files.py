"""One pinned ffcv build: the conda env file, the pip lock and the rules must agree."""

from __future__ import annotations

import re
import subprocess

import yaml
from conftest import BIN, REPO

from betonbuild.workflow_files import workflow_dir

WORKFLOW = workflow_dir()


def lock_pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[normalise(name)] = version
    return pins


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def conda_env() -> dict:
    return yaml.safe_load((WORKFLOW / "envs/ffcv.yaml").read_text())


def test_every_lock_line_is_an_exact_pin():
    for line in (REPO / "requirements.lock").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            assert re.fullmatch(r"[A-Za-z0-9_.-]+==[A-Za-z0-9_.!+-]+", line), line


def test_conda_pip_entries_equal_the_lock():
    pins = lock_pins()
    pip_entries = next(d["pip"] for d in conda_env()["dependencies"] if isinstance(d, dict))
    assert pip_entries, "envs/ffcv.yaml has no pip entries"
    for entry in pip_entries:
        name, version = entry.split("==")
        assert pins.get(normalise(name)) == version, (
            f"envs/ffcv.yaml pins {entry}, the lock {pins.get(normalise(name))}"
        )


def test_conda_packages_named_in_the_lock_have_its_version():
    pins = lock_pins()
    for entry in conda_env()["dependencies"]:
        if isinstance(entry, str) and "=" in entry:
            name, version = entry.split("=", 1)
            if normalise(name) in pins:
                assert version == pins[normalise(name)], f"envs/ffcv.yaml has {entry}, the lock {pins[normalise(name)]}"


def test_ffcv_and_torch_are_pinned_as_promised():
    pins = lock_pins()
    assert pins["ffcv"] == "1.0.2"
    assert pins["torch"] == "2.13.0"


def test_the_installed_venv_matches_the_lock():
    from importlib.metadata import version

    pins = lock_pins()
    for name in ("ffcv", "numpy", "snakemake", "opencv-python", "numba", "torch"):
        assert version(name).split("+")[0] == pins[name]


def test_every_rule_names_the_ffcv_env_and_has_log_benchmark_and_threads():
    checked = []
    for smk in sorted((WORKFLOW / "rules").glob("*.smk")):
        for block in re.split(r"\n(?=(?:rule|checkpoint) )", smk.read_text()):
            if not block.startswith(("rule ", "checkpoint ")):
                continue
            name = block.split(":")[0]
            checked.append(name)
            assert 'conda:\n        "../envs/ffcv.yaml"' in block, f"{smk.name}: {name} has no conda env"
            assert "\n    log:" in block and "\n    benchmark:" in block, f"{smk.name}: {name} lacks log/benchmark"
            assert "\n    threads:" in block, f"{smk.name}: {name} declares no threads"
    assert "checkpoint source_manifest" in checked and "rule write_part" in checked, checked


def test_snakemake_lint_is_clean():
    result = subprocess.run([str(BIN / "snakemake"), "--lint"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert "Congratulations, your workflow is in a good condition!" in result.stdout + result.stderr, result.stdout


def test_snakefmt_formatting():
    result = subprocess.run(
        [str(BIN / "snakefmt"), "--check", "Snakefile", str(WORKFLOW)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
