"""Snakemake's lock files: where they are, so that a dead run's locks can be removed.

Snakemake 9 locks the working directory with ``.snakemake/locks/{n}.input.lock`` and
``{n}.output.lock`` (``snakemake/persistence/file.py``) and removes them when it ends; a run killed
with SIGKILL leaves them behind, and every later run is refused until ``--unlock``. The files do
not say who holds them: ``betonbuild.workflow.locks`` records the owner beside them.
"""

from __future__ import annotations

from pathlib import Path

from betonbuild._compat import Checked

CHECKED = (
    Checked(
        "snakemake",
        "9.27.1",
        why="a killed run's .snakemake/locks/*.lock removed: the next run simply completes instead of "
        "asking for --unlock",
    ),
)
LOCK_DIR = Path(".snakemake/locks")


def lock_files(lock_dir: Path = LOCK_DIR) -> list[Path]:
    """Snakemake's lock files in the working directory (none when no run holds it)."""
    return sorted(lock_dir.glob("*.lock"))
