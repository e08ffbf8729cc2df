"""Where the workflow's files are: the Snakefile, rules, scripts, report captions, envs and profiles.

They are package data (``importlib.resources``), so an installed betonbuild carries its workflow and
nothing depends on a clone of the repository.
"""

from __future__ import annotations

from importlib.resources import as_file, files
from pathlib import Path


def workflow_dir() -> Path:
    """The directory holding the packaged Snakefile (a real directory: Snakemake reads files by path)."""
    # A wheel installs as plain files, so this is the package's own directory and nothing is extracted
    # (a zipped install is not supported: Snakemake reads the workflow's files by path).
    with as_file(files(__package__)) as path:
        return Path(path)


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
