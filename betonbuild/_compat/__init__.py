"""Every place where betonbuild relies on a pinned dependency's internals, in one subpackage.

Each module here patches or reaches into one dependency, and declares ``CHECKED``: the
distribution and the exact version its code was read against, and why the patch exists (the
measured gain); ``Checked(PYTHON, "3.11", ...)`` is the interpreter's major.minor version, for a
CPython private. ``check_versions()`` compares them with what is installed;
``tests/unit/compat/test_versions.py`` fails with the module, the checked and the installed version
when a pin moves, so the patch is re-read before it can silently misbehave.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from dataclasses import dataclass

PYTHON = "python"  # a Checked distribution that is the interpreter itself


@dataclass(frozen=True)
class Checked:
    """What a compat module relies on: ``distribution==version``, and why it is worth it."""

    distribution: str
    version: str
    why: str


def compat_modules() -> list[str]:
    """The dotted names of every module of this subpackage."""
    return [f"{__name__}.{m.name}" for m in pkgutil.iter_modules(__path__)]


def check_versions() -> list[str]:
    """One line per compat module whose dependency is installed at another version than checked."""
    problems = []
    for name in compat_modules():
        module = importlib.import_module(name)
        for checked in module.CHECKED:
            installed = installed_version(checked.distribution)
            if installed != checked.version:
                problems.append(
                    f"{name} was checked against {checked.distribution}=={checked.version}, but "
                    f"{installed or 'none'} is installed: re-read the patched code ({checked.why}), "
                    f"then update CHECKED"
                )
    return problems


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (None if absent); for PYTHON, the interpreter's major.minor."""
    import importlib.metadata  # why: ~80 ms; every process imports this package, few ask for versions

    if distribution == PYTHON:
        return f"{sys.version_info.major}.{sys.version_info.minor}"
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
