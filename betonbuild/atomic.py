"""Outputs appear at their target path only when complete: write to a temp name, rename on success.

Durable too: the temp file is fsynced before the rename and its directory after it, so a power
loss or kernel crash leaves either the previous file or the complete new one at the target, never
a renamed but empty or short file (which Snakemake would take for complete). A job of a superseded
snakemake run does not rename at all (``betonbuild.fencing``).
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from betonbuild.errors import WriteError
from betonbuild.fencing import check_still_owner

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT})


def temp_path_for(target: str | os.PathLike) -> Path:
    target = Path(target)
    return target.with_name(f".{target.name}.tmp-{os.getpid()}")


def remove_stale_temp_files(target: Path) -> None:
    """Temp files of this target left by a process that no longer exists (killed with SIGKILL)."""
    for stale in target.parent.glob(f".{glob.escape(target.name)}.tmp-*"):
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def disk_full_error(exc: OSError, path: str | os.PathLike | None = None, dataset: str | None = None) -> WriteError:
    """The one message for a write that ran out of space (or hit a file-size or quota limit)."""
    where = f"dataset '{dataset}': " if dataset else ""
    what = f" {path}" if path is not None else ""
    return WriteError(
        f"{where}the disk is full (or a file-size limit was reached) while writing{what}: "
        f"{exc.strerror or exc}; free space or point `results` at a larger disk, then run again"
    )


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike) -> Iterator[Path]:
    """Yields a temp path beside ``target``; renames it onto ``target`` if the block succeeds.

    A full disk (ENOSPC, EFBIG, EDQUOT) inside the block is a WriteError naming ``target``; so is
    a job of a superseded run (``betonbuild.fencing``), whose temp file is removed unpublished."""
    target = Path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if exc.errno in DISK_FULL_ERRNOS:
            raise disk_full_error(exc, target) from exc
        raise
    remove_stale_temp_files(target)
    tmp = temp_path_for(target)
    try:
        yield tmp
        fsync_path(tmp)
        check_still_owner(target)
        os.replace(tmp, target)
        fsync_directory(target.parent)
    except OSError as exc:
        if exc.errno in DISK_FULL_ERRNOS:
            raise disk_full_error(exc, target) from exc
        raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def fsync_path(path: Path) -> None:
    """The file's data and size on disk before it is renamed into place."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_directory(directory: Path) -> None:
    """The rename itself on disk. A file system that cannot fsync a directory (EINVAL) is left as is."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def write_json(target: str | os.PathLike, data: Any) -> None:
    with atomic_path(target) as tmp:
        with open(tmp, "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=False, default=_json_default)
            fh.write("\n")


def _json_default(value: Any) -> Any:
    import numpy as np

    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
