"""The user's Python code a source or field names (``module:attribute``): importing it, and
finding its files (editing them must rebuild the dataset)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

from betonbuild.errors import SourceError

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # betonbuild/


def factory_properties(returns: str) -> dict:
    """The ``factory`` and ``args`` entries of the config schema of a source that calls the user's
    ``module:function(**args)``; ``returns`` says what the function must return."""
    return {
        "factory": {
            "type": "string",
            "pattern": "^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$",
            "description": f"module:function returning {returns}, imported with the working directory on sys.path.",
        },
        "args": {"type": "object", "default": {}},
    }


def import_factory(dataset: str, factory: str):
    module_name, attr = factory.split(":")
    ensure_workdir_importable()
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise SourceError(
            dataset, f"cannot import module {module_name!r} of factory {factory}: {type(exc).__name__}: {exc}"
        ) from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise SourceError(dataset, f"module {module_name!r} has no attribute {attr!r}") from None


def reference_files(references: list[str | None]) -> list[str]:
    """The files of the modules of these ``module:attribute`` references, each once, in order.

    Found without importing the modules themselves (parent packages are imported by find_spec).
    Installed packages and betonbuild's own modules are not the user's adapter code."""
    files = []
    for reference in filter(None, references):
        path = _module_file(reference.split(":")[0])
        if path and path not in files:
            files.append(path)
    return files


def _module_file(module_name: str) -> str | None:
    ensure_workdir_importable()
    try:
        found = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        found = None
    if found is None or not found.origin or not os.path.isfile(found.origin):
        return None
    origin = os.path.realpath(found.origin)
    if "site-packages" in origin.split(os.sep) or os.path.dirname(origin) == _PACKAGE_DIR:
        return None
    cwd = os.path.realpath(os.getcwd())
    return os.path.relpath(origin, cwd) if origin.startswith(cwd + os.sep) else origin


def ensure_workdir_importable() -> None:
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
