"""Local WebDataset shards as a source: a derived shard list, then every sample decoded once.

``shard_list`` counts each shard's samples from its tar member HEADERS (grouped by sample key the
way webdataset groups them), without decoding a payload, and caches the result per shard (keyed
by path, size and mtime), so adding or changing one shard of a thousand recounts one shard.

``WebDatasetSource`` gives the shards an index: sample i is sample ``i - offset[s]`` of shard s.
It reads each shard through webdataset's own pipeline, sequentially, decoding only the samples it
is asked for, and checks every shard against the count in the shard list: a shard that changed
underneath (or a pipeline that is not deterministic) fails the build, naming the shard and both
counts; it never silently yields zero rows or overruns into the next shard.
"""

from __future__ import annotations

import bz2
import functools
import glob
import gzip
import hashlib
import importlib.util
import json
import lzma
import os
import re
import sys
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from betonbuild.config.spec import LARGEST_SAMPLES, DatasetSpec
from betonbuild.errors import SampleError, SourceError

META_MEMBER = re.compile(r"__[^/]*__($|/)")  # webdataset's skip_meta


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


def expand_shards(spec: DatasetSpec) -> list[str]:
    """The shard paths of a webdataset source: brace patterns and globs expanded, in order."""
    require_webdataset_installed(spec.name)  # braceexpand comes with it
    from braceexpand import braceexpand

    patterns = spec.source["shards"]
    patterns = [patterns] if isinstance(patterns, str) else patterns
    paths: list[str] = []
    for pattern in patterns:
        for expanded in braceexpand(pattern):
            if glob.has_magic(expanded):
                matched = sorted(glob.glob(expanded))
                if not matched:
                    raise SourceError(spec.name, f"shard pattern {expanded!r} matches no file")
                paths.extend(matched)
            else:
                paths.append(expanded)
    duplicates = sorted({p for p in paths if paths.count(p) > 1})
    if duplicates:
        raise SourceError(spec.name, f"shard {duplicates[0]} is listed twice")
    return paths


def field_keys(spec: DatasetSpec) -> list[list[str]]:
    """For each field, the webdataset extensions that may hold it, in order of preference."""
    keys = spec.source.get("keys") or {}
    return [[k.strip().lower() for k in keys.get(f.name, f.name).split(";") if k.strip()] for f in spec.fields]


def split_key(name: str) -> tuple[str | None, str | None]:
    """webdataset's base_plus_ext: 'dir/000123.seg.png' -> ('dir/000123', 'seg.png'). A copy, so that
    counting shards does not import webdataset (and torch); tests/workflow/test_webdataset.py compares the two."""
    match = re.match(r"^((?:.*/|)[^.]+)[.]([^/]*)$", name)
    return (match.group(1), match.group(2)) if match else (None, None)


# ---------------------------------------------------------------------------------------------
# Counting: a direct scan of the tar headers
# ---------------------------------------------------------------------------------------------
# tarfile parses every member in Python, and webdataset.TarWriter writes a PAX header before each
# member (for its float mtime): 0.58 s for the 16,000 members of bench/webdataset_write.py's shards,
# 0.15 s reading the 512-byte headers directly and seeking over the payloads.
# The scan names members exactly as tarfile does (webdataset reads shards through tarfile), and
# unlike tarfile it does not end quietly at a cut or a garbage header: a shard must close with
# its two zero blocks, or a sample could be missing from the count and the write.

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


def samples_digest(source: WebDatasetSource, rows: np.ndarray) -> str:
    """A digest of exactly these samples' members (names and bytes), read at their offsets in the
    shards. A compressed shard (no offsets to read at) and every shard of a source with a pipeline
    (which may combine samples) count as a whole, by their sha256."""
    wanted: dict[int, set[int]] = {}
    for row in rows.tolist():
        shard, local = source.location(row)
        wanted.setdefault(shard, set()).add(local)
    digest = hashlib.sha256()
    for shard in sorted(wanted):
        entry = source.entries[shard]
        found = None if source.spec.source.get("pipeline") else _samples_digest(entry["path"], wanted[shard])
        digest.update(f"{entry['path']}\0{found or ('shard ' + entry['sha256'])}\n".encode())
    return digest.hexdigest()


def _samples_digest(path: str, positions: set[int]) -> str | None:
    """A digest of the members of the samples at ``positions`` of an uncompressed shard; None if
    the shard cannot be read that way."""
    digest, last = hashlib.sha256(), max(positions)
    try:
        with open_shard(path) as (fh, size):
            if size is None:
                return None
            for position, key, ext, nbytes, offset in sample_members(fh, size):
                if position > last:
                    break
                if position in positions:
                    digest.update(f"{position}\0{key}\0{ext}\0{nbytes}\n".encode())
                    for start in range(offset, offset + nbytes, READ_CHUNK):
                        data = os.pread(fh.fileno(), min(READ_CHUNK, offset + nbytes - start), start)
                        if not data:
                            return None  # cut since it was listed
                        digest.update(data)
    except (OSError, TarDamage):
        return None
    return digest.hexdigest()


READ_CHUNK = 8 << 20


def count_shard(spec: DatasetSpec, path: str) -> dict[str, Any]:
    """Samples and extensions of one shard, from its tar headers only, grouped into samples the way
    webdataset's group_by_keys groups them; checks the required keys and that no key repeats."""
    required = None if spec.source.get("pipeline") else field_keys(spec)
    extensions, seen = set(), set()
    current_key, current_exts = None, set()
    sample_bytes: list[int] = []  # payload bytes per sample: the pre-flight inspects the largest

    def close_sample():
        if current_key is None or not required:
            return
        for field, alternatives in zip(spec.fields, required):
            if not current_exts & set(alternatives):
                raise SampleError(
                    spec.name,
                    field.name,
                    None,
                    f"sample has no {' or '.join(alternatives)} member (it has {sorted(current_exts)})",
                    "add the member to the shard, or map the field to the right key with source.keys",
                    location=f"shard {path}, key {current_key}",
                )

    try:
        with open_shard(path) as (fh, size):
            for position, key, ext, member_bytes, _ in sample_members(fh, size):
                ext = ext.lower()
                if position == len(sample_bytes):  # the first member of the next sample
                    close_sample()
                    if key in seen:
                        raise SourceError(spec.name, f"shard {path}: sample key {key!r} appears twice (not adjacent)")
                    seen.add(key)
                    current_key, current_exts = key, set()
                    sample_bytes.append(0)
                if ext in current_exts:
                    raise SourceError(spec.name, f"shard {path}: sample key {key!r} has two {ext!r} members")
                current_exts.add(ext)
                extensions.add(ext)
                sample_bytes[-1] += member_bytes
        close_sample()
    except FileNotFoundError:
        raise SourceError(spec.name, f"shard {path} does not exist (working directory {os.getcwd()})") from None
    except TarDamage as damage:
        raise SourceError(spec.name, _damage_message(path, damage)) from None
    except (OSError, EOFError, zlib.error, lzma.LZMAError) as exc:  # a compressed shard that is cut or damaged
        raise SourceError(
            spec.name, f"shard {path} is not a readable tar file (corrupt or truncated?): {type(exc).__name__}: {exc}"
        ) from None
    samples = len(sample_bytes)
    if samples == 0:
        raise SourceError(spec.name, f"shard {path} holds no sample")
    largest = sorted(range(samples), key=lambda i: -sample_bytes[i])[:LARGEST_SAMPLES]
    return {
        "samples": samples,
        "keys": sorted(extensions),
        "largest": [[i, sample_bytes[i]] for i in sorted(largest)],
    }  # [position in shard, bytes]


def _damage_message(path: str, damage: TarDamage) -> str:
    where = f"at byte {damage.offset}"
    if damage.member is not None:
        key = split_key(damage.member)[0]
        where += f", {'inside' if damage.inside else 'after'} member {damage.member!r}"
        where += f" (sample key {key})" if key else ""
    if damage.truncated:
        return f"shard {path} is truncated {where}: {damage.what}"
    if damage.offset == 0:
        return f"shard {path} is not a readable tar file (corrupt, or not a tar) {where}: {damage.what}"
    return f"shard {path} is corrupt {where}: {damage.what}"


def shard_list(spec: DatasetSpec, cache_path: str | os.PathLike) -> dict[str, Any]:
    """The derived shard list: path, size, mtime, sha256, sample count and keys of every shard."""
    from betonbuild.sources import sha256_file

    require_webdataset_installed(spec.name)
    cache_path = Path(cache_path)
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    entries = []
    for path in expand_shards(spec):
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            raise SourceError(spec.name, f"shard {path} does not exist (working directory {os.getcwd()})") from None
        cached = cache.get(path)
        if not (cached and cached["size"] == stat.st_size and cached["mtime_ns"] == stat.st_mtime_ns):
            cached = {
                "path": path,
                "size": stat.st_size,
                "mtime_ns": stat.st_mtime_ns,
                "sha256": sha256_file(path),
                **count_shard(spec, path),
            }
        entries.append(cached)
    from betonbuild.atomic import write_json

    write_json(cache_path, {e["path"]: e for e in entries})
    return {"dataset": spec.name, "samples": sum(e["samples"] for e in entries), "shards": entries}


# ---------------------------------------------------------------------------------------------
# Decoding rgb8 JPEGs with cv2: the same pixels as webdataset's PIL decoder, ~20% faster
# ---------------------------------------------------------------------------------------------
# PIL and cv2 both decode JPEG with libjpeg-turbo (same IDCT, upsampling, colour conversion), so a
# plain JPEG comes out bit-identical; tests/workflow/test_webdataset.py checks real photos (4:4:4, 4:2:2,
# 4:2:0, progressive, restart markers, grayscale, EXIF-rotated). cv2 is used only where that holds:
# 8-bit Huffman JPEGs (baseline, extended, progressive) of 1 or 3 components whose marker structure
# is clean from SOI to a final EOI, within PIL's decompression-bomb limit. Anything else (CMYK,
# 12-bit, arithmetic, PNG, cut or damaged data, where PIL raises on some that cv2 decodes) goes to
# webdataset. And the first JPEG of each kind (frame + colour markers) a process meets is decoded
# both ways: with a libjpeg build that disagrees, that kind stays with PIL.

SOF_PLAIN = (0xC0, 0xC1, 0xC2)  # Huffman baseline, extended sequential, progressive
SOF_OTHER = (0xC3, 0xC5, 0xC6, 0xC7, 0xC8, 0xC9, 0xCA, 0xCB, 0xCC, 0xCD, 0xCE, 0xCF)  # lossless, arithmetic, ...
SKIPPED = (0xC4, 0xDB, *range(0xE0, 0xF0), 0xFE)  # Huffman and quantisation tables, APPn, comments
SCAN_MARKER = re.compile(rb"\xff[^\x00]")
JPEG_KINDS: dict[bytes, bool] = {}  # kind -> cv2 gave webdataset's pixels, in this process


def jpeg_kind(data: bytes) -> bytes | None:
    """What decides how libjpeg decodes a plain JPEG (frame type, components, their sampling, the
    JFIF/Adobe colour markers); None if ``data`` is anything else, or if its marker structure is
    not clean: libjpeg only warns about a stray marker or a missing one, and PIL then fails on some
    where cv2 returns pixels, so those stay with PIL."""
    if not data.startswith(b"\xff\xd8"):
        return None
    pos, frame, markers, restarts = 2, None, b"", False
    while pos + 2 <= len(data) and data[pos] == 0xFF:
        marker = data[pos + 1]
        if marker == 0xD9:  # the end of the image must be the end of the payload
            return frame + markers if frame and pos + 2 == len(data) else None
        length = int.from_bytes(data[pos + 2 : pos + 4], "big")
        segment, end = data[pos + 4 : pos + 2 + length], pos + 2 + length
        if length < 2 or end > len(data):
            return None
        if marker in SOF_PLAIN and frame is None:
            frame = _plain_frame(marker, segment)
            if frame is None:
                return None
        elif marker == 0xDA and frame is not None:
            end = _scan_end(data, end, restarts)
            if end is None:
                return None
        elif marker == 0xDD:
            restarts = segment[:2] != b"\0\0"
        elif marker == 0xE0 and segment.startswith(b"JFIF\0"):
            markers += b"J"
        elif marker == 0xEE and segment.startswith(b"Adobe") and len(segment) >= 12:
            markers += b"A" + segment[11:12]  # its colour transform
        elif marker not in SKIPPED:
            return None  # another kind of frame, a second frame, a scan before the frame, ...
        pos = end
    return None


def _scan_end(data: bytes, pos: int, restarts: bool) -> int | None:
    """Where the entropy-coded data from ``pos`` ends: at the first marker that is not a restart
    marker in sequence (FF 00 is a stuffed FF); None if it does not end in a marker."""
    expected = 0xD0
    for match in SCAN_MARKER.finditer(data, pos):
        if not (restarts and data[match.start() + 1] == expected):
            return match.start()
        expected = 0xD0 + (expected - 0xCF) % 8
    return None


def _plain_frame(marker: int, frame: bytes) -> bytes | None:
    """The marker and component specs of an 8-bit frame of 1 or 3 components; None for others."""
    from PIL import Image

    if len(frame) < 6 or frame[0] != 8 or frame[5] not in (1, 3) or len(frame) < 6 + 3 * frame[5]:
        return None
    pixels = int.from_bytes(frame[1:3], "big") * int.from_bytes(frame[3:5], "big")
    if pixels == 0 or (Image.MAX_IMAGE_PIXELS and pixels > Image.MAX_IMAGE_PIXELS):
        return None  # height from a DNL marker, or PIL's bomb warning/error: PIL's behaviour, not cv2's
    return bytes([marker]) + frame[5 : 6 + 3 * frame[5]]


def cv2_rgb8(data: bytes) -> np.ndarray | None:
    """HxWx3 uint8 RGB, grayscale repeated into 3 channels, EXIF orientation NOT applied (as PIL's
    ``convert("RGB")``); None if cv2 cannot decode it."""
    import cv2

    rgb = getattr(cv2, "IMREAD_COLOR_RGB", None)  # OpenCV >= 4.11 decodes to RGB directly
    flags = (cv2.IMREAD_COLOR if rgb is None else rgb) | cv2.IMREAD_IGNORE_ORIENTATION
    try:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), flags)
    except cv2.error:
        return None
    if image is not None and rgb is None:
        image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    return image


class WebDatasetSource:
    """Indexed view of the shards listed in ``shards.json`` (see the module docstring)."""

    may_import_ffcv = False  # it imports webdataset (and torch), not ffcv

    def __init__(self, spec: DatasetSpec, shard_list_path: str | os.PathLike):
        self.spec = spec
        require_webdataset_installed(spec.name)
        with open(shard_list_path) as fh:
            self.entries = json.load(fh)["shards"]
        paths = [e["path"] for e in self.entries]
        if paths != expand_shards(spec):
            raise SourceError(spec.name, f"{shard_list_path} lists other shards than the config; run snakemake again")
        self.counts = np.array([e["samples"] for e in self.entries], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.counts)])
        self.files = paths
        self.keys = field_keys(spec)
        self._pipeline = None
        if spec.source.get("pipeline"):
            from betonbuild.sources import import_factory

            self._pipeline = import_factory(spec.name, spec.source["pipeline"])
        self._local = threading.local()  # each thread (and forked worker) reads with its own cursor
        self._pid = os.getpid()

    # webdataset (which imports torch) only once samples are read: the shard list and the manifest
    # do not need it
    @functools.cached_property
    def wds(self):
        return require_webdataset(self.spec.name)

    @functools.cached_property
    def _images(self):
        return self.wds.autodecode.imagehandler(self.spec.source["decode"])

    @functools.cached_property
    def _decoder(self):
        return self.wds.autodecode.Decoder([self._images])

    @functools.cached_property
    def _rgb8_extensions(self) -> set:
        return self._images.extensions if self.spec.source["decode"] == "rgb8" else set()

    @property
    def _cursor(self) -> tuple[int, int, Iterator] | None:
        """(shard, next local index, samples) of this thread's open shard."""
        return getattr(self._local, "cursor", None)

    @_cursor.setter
    def _cursor(self, value) -> None:
        self._local.cursor = value

    def fixed_columns(self) -> dict[str, Any]:
        return {}

    def encoded_image(self, index: int) -> None:
        return None

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def sample_sizes(self) -> np.ndarray | None:
        """Bytes of each shard's largest samples (from the tar headers; 0 for the others): enough for
        the pre-flight to find the dataset's largest ones. None for shard lists without sizes."""
        if not all("largest" in e for e in self.entries):
            return None
        sizes = np.zeros(len(self), dtype=np.int64)
        for offset, entry in zip(self.offsets, self.entries):
            for position, size in entry["largest"]:
                sizes[offset + position] = size
        return sizes

    def location(self, index: int) -> tuple[int, int]:
        shard = int(np.searchsorted(self.offsets, index, side="right") - 1)
        return shard, int(index - self.offsets[shard])

    def _samples(self, shard: int) -> Iterator:
        dataset = self.wds.WebDataset(
            self.entries[shard]["path"], shardshuffle=False, empty_check=False, nodesplitter=None, workersplitter=None
        )
        return iter(self._pipeline(dataset) if self._pipeline else dataset)

    def _next(self, shard: int, local: int, index: int):
        path = self.entries[shard]["path"]
        try:
            return next(self._cursor[2])
        except StopIteration:
            raise self._count_mismatch(shard, index, found=local) from None
        except SampleError:
            raise
        except Exception as exc:
            raise SampleError(
                self.spec.name,
                None,
                index,
                f"reading the shard failed: {type(exc).__name__}: {exc}",
                location=f"shard {path}, sample {local}",
            ) from exc

    def raw(self, index: int):
        """The undecoded sample (a dict of bytes, or the pipeline's output) at a global index."""
        if os.getpid() != self._pid:  # a forked writer worker must not share its parent's open shard
            self._local, self._pid = threading.local(), os.getpid()
        shard, local = self.location(index)
        if self._cursor is None or self._cursor[0] != shard or self._cursor[1] > local:
            self._cursor = (shard, 0, self._samples(shard))
        while self._cursor[1] <= local:
            sample = self._next(shard, self._cursor[1], index)
            self._cursor = (shard, self._cursor[1] + 1, self._cursor[2])
        if local == self.counts[shard] - 1:
            self._check_exhausted(shard, index)
        return sample

    def _check_exhausted(self, shard: int, index: int) -> None:
        """After a shard's last listed sample there must be no other: never overrun into the next shard."""
        extra = sum(1 for _ in self._cursor[2])
        self._cursor = None
        if extra:
            raise self._count_mismatch(shard, index, found=int(self.counts[shard]) + extra)

    def _count_mismatch(self, shard: int, index: int, found: int) -> SampleError:
        path = self.entries[shard]["path"]
        return SampleError(
            self.spec.name,
            None,
            index,
            f"shard {path} yields {found} samples, but the shard list counted {self.counts[shard]}; "
            "it changed since it was listed, or the pipeline is not deterministic",
            "run snakemake again (the shard list is derived again when a shard changes)",
            location=f"shard {path}",
        )

    def __getitem__(self, index: int):
        sample = self.raw(int(index))
        if self._pipeline:
            return sample
        return self.decode(sample, int(index))

    def decode(self, sample: dict, index: int) -> tuple:
        """Decodes just the members the fields need, naming shard, key and field on failure."""
        where = f"shard {sample.get('__url__')}, key {sample.get('__key__')}"
        values = []
        for field, alternatives in zip(self.spec.fields, self.keys):
            ext = next((k for k in alternatives if k in sample), None)
            if ext is None:
                present = sorted(k for k in sample if not k.startswith("__"))
                raise SampleError(
                    self.spec.name,
                    field.name,
                    index,
                    f"sample has no {' or '.join(alternatives)} member (it has {present})",
                    location=where,
                )
            try:
                values.append(self.decode1(ext, sample[ext]))
            except Exception as exc:  # noqa: BLE001 - any decoder failure is this sample's error
                raise SampleError(
                    self.spec.name,
                    field.name,
                    index,
                    f"cannot decode its {ext!r} member: {type(exc).__name__}: {exc}",
                    location=where,
                ) from None
        return tuple(values)

    def decode1(self, ext: str, payload: bytes):
        """webdataset's decode of one member; a plain rgb8 JPEG through cv2 (see ``jpeg_kind``)."""
        kind = jpeg_kind(payload) if ext.rsplit(".", 1)[-1] in self._rgb8_extensions else None
        if kind is None or JPEG_KINDS.get(kind) is False:
            return self._decoder.decode1(ext, payload)
        image = cv2_rgb8(payload)
        if image is None:  # webdataset's decoder then says what is wrong with it
            return self._decoder.decode1(ext, payload)
        if kind not in JPEG_KINDS:
            reference = self._decoder.decode1(ext, payload)
            JPEG_KINDS[kind] = reference.shape == image.shape and np.array_equal(reference, image)
            return reference
        return image
