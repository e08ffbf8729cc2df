"""An image folder's file list: scanned once per run, hashed once per file, read by every job.

A folder of a million images must not be a million Snakemake inputs (every dry run and no-op run
would stat and record them all, minutes before any job starts). Instead:

- ``folder_stat`` digests every image file's name, size, mtime and inode (GNU find's output as it
  comes, else ``scan_folder``'s), no file opened: the ``file_list`` rule's parameter, so Snakemake
  reruns that job exactly when a file is added, removed, renamed or rewritten, and a no-op run reads
  no image.
- ``scan_folder`` lists ``root/<class>/...`` in the samples' order: the same GNU find output,
  parsed and sorted, else (no GNU find, or a name it cannot parse) ``os.scandir``.
- the ``file_list`` job writes ``results/{ds}/files.npz`` (``write_listing``): every file with its
  sha256, hashed only where size, mtime or inode changed since the last listing (``.files-cache.npz``
  beside it). The source manifest fingerprints the folder from it without reading an image.
- every later job opens the folder from that listing (``read_listing``), the same files in the
  same order, and refuses a file whose size or mtime changed since (``FolderListing.changed_since_listed``).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import itertools
import json
import multiprocessing
import os
import subprocess
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from betonbuild.atomic import atomic_path
from betonbuild.errors import SourceError
from betonbuild.sources.files import sha256_file

LISTING = "files.npz"
CACHE = ".files-cache.npz"
FORMAT = "betonbuild image folder listing 1"
PARSE_BLOCK_BYTES = 8 << 20  # find's output parsed this much at a time (~60,000 files)


@dataclass
class FolderListing:
    root: Path
    classes: list[str]
    rels: list[str]  # paths relative to root: classes in sorted order, each walked in sorted order
    labels: np.ndarray  # int64, the class index of each file
    sizes: np.ndarray  # int64
    mtimes: np.ndarray  # int64, st_mtime_ns
    inodes: np.ndarray  # int64
    sha256: np.ndarray | None = None  # (files, 32) uint8, once hashed (write_listing, read_listing)

    def __len__(self) -> int:
        return len(self.rels)

    def signature(self) -> str:
        """A digest of every file's name, size, mtime and inode (no content): changes when any file does."""
        digest = hashlib.sha256("\n".join(self.rels).encode())
        for column in (self.labels, self.sizes, self.mtimes, self.inodes):
            digest.update(np.ascontiguousarray(column, dtype="<i8"))
        return digest.hexdigest()

    def content_digest(self, rows: np.ndarray | None = None) -> str:
        """A digest of the relative path, label, size and sha256 of every file (with the root), or of
        the files of ``rows`` in that order (a part's, the smoke samples')."""
        if rows is None:
            digest = hashlib.sha256(f"{self.root}\0".encode())
            rels, take = self.rels, slice(None)
        else:
            digest = hashlib.sha256()
            rels, take = [self.rels[row] for row in rows.tolist()], rows
        digest.update("\0".join(rels).encode("utf-8", "surrogateescape"))
        for column in (self.labels[take], self.sizes[take]):
            digest.update(np.ascontiguousarray(column, dtype="<i8"))
        digest.update(np.ascontiguousarray(self.sha256[take]))
        return digest.hexdigest()

    def path(self, index: int) -> str:
        return os.path.join(self.root, self.rels[index])

    def paths(self, indices: list[int]) -> list[str]:
        """The paths of the files at ``indices``: joined as strings (a million ``Path`` objects cost
        seconds; ``rels`` hold plain relative names)."""
        prefix = os.path.join(self.root, "")
        return [prefix + self.rels[i] for i in indices]

    def changed_since_listed(self, index: int, stat: os.stat_result) -> str | None:
        """Why the file at ``index`` is not the file listed (its content may not be what the manifest
        recorded), or None."""
        if stat.st_size == self.sizes[index] and stat.st_mtime_ns == self.mtimes[index]:
            return None
        return (
            f"image file {self.path(index)} changed after the folder was listed (now {stat.st_size} bytes, "
            f"listed {int(self.sizes[index])}; or rewritten since): the folder changed during the build"
        )


def scan_folder(dataset: str, root: Path, extensions: list[str]) -> FolderListing:
    """Every image file under ``root/<class>/`` (class = sorted sub-folder names), stat only, in the
    order ``os.walk`` gives (a folder's files sorted, then its sub-folders): GNU find's listing where
    it works (the DAG's own scan, 3x faster), else ``os.scandir``."""
    try:
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    except OSError as exc:
        raise SourceError(dataset, f"image folder {root} cannot be listed: {exc.strerror or exc}") from None
    found = _find(str(root), tuple(extensions))
    listed = _parse_found(dataset, str(root), classes, found) if found is not None else None
    return listed if listed is not None else _scandir_listing(dataset, Path(root), classes, extensions)


def _parse_found(dataset: str, root: str, classes: list[str], found: bytes) -> FolderListing | None:
    """``_find``'s lines as a listing in ``scan_folder``'s order, ``PARSE_BLOCK_BYTES`` of lines at a
    time (``_parse_lines``; the whole output split at once held ~830 bytes a file: 1 GB at 1.28M).
    None where a line does not parse (a file name holding a tab or a newline, a time before 1970):
    the scan then lists the folder itself."""
    if found and not found.endswith(b"\n"):
        return None
    prefix = len(os.path.join(root, ""))
    rels: list[str] = []
    blocks: list[np.ndarray] = []
    start = 0
    while start < len(found):
        end = found.find(b"\n", start + PARSE_BLOCK_BYTES) + 1 or len(found)
        block = _parse_lines(found[start:end], prefix)
        if block is None:
            return None
        rels.extend(block[0])
        blocks.append(block[1])
        start = end
    numbers = np.concatenate(blocks) if blocks else np.zeros((0, 4), dtype=np.int64)  # size, ns, inode, is a file
    label_of = {name: label for label, name in enumerate(classes)}
    # files directly in root are not samples, only those in class sub-folders
    keep = [i for i, rel in enumerate(rels) if "/" in rel and rel.partition("/")[0] in label_of]
    broken = next((i for i in keep if not numbers[i, 3]), None)
    if broken is not None:  # -L: a link to nothing (the scandir scan's stat fails the same way)
        raise SourceError(dataset, f"image file {root}/{rels[broken]} cannot be read: a broken symbolic link")
    nested = any(rels[i].count("/") > 1 for i in keep)
    keep.sort(key=(lambda i: _walk_key(rels[i])) if nested else (lambda i: rels[i].replace("/", "\0")))
    kept = numbers[np.array(keep, dtype=np.int64)]
    labels = np.array([label_of[rels[i].partition("/")[0]] for i in keep], dtype=np.int64)
    rels = [rels[i] for i in keep]
    return FolderListing(Path(root), classes, rels, labels, kept[:, 0], kept[:, 1], kept[:, 2])


def _parse_lines(lines: bytes, prefix: int) -> tuple[list[str], np.ndarray] | None:
    """Whole lines of ``_find``, column by column: one split, no object per line kept. (the paths
    less ``prefix`` characters, an (n, 4) int64 array of size, mtime ns, inode, 1 if a file); None
    where a line does not parse."""
    cells = lines.split(b"\t")  # the path and the next line's size share a cell: split those at the newline
    count = lines.count(b"\n")
    if len(cells) != 4 * count + 1:
        return None  # a tab in a name
    rest = b"\n".join(cells[4::4]).split(b"\n")  # path, size, path, size, ..., path, b""
    if len(rest) != 2 * count:
        return None  # a newline in a name
    numbers = np.empty((count, 4), dtype=np.int64)
    try:
        numbers[:, 0] = [int(size) for size in [cells[0], *rest[1:-1:2]]]
        numbers[:, 2] = [int(inode) for inode in cells[2::4]]
    except ValueError:
        return None
    nanoseconds = _nanoseconds(cells[1::4])
    if nanoseconds is None:
        return None
    numbers[:, 1] = nanoseconds
    numbers[:, 3] = [kind == b"f" for kind in cells[3::4]]
    del cells
    rels = [rel[prefix:] for rel in b"\n".join(rest[0::2]).decode("utf-8", "surrogateescape").split("\n")]
    return rels, numbers


def _nanoseconds(times: list[bytes]) -> np.ndarray | None:
    """find's ``%T@`` times (seconds, a dot, a fraction of up to 10 digits) as integer nanoseconds
    since 1970, exact; None for a time before 1970 or one without its fraction."""
    if not times:
        return np.zeros(0, dtype=np.int64)
    parts = b".".join(times).split(b".")
    if len(parts) != 2 * len(times) or any(t.startswith(b"-") for t in times):
        return None
    seconds = np.array([int(s) for s in parts[0::2]], dtype=np.int64)
    fractions = [f[:9].ljust(9, b"0") for f in parts[1::2]]
    return seconds * 1_000_000_000 + np.array([int(f) for f in fractions], dtype=np.int64)


def _walk_key(rel: str) -> str:
    """Sorts paths as ``os.walk`` (sorted) visits them: in each folder its files, by name, before its
    sub-folders (no name holds a NUL or a slash, so \\0 before \\1 puts a file first). One level of
    folders (``class/file``) sorts the same by the path with its slash made a NUL."""
    *folders, name = rel.split("/")
    return "".join(f"\1{folder}\0" for folder in folders) + "\0" + name


def _scandir_listing(dataset: str, root: Path, classes: list[str], extensions: list[str]) -> FolderListing:
    """The scan without GNU find."""
    wanted = {e.lower() for e in extensions}
    rels: list[str] = []
    labels: list[int] = []
    stats: list[tuple[int, int, int]] = []
    for label, name in enumerate(classes):
        before = len(rels)
        _walk(dataset, root, name, wanted, rels, stats)
        labels.extend([label] * (len(rels) - before))
    columns = np.array(stats, dtype=np.int64).reshape(-1, 3)
    return FolderListing(
        root, classes, rels, np.array(labels, dtype=np.int64), columns[:, 0], columns[:, 1], columns[:, 2]
    )


def _walk(dataset: str, root: Path, rel_dir: str, wanted: set[str], rels: list, stats: list) -> None:
    """The order ``os.walk`` gives (a folder's files sorted, then its sub-folders, sorted), with stats."""
    subdirs = []
    with os.scandir(root / rel_dir) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.name.startswith("."):
                continue
            if entry.is_dir():
                subdirs.append(entry.name)
            elif os.path.splitext(entry.name)[1].lower() in wanted:
                try:
                    stat = entry.stat()
                except OSError as exc:  # a broken symbolic link, a file removed while listed
                    raise SourceError(dataset, f"image file {entry.path} cannot be read: {exc.strerror}") from None
                rels.append(f"{rel_dir}/{entry.name}")
                stats.append((stat.st_size, stat.st_mtime_ns, stat.st_ino))
    for name in subdirs:
        _walk(dataset, root, f"{rel_dir}/{name}", wanted, rels, stats)


class FolderStat:
    """What the DAG needs of a folder: a digest of every image file's stat, their number and bytes
    (summed only if asked: the resource estimates of a job that is to run)."""

    def __init__(self, signature: str, files: int | None, sizes: np.ndarray | bytes | None = None):
        self.signature = signature
        self.files = files  # None: the folder does not exist or cannot be listed
        self._sizes = sizes  # the sizes, or find's output whose lines start with them

    @functools.cached_property
    def bytes(self) -> int:
        if self._sizes is None:
            return 0
        if isinstance(self._sizes, np.ndarray):
            return int(self._sizes.sum())
        return sum(int(line[: line.index(b"\t")]) for line in self._sizes.splitlines())


@functools.cache
def folder_stat(dataset: str, root: str, extensions: tuple[str, ...]) -> FolderStat:
    """One stat of the folder per Snakemake process (its DAG asks for the signature and the length
    many times): a digest of GNU find's listing as it comes, unparsed and unsorted (stable while the
    folder does not change), else of the scan's. A folder that is missing or cannot be listed gets a
    signature too: the file_list job then runs and says why."""
    if not os.path.isdir(root):
        return FolderStat("missing", None)
    found = _find(root, extensions)
    if found is not None:
        # Files directly in root are not samples (only class sub-folders are); they count here, so a
        # change to one reruns the file list, which finds nothing changed
        return FolderStat(hashlib.sha256(found).hexdigest(), found.count(b"\n"), found)
    try:
        listing = scan_folder(dataset, Path(root), list(extensions))
    except SourceError as exc:
        return FolderStat(f"unreadable: {exc}", None)
    return FolderStat(listing.signature(), len(listing), listing.sizes)


FIND_PROCESSES = 4  # stat calls wait on the disk (or the network file system): more than the cores help
FIND_MAX_START_POINTS = 10_000  # more top-level entries than this: one find of the root (the command line's limit)


def _find(root: str, extensions: tuple[str, ...]) -> bytes | None:
    """``find -printf`` of every image file's size, mtime, inode, type and path (the order readdir
    gives), a few finds side by side over groups of the class folders; None where find is not GNU
    find or fails (a file removed while it ran). Broken links (type l under -L) are listed, so the
    listing refuses them as the scan does."""
    try:
        tops = sorted(os.path.join(root, name) for name in os.listdir(root) if not name.startswith("."))
    except OSError:
        return None
    if len(tops) > FIND_MAX_START_POINTS:
        groups = [[root]]
    else:
        count = max(1, min(FIND_PROCESSES, len(tops)))
        groups = [tops[i::count] for i in range(count)]
    names = [arg for ext in extensions for arg in ("-o", "-iname", f"*{ext}")][1:]

    def find(start_points: list[str]) -> bytes | None:
        command = ["find", "-L", *start_points, "-mindepth", "1" if start_points == [root] else "0"]
        command += ["-name", ".*", "-prune", "-o", "(", "-type", "f", "-o", "-type", "l", ")", "(", *names, ")"]
        command += ["-printf", "%s\t%T@\t%i\t%y\t%p\n"]
        try:
            found = subprocess.run(command, capture_output=True, env={**os.environ, "LC_ALL": "C"}, check=False)
        except OSError:
            return None
        return found.stdout if found.returncode == 0 else None

    with ThreadPoolExecutor(len(groups)) as pool:
        outputs = list(pool.map(find, groups))
    return None if any(output is None for output in outputs) else b"".join(outputs)


def write_listing(dataset: str, listing: FolderListing, path: str | os.PathLike, processes: int = 1, pool=None) -> int:
    """Hashes the files (those unchanged since the cache beside ``path`` are not read again) in
    ``processes`` processes (or those of ``pool``, a ``hashing_pool``), writes the listing to ``path``
    and the cache; returns how many files were hashed."""
    path = Path(path)
    cache_path = path.with_name(CACHE)
    digests = np.zeros((len(listing), 32), dtype=np.uint8)
    unchanged = _unchanged_since(listing, cache_path, digests)
    missing = np.flatnonzero(~unchanged)
    if missing.size:
        digests[missing] = hash_files(dataset, listing.paths(missing.tolist()), processes, pool)
    listing.sha256 = digests
    for target in (path, cache_path):
        with atomic_path(target) as tmp, open(tmp, "wb") as fh:
            _save(fh, listing)
    return int(missing.size)


def _unchanged_since(listing: FolderListing, cache_path: Path, digests: np.ndarray) -> np.ndarray:
    """Which files have the path, size, mtime and inode the cache recorded; their digests copied in."""
    unchanged = np.zeros(len(listing), dtype=bool)
    try:
        cached = _load(cache_path)
    except (OSError, ValueError, KeyError):
        return unchanged  # no cache (the first listing), or an unreadable one: hash everything
    if cached.rels == listing.rels:  # nothing added or removed: compare the stats at once
        at = np.arange(len(listing))
        found = at
    else:
        where = {rel: i for i, rel in enumerate(cached.rels)}
        pairs = [(i, where[rel]) for i, rel in enumerate(listing.rels) if rel in where]
        at, found = (np.array(column, dtype=np.int64) for column in zip(*pairs)) if pairs else (np.zeros(0, int),) * 2
    same = (
        (cached.sizes[found] == listing.sizes[at])
        & (cached.mtimes[found] == listing.mtimes[at])
        & (cached.inodes[found] == listing.inodes[at])
    )
    unchanged[at[same]] = True
    digests[at[same]] = cached.sha256[found[same]]
    return unchanged


HASH_BATCH = 2000  # files per task: small images cost ~15 us each to hash, a task ~1 ms to hand over


@contextlib.contextmanager
def hashing_pool(processes: int) -> Iterator[ProcessPoolExecutor | None]:
    """``processes`` hashing processes forked now, before the caller lists a folder: forked after a
    listing of a million files, each one's RSS counted the parent's whole heap again (Snakemake's
    ``max_rss`` of the file_list job, which sums them: 1574 MiB at 1.28M files, PSS 750)."""
    if processes <= 1:
        yield None
        return
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("fork")) as pool:
        list(pool.map(int, range(processes)))  # a fork pool starts all its processes at its first task
        yield pool


def hash_files(dataset: str, paths: list[str], processes: int, pool: ProcessPoolExecutor | None = None) -> np.ndarray:
    """sha256 of each file, in order, as an (n, 32) array, on ``pool`` or in ``processes`` processes.
    Processes, not threads: a small file's hash holds the GIL (hashlib releases it only above 2 KiB),
    so threads run slower than one."""
    batches = [paths[i : i + HASH_BATCH] for i in range(0, len(paths), HASH_BATCH)]
    if len(batches) <= 1 or (pool is None and processes <= 1):
        hashed = [_hash_batch(dataset, batch) for batch in batches]
    else:
        gc.freeze()  # workers forked here (no pool given) then leave the listing's million objects unshared
        try:
            with contextlib.nullcontext(pool) if pool is not None else hashing_pool(processes) as workers:
                hashed = list(workers.map(_hash_batch, itertools.repeat(dataset), batches))
        finally:
            gc.unfreeze()
    return np.frombuffer(b"".join(hashed), dtype=np.uint8).reshape(-1, 32)


def _hash_batch(dataset: str, paths: list[str]) -> bytes:
    try:
        return b"".join(sha256_file(path, raw=True) for path in paths)
    except OSError as exc:
        raise SourceError(dataset, f"image file {exc.filename} cannot be read: {exc.strerror}") from None


def _save(fh, listing: FolderListing) -> None:
    """An uncompressed .npz: the paths NUL-separated (no file name holds a NUL), the numbers and
    digests as arrays: read back in a fraction of a second for a million files."""
    header = {"format": FORMAT, "root": str(listing.root), "classes": listing.classes, "files": len(listing)}
    np.savez(
        fh,
        header=np.array(json.dumps(header)),
        rels=np.frombuffer("\0".join(listing.rels).encode("utf-8", "surrogateescape"), dtype=np.uint8),
        numbers=np.stack([listing.labels, listing.sizes, listing.mtimes, listing.inodes], axis=1),
        sha256=listing.sha256,
    )


def _load(path: str | os.PathLike) -> FolderListing:
    with np.load(path, allow_pickle=False) as stored:
        header = json.loads(str(stored["header"]))
        if header.get("format") != FORMAT:
            raise ValueError(f"{path} is not a listing of this betonbuild version")
        names = stored["rels"].tobytes().decode("utf-8", "surrogateescape")
        rels = names.split("\0") if header["files"] else []
        numbers, digests = stored["numbers"], stored["sha256"]
    if len(rels) != header["files"] or len(numbers) != len(rels) or digests.shape != (len(rels), 32):
        raise ValueError(f"{path} lists {len(rels)} files, its header says {header['files']}")
    labels, sizes, mtimes, inodes = (np.ascontiguousarray(numbers[:, k]) for k in range(4))
    return FolderListing(Path(header["root"]), header["classes"], rels, labels, sizes, mtimes, inodes, digests)


def read_listing(dataset: str, path: str | os.PathLike) -> FolderListing:
    """The listing the file_list job wrote: the files every later job of the dataset reads."""
    try:
        return _load(path)
    except (OSError, ValueError, KeyError) as exc:
        raise SourceError(dataset, f"cannot read the file list {path} ({exc}); run snakemake again") from None
