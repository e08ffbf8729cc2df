"""The optional ``webdataset`` package: whether it is installed (asked without importing it), and
importing it with an error that says what to do."""

from __future__ import annotations

import importlib.util

from betonbuild.errors import SourceError


def require_webdataset(dataset: str):
    try:
        import webdataset
    except ImportError as exc:
        missing = isinstance(exc, ModuleNotFoundError) and exc.name == "webdataset"
        raise SourceError(
            dataset,
            "this dataset reads WebDataset shards, but the optional package `webdataset` is "
            + ("not installed" if missing else f"installed and fails to import ({exc})")
            + " (pip install webdataset, as pinned in requirements.lock)",
        ) from None
    return webdataset


def webdataset_installed() -> bool:
    """Asked without importing webdataset: it imports torch (1.2 s), in every job and workflow start."""
    return importlib.util.find_spec("webdataset") is not None


def require_webdataset_installed(dataset: str) -> None:
    """The same error as require_webdataset, without importing webdataset."""
    if not webdataset_installed():
        require_webdataset(dataset)
