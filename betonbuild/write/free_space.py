"""A write that cannot fit on the disk is refused at its start, not after hours of writing.

The full file's size is estimated from the smoke file (bytes per sample, times the samples to
write) and a merge's from its parts (exact). The estimate can be off, so the margin is generous
and the check can be skipped with BETONBUILD_SKIP_SPACE_CHECK=1; an actual full disk still gets
``atomic.disk_full_error``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from betonbuild.errors import WriteError

SKIP_VARIABLE = "BETONBUILD_SKIP_SPACE_CHECK"
MARGIN = 1.05  # the estimate may be a little high (the smoke file's header, its last page)


def estimated_from_smoke(smoke_beton: Path, smoke_samples: int, samples: int) -> int | None:
    """Bytes of a file of ``samples`` samples like the smoke file's; None without one."""
    try:
        size = os.path.getsize(smoke_beton)
    except OSError:
        return None
    return int(size / max(1, smoke_samples) * samples)


def check_free_space(dataset: str, target: str | os.PathLike, needed: int | None) -> None:
    """Refuses (WriteError) to start a write of about ``needed`` bytes onto a disk with less free."""
    if needed is None or os.environ.get(SKIP_VARIABLE) == "1":
        return
    directory = Path(target).parent
    directory.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(directory).free
    if needed > free * MARGIN:
        raise WriteError(
            f"dataset '{dataset}': {Path(target).name} will be about {_size(needed)}, the disk holding "
            f"{directory} has {_size(free)} free; free space or point `results` at a larger disk "
            f"(if the estimate is wrong, run with {SKIP_VARIABLE}=1)"
        )


def _size(nbytes: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if nbytes < 1024 or unit == "TiB":
            return f"{nbytes:,.0f} {unit}" if unit == "bytes" else f"{nbytes:,.1f} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")
