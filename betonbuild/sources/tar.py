"""A tar parser for shards: members named exactly as tarfile (so webdataset) names them, grouped
into samples the way webdataset groups them, from the 512-byte headers alone.

tarfile parses every member in Python, and webdataset.TarWriter writes a PAX header before each
member (for its float mtime): 0.58 s for the 16,000 members of bench/webdataset_write.py's shards,
0.15 s reading the 512-byte headers directly and seeking over the payloads.
The scan names members exactly as tarfile does (webdataset reads shards through tarfile), and
unlike tarfile it does not end quietly at a cut or a garbage header: a shard must close with
its two zero blocks, or a sample could be missing from the count and the write.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO

META_MEMBER = re.compile(r"__[^/]*__($|/)")  # webdataset's skip_meta


def split_key(name: str) -> tuple[str | None, str | None]:
    """webdataset's base_plus_ext: 'dir/000123.seg.png' -> ('dir/000123', 'seg.png'). A copy, so that
    counting shards does not import webdataset (and torch); tests/unit/sources/test_tar.py compares the two."""
    match = re.match(r"^((?:.*/|)[^.]+)[.]([^/]*)$", name)
    return (match.group(1), match.group(2)) if match else (None, None)


BLOCK = 512
ZERO_BLOCK = bytes(BLOCK)
REGULAR = (b"0", b"\0", b"7")  # tarfile's REGULAR_TYPES, but GNU sparse, which is refused
NO_PAYLOAD = (b"1", b"2", b"3", b"4", b"5", b"6")  # links, devices, directories, fifos: no data blocks
PAX = (b"x", b"X")  # extended header for the next member (X: Solaris)
FS_ENCODING = sys.getfilesystemencoding()  # tarfile's, with errors="surrogateescape"
PAX_RECORD = re.compile(rb"(\d+) ([^=]+)=")


class TarDamage(Exception):
    """The tar structure of a shard is broken at byte ``offset``, after (or inside) ``member``."""

    def __init__(self, offset: int, what: str, member: str | None, truncated: bool = False, inside: bool = False):
        super().__init__(what)
        self.offset, self.what, self.member, self.truncated, self.inside = offset, what, member, truncated, inside


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode(FS_ENCODING, "surrogateescape")


def _number(field: bytes) -> int:
    """A numeric header field: octal text, or GNU base-256 (leading 0x80 / 0xff), like tarfile's nti."""
    if field[0] in (0o200, 0o377):
        value = int.from_bytes(field[1:], "big")
        return value - 256 ** (len(field) - 1) if field[0] == 0o377 else value
    return int(field.split(b"\0", 1)[0].decode("ascii").strip() or "0", 8)


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def _header_size(header: bytes, offset: int, member: str | None) -> int:
    """The size field of a header whose checksum is right (tarfile accepts signed or unsigned sums)."""
    try:
        stored, size = _number(header[148:156]), _number(header[124:136])
    except (ValueError, UnicodeDecodeError):
        raise TarDamage(offset, "not a tar header (a number field is not a number)", member) from None
    unsigned = 256 + sum(header) - sum(header[148:156])
    if stored != unsigned and stored != unsigned - 256 * sum(b >> 7 for b in header[:148] + header[156:]):
        raise TarDamage(offset, "not a tar header (bad checksum)", member)
    if size < 0:
        raise TarDamage(offset, f"a tar header gives a negative size ({size})", member)
    return size


def _pax_records(data: bytes, offset: int, member: str | None) -> dict[str, bytes]:
    """'LEN KEY=VALUE\\n' records, parsed as tarfile does (LEN counts the whole record)."""
    records, pos = {}, 0
    while match := PAX_RECORD.match(data, pos):
        length = int(match.group(1))
        if length == 0:
            raise TarDamage(offset, "a PAX header has a record of length 0", member)
        key = match.group(2).decode("utf-8", "surrogateescape")
        records[key] = data[match.end(2) + 1 : match.start(1) + length - 1]
        pos += length
    if not records.get("size", b"0").isdigit():
        raise TarDamage(offset, f"a PAX header gives a size that is not a number: {records['size']!r}", member)
    if any(key.startswith("GNU.sparse.") for key in records):
        raise TarDamage(offset, "a member is a GNU sparse file, which betonbuild does not read", member)
    return records


def _pax_text(value: bytes, records: dict[str, bytes]) -> str:
    if records.get("hdrcharset") != b"BINARY":
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return value.decode(FS_ENCODING, "surrogateescape")


def _name_and_size(header: bytes, kind: bytes, size: int, global_pax: dict, pending: list) -> tuple[str, bytes, int]:
    """A member's name, type and data size once the headers before it apply, in tarfile's order:
    ustar prefix, global PAX, then the extended headers, the one read first winning."""
    name, prefix = _text(header[:100]), _text(header[345:500])
    if kind == b"\0" and name.endswith("/"):
        kind = b"5"  # the old V7 way to store a directory
    if prefix:
        name = f"{prefix}/{name}"
    if "path" in global_pax:
        name = _pax_text(global_pax["path"], global_pax).rstrip("/")
    for what, value in reversed(pending):
        if what == "L":
            name = value
        elif what == "x" and "path" in value:
            name = _pax_text(value["path"], value).rstrip("/")
        if what == "x" and "size" in value:
            size = int(value["size"])
    return (name.rstrip("/") if kind == b"5" else name), kind, size


def tar_members(fh: BinaryIO, file_size: int | None) -> Iterator[tuple[str, bool, int]]:
    """(name, is a regular file, payload bytes) of each member of a tar stream, in order, named as
    tarfile names them.

    Reads the 512-byte headers (and the records of the extended headers) and seeks over the payloads.
    Raises TarDamage where the archive is cut, or a header is not one, or no end-of-archive blocks
    follow the last member. ``file_size``: the stream's length if known (an uncompressed file)."""
    offset, global_pax, pending, last = 0, {}, [], None
    while True:
        header = fh.read(BLOCK)
        if len(header) < BLOCK:
            why = "unexpected end of data where a header or the end belongs" if offset or header else "it is empty"
            raise TarDamage(offset, why, last, truncated=offset > 0)
        if header == ZERO_BLOCK:
            if pending:
                raise TarDamage(offset, "an extended header is followed by the end of the archive", last)
            if fh.read(BLOCK) != ZERO_BLOCK:
                raise TarDamage(
                    offset + BLOCK,
                    "unexpected end of data: the second end-of-archive block is missing",
                    last,
                    truncated=True,
                )
            return
        size = _header_size(header, offset, last)
        kind, data = header[156:157], offset + BLOCK
        if kind in (*PAX, b"g", b"L", b"K"):  # describes the next member: read it, it is small
            blob = fh.read(_padded(size))
            if len(blob) < size:
                raise TarDamage(data, "unexpected end of data inside an extended header", last, truncated=True)
            if kind == b"L":
                pending.append(("L", _text(blob)))
            elif kind in PAX:
                pending.append(("x", {**global_pax, **_pax_records(blob[:size], offset, last)}))
            elif kind == b"g":
                global_pax.update(_pax_records(blob[:size], offset, last))
            else:
                pending.append(("K", None))  # a long link name: nothing a sample needs
            offset = data + _padded(size)
            continue
        if kind == b"S":
            raise TarDamage(offset, "a member is a GNU sparse file, which betonbuild does not read", last)
        last, kind, size = _name_and_size(header, kind, size, global_pax, pending)
        pending = []
        offset = data if kind in NO_PAYLOAD else data + _padded(size)
        if offset != data:
            if fh.seek(offset) != offset or (file_size is not None and data + size > file_size):
                raise TarDamage(data, "unexpected end of data", last, truncated=True, inside=True)
        yield last, kind in REGULAR, size


@contextmanager
def open_shard(path: str) -> Iterator[tuple[BinaryIO, int | None]]:
    """The shard's tar stream, decompressed when webdataset would (by its first bytes), and its size
    if known (an uncompressed file)."""
    with open(path, "rb") as raw:
        magic = raw.read(10)
        raw.seek(0)
        if magic.startswith(b"\x1f\x8b\x08"):
            stream = gzip.GzipFile(fileobj=raw)
        elif magic[:3] == b"BZh" and magic[4:10] == b"1AY&SY":
            stream = bz2.BZ2File(raw)
        elif magic.startswith((b"\x5d\x00\x00\x80", b"\xfd7zXZ")):
            stream = lzma.LZMAFile(raw)
        else:
            yield raw, os.fstat(raw.fileno()).st_size
            return
        with stream:
            yield stream, None


def _is_meta(name: str) -> bool:
    """Members webdataset's tar_file_iterator skips before grouping (its meta checks and skip_meta)."""
    return ("/" not in name and name.startswith("__") and name.endswith("__")) or bool(META_MEMBER.match(name))


def sample_members(fh: BinaryIO, file_size: int | None) -> Iterator[tuple[int, str, str, int, int]]:
    """(sample's position in the shard, sample key, extension, payload bytes, payload offset) of
    each member that belongs to a sample, in order: regular files named the way webdataset splits
    them, its meta members skipped, and a new sample wherever the key changes (its group_by_keys).
    The offset is into the tar stream (the file itself when it is not compressed)."""
    position, current = -1, None
    for name, regular, size in tar_members(fh, file_size):
        if not regular or _is_meta(name):
            continue
        key, ext = split_key(name)
        if key is not None:
            if key != current:
                position, current = position + 1, key
            yield position, key, ext, size, fh.tell() - _padded(size)
