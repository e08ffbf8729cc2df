"""Fingerprint of the installed ffcv build.

The PyPI distribution is 1.0.2 while ``ffcv.__version__`` says 0.0.3rc1: a label alone does not
identify a build, so the sha256 of the compiled ``_libffcv`` extension and numpy's version are
part of the fingerprint. Computed without importing ffcv (which costs seconds and needs torch).
"""

from __future__ import annotations

import glob
import hashlib
import importlib.metadata
import importlib.util
import os
import platform
import re
import sys
from functools import lru_cache


@lru_cache(maxsize=1)
def ffcv_build() -> dict:
    spec = importlib.util.find_spec("ffcv")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("ffcv is not installed in this Python environment")
    package_dir = list(spec.submodule_search_locations)[0]
    libs = sorted(glob.glob(os.path.join(os.path.dirname(package_dir), "ffcv", "_libffcv*.so")))
    libs += sorted(glob.glob(os.path.join(os.path.dirname(package_dir), "_libffcv*.so")))
    if not libs:
        raise RuntimeError(f"ffcv at {package_dir} has no compiled _libffcv extension")
    with open(os.path.join(package_dir, "__init__.py")) as fh:
        match = re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", fh.read())
    return {
        "ffcv_distribution": importlib.metadata.version("ffcv"),
        "ffcv_module_version": match.group(1) if match else None,
        "libffcv_sha256": _sha256_of_file(libs[0]),
        "libffcv_file": os.path.basename(libs[0]),
        "numpy": importlib.metadata.version("numpy"),
        "python": platform.python_version(),
        "python_executable": sys.executable,
    }


def installed_ffcv_build() -> dict | None:
    """The build fingerprint, or None where this Python has no ffcv (Snakemake's own env under --sdm conda)."""
    try:
        return {k: ffcv_build()[k] for k in BUILD_KEYS}
    except RuntimeError:
        return None


# What must be equal for two processes to be "the same ffcv build" (the executable path may differ).
BUILD_KEYS = ("ffcv_distribution", "ffcv_module_version", "libffcv_sha256", "numpy", "python")


def same_build(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in BUILD_KEYS)


def build_differences(writer: dict, reader: dict) -> list[str]:
    return [
        f"{k}: written by {writer.get(k)!r}, read by {reader.get(k)!r}"
        for k in BUILD_KEYS
        if writer.get(k) != reader.get(k)
    ]


def _sha256_of_file(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()
