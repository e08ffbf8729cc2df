"""Copies byte ranges between files for the merge: ``os.copy_file_range``, else a buffered loop.

``copy_file_range`` reflinks on XFS/btrfs/bcachefs/ZFS, copies on the server on NFS 4.2/SMB/Ceph
and does an in-kernel splice copy elsewhere; where the kernel or filesystem refuses it (EXDEV,
ENOSYS, EINVAL, EOPNOTSUPP...) the rest is copied with pread/pwrite through one small buffer.
"""

from __future__ import annotations

import errno
import os

from betonbuild.errors import MergeError

METHODS = ("auto", "copy_file_range", "buffered")
COPY_CHUNK = 1 << 30  # bytes per copy_file_range call (the kernel copies at most ~2 GiB per call)
BUFFER_SIZE = 128 << 10  # GNU cp's buffer size; small enough to stay in the CPU's L2 cache
# copy_file_range refusals that mean "not here", not "broken": fall back to a buffered copy.
FALLBACK_ERRNOS = {
    getattr(errno, name)
    for name in ("EXDEV", "ENOSYS", "EINVAL", "EOPNOTSUPP", "ENOTSUP", "EBADF", "ETXTBSY", "EPERM")
    if hasattr(errno, name)
}


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """Writes all of ``data`` at ``offset`` (``os.pwrite`` may write less than it is given)."""
    view = memoryview(data)
    while view.nbytes:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def filesystem_type(path: str | os.PathLike) -> str | None:
    """The type of the filesystem holding ``path`` ("ext4", "xfs", "nfs4"...), from /proc/self/mountinfo."""
    try:
        dev = os.stat(path).st_dev
        device = f"{os.major(dev)}:{os.minor(dev)}"
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) > 2 and fields[2] == device and "-" in fields:
                    return fields[fields.index("-") + 1]
    except (OSError, ValueError, IndexError):
        pass
    return None


class Copier:
    """Copies ranges with copy_file_range, then a buffered pread/pwrite loop once it is refused.

    ``method``: "auto" (copy_file_range, buffered from where the kernel refuses it),
    "copy_file_range" (no fallback) or "buffered". One copier serves every range of one output, so
    a refusal is met once and the record says which method copied the bytes and why.
    """

    def __init__(self, method: str, target_dir: str | os.PathLike):
        self.method = method
        self.filesystem = filesystem_type(target_dir)
        self.fallback_reason = None
        if method == "buffered":
            self.use_cfr = False
        elif not hasattr(os, "copy_file_range"):
            if method == "copy_file_range":
                raise MergeError("method='copy_file_range' but os.copy_file_range is unavailable on this platform")
            self.use_cfr, self.fallback_reason = False, "os.copy_file_range is unavailable"
        else:
            self.use_cfr = True
        self.cfr_bytes = 0
        self.buffered_bytes = 0
        self._buffer: bytearray | None = None

    @property
    def bytes_copied(self) -> int:
        return self.cfr_bytes + self.buffered_bytes

    @property
    def method_used(self) -> str:
        if self.cfr_bytes and self.buffered_bytes:
            return "copy_file_range+buffered"
        if self.cfr_bytes or (self.use_cfr and not self.buffered_bytes):
            return "copy_file_range"
        return "buffered"

    def copy(self, label: str, path: str, src_offset: int, remaining: int, dst: int, dst_offset: int) -> None:
        """Copies ``remaining`` bytes of the file ``path`` from ``src_offset`` to fd ``dst`` at ``dst_offset``.

        ``label`` names the source in errors (e.g. "part 2 (parts/2.beton)").
        """
        src = os.open(path, os.O_RDONLY)
        try:
            while remaining and self.use_cfr:
                try:
                    n = os.copy_file_range(src, dst, min(remaining, COPY_CHUNK), src_offset, dst_offset)
                except OSError as exc:
                    if self.method == "copy_file_range" or exc.errno not in FALLBACK_ERRNOS:
                        raise
                    self.use_cfr = False
                    self.fallback_reason = f"copy_file_range: {errno.errorcode.get(exc.errno, exc.errno)}"
                    break
                if n == 0:  # end of the source, or a filesystem that copies nothing: the loop below decides
                    if self.method == "copy_file_range":
                        raise MergeError(
                            f"{label}: copy_file_range stopped at byte {src_offset}, "
                            f"{remaining} bytes before the end of its data region"
                        )
                    self.use_cfr = False
                    self.fallback_reason = "copy_file_range copied 0 bytes"
                    break
                self.cfr_bytes += n
                src_offset, dst_offset, remaining = src_offset + n, dst_offset + n, remaining - n
            if remaining:
                self._buffered(label, src, src_offset, dst, dst_offset, remaining)
        finally:
            os.close(src)

    def _buffered(self, label: str, src: int, src_offset: int, dst: int, dst_offset: int, remaining: int) -> None:
        if self._buffer is None:
            self._buffer = bytearray(BUFFER_SIZE)
        view = memoryview(self._buffer)
        # No posix_fadvise(SEQUENTIAL): with it this loop was measured 2-3x slower on page-cache data.
        while remaining:
            n = os.preadv(src, [view[: min(remaining, BUFFER_SIZE)]], src_offset)
            if not n:
                raise MergeError(
                    f"{label}: the file ended at byte {src_offset}, {remaining} bytes "
                    "before the end of its data region (was it changed during the merge?)"
                )
            pwrite_all(dst, view[:n], dst_offset)
            self.buffered_bytes += n
            src_offset, dst_offset, remaining = src_offset + n, dst_offset + n, remaining - n
