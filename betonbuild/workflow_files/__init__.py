"""Where the workflow's files are: the Snakefile, rules, scripts, report captions, envs and profiles.

They are package data (``importlib.resources``), so an installed betonbuild carries its workflow and
nothing depends on a clone of the repository.
"""

from __future__ import annotations

from pathlib import Path


def workflow_dir() -> Path:
    """The directory holding the packaged Snakefile (a real directory: Snakemake reads files by path)."""
    # Until the workflow files move into this package: the checkout's root (switched at the move).
    return Path(__file__).resolve().parents[2]


def snakefile() -> Path:
    """The packaged Snakefile: for `snakemake -s`, or `module ...: snakefile:` in your own workflow."""
    return workflow_dir() / "Snakefile"


def profiles_dir() -> Path:
    return workflow_dir() / "profiles"


def profile(name: str) -> Path | None:
    """The packaged profile called ``name`` (``default``, ``slurm``, ``cluster-generic``), or None."""
    path = profiles_dir() / name
    return path if (path / "config.yaml").is_file() else None


def profile_names() -> list[str]:
    return sorted(p.name for p in profiles_dir().iterdir() if (p / "config.yaml").is_file())
