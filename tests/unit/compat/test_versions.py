"""Every patch of a dependency's internals is in betonbuild._compat, declares the exact version it was
checked against and why it exists, and a version change fails here with a message that says which."""

from __future__ import annotations

import importlib
import importlib.metadata
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import betonbuild._compat as compat
from betonbuild._compat import PYTHON, Checked, check_versions, compat_modules, installed_version

PACKAGE = Path(compat.__file__).parent
# The modules known to exist now (others may be added: each is checked like these).
KNOWN = {"ffcv_import", "fast_exit", "snakemake_locks", "snakemake_timers"}


def test_the_installed_versions_are_the_checked_ones():
    problems = check_versions()
    assert problems == [], "\n".join(problems)


def test_every_module_of_the_subpackage_is_checked():
    files = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert {name.rsplit(".", 1)[1] for name in compat_modules()} == files
    assert KNOWN <= files


@pytest.mark.parametrize("name", compat_modules())
def test_every_compat_module_declares_what_it_was_checked_against(name):
    module = importlib.import_module(name)
    assert isinstance(module.CHECKED, tuple) and module.CHECKED, f"{name} declares no CHECKED"
    for checked in module.CHECKED:
        assert isinstance(checked, Checked)
        assert checked.distribution and checked.version and len(checked.why) > 20, checked
        assert checked.version.replace(".", "").isdigit(), f"{name}: {checked.version} is not an exact version"
    assert module.__doc__, f"{name} says nowhere why it exists"


def test_a_pin_that_moved_names_the_module_and_both_versions(monkeypatch):
    real = importlib.metadata.version

    def version(distribution):
        return "9.99.0" if distribution == "snakemake" else real(distribution)

    monkeypatch.setattr(importlib.metadata, "version", version)
    problems = check_versions()
    assert problems, "a changed snakemake version went unnoticed"
    assert {p.split(" ", 1)[0] for p in problems} >= {
        "betonbuild._compat.snakemake_locks",
        "betonbuild._compat.snakemake_timers",
    }
    assert all("snakemake==" in p for p in problems), problems
    timers = next(p for p in problems if p.startswith("betonbuild._compat.snakemake_timers"))
    assert timers.startswith(
        "betonbuild._compat.snakemake_timers was checked against snakemake==9.27.1, but 9.99.0 is installed: "
        "re-read the patched code (JobScheduler._schedule_reevalutation"
    ), timers
    assert timers.endswith("then update CHECKED")


def test_a_missing_distribution_is_reported_as_none(monkeypatch):
    real = importlib.metadata.version

    def version(distribution):
        if distribution == "numba":
            raise importlib.metadata.PackageNotFoundError(distribution)
        return real(distribution)

    monkeypatch.setattr(importlib.metadata, "version", version)
    problems = check_versions()
    assert problems and all("numba==" in p for p in problems), problems
    assert any(
        p.startswith("betonbuild._compat.ffcv_import was checked against numba==0.68.1, but none is installed")
        for p in problems
    ), problems


def test_the_interpreter_is_checked_by_its_major_and_minor_version(monkeypatch):
    assert installed_version(PYTHON) == f"{sys.version_info.major}.{sys.version_info.minor}"
    monkeypatch.setattr(sys, "version_info", SimpleNamespace(major=3, minor=12, micro=1))
    problems = check_versions()
    assert problems and all("python==" in p for p in problems), problems
    assert any(
        p.startswith("betonbuild._compat.fast_exit was checked against python==3.11, but 3.12 is installed")
        for p in problems
    ), problems


def test_importing_the_compat_modules_imports_no_ffcv_snakemake_or_torch():
    """check_versions imports every compat module: none may pull a heavy dependency in at import."""
    code = (
        "import sys; from betonbuild._compat import check_versions; check_versions(); "
        "print(sorted(m for m in ('ffcv', 'torch', 'snakemake', 'numba') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
