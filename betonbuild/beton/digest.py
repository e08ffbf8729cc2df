"""A content digest of a .beton: sha256 over what the file holds, not how it is laid out.

Two files with the same samples, in the same order, with the same fields, have the same digest
whatever their page size, the pages each sample landed on, the order of the allocation table or
the number of writer workers (ffcv with 2 workers writes different bytes on every run).

Definition (version 1). Samples are cut into blocks of ``BLOCK`` consecutive samples; block k's
leaf is ``sha256(canonical(sample) for sample in block)``; the digest is
``sha256(PREFIX + json(header) + "\\n" + leaf_0 + leaf_1 + ...)`` with header
``{"num_samples": n, "fields": [[name, type_id, sha256(arguments)], ...]}`` (compact, sorted keys).
A sample's canonical bytes are its fields' in field order:

- int: ``<i8``; float: ``<f8`` (the stored bits)
- ndarray / torch_tensor: the payload bytes
- bytes / json: ``<u8`` length, then the payload (json keeps its NUL terminator)
- rgb_image: mode ``u1``, width ``<u2``, height ``<u2``, ``<u8`` length, then the payload
- custom: ``<u8`` record length, then the metadata record with every 8-byte little-endian copy of
  a pointer to one of the sample's custom allocations replaced by ``0xFFFFFFFF`` + ``<u4`` its
  ordinal; after the sample's last field, if it has custom fields: ``<u8`` count of its custom
  allocations, then for each (pointer order) ``<u8`` size and the bytes.

Each field kind produces its canonical bytes (``FieldKind.digest_column``, ``betonbuild.fields``).
Blocks are hashed in parallel (hashlib releases the GIL); their order is fixed, so the digest does
not depend on the number of threads either.
"""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from typing import Any

import numpy as np

from betonbuild.beton.format import BetonFile
from betonbuild.fields import stored_kind
from betonbuild.mapped_pages import RELEASE_EVERY_BYTES, release_mapped

PREFIX = b"betonbuild content digest v1\n"
RANGE_PREFIX = b"betonbuild range digest v1\n"
BLOCK = 1024
BLOCKS_IN_FLIGHT = 256  # blocks submitted to the thread pool at a time


def header(beton: BetonFile) -> dict[str, Any]:
    return {
        "num_samples": beton.num_samples,
        "fields": [[f.name, f.type_id, hashlib.sha256(f.arguments).hexdigest()] for f in beton.fields],
    }


def content_digest(beton: BetonFile, threads: int = 1) -> str:
    """The hex sha256 content digest of ``beton`` (see the module docstring)."""
    return content_from_leaves(beton, _leaves(beton, 0, beton.num_samples, threads))


def range_digest(beton: BetonFile, start: int, stop: int, threads: int = 1) -> str:
    """sha256 of the content of samples [start, stop), blocks counted from ``start``: a part file's
    ``range_digest(part, 0, n)`` equals the merged file's over the rows the part landed on."""
    return range_from_leaves(_leaves(beton, start, stop, threads))


def blocks(start: int, stop: int) -> list[tuple[int, int]]:
    """The [a, b) sample blocks of a range, each hashed into one leaf (``leaf``)."""
    return [(a, min(a + BLOCK, stop)) for a in range(start, stop, BLOCK)]


def content_from_leaves(beton: BetonFile, leaves: list[bytes]) -> str:
    """The content digest from the leaves of ``blocks(0, num_samples)``, in order."""
    digest = hashlib.sha256(PREFIX)
    digest.update(json.dumps(header(beton), sort_keys=True, separators=(",", ":")).encode() + b"\n")
    for one in leaves:
        digest.update(one)
    return digest.hexdigest()


def range_from_leaves(leaves: list[bytes]) -> str:
    """The range digest from the leaves of ``blocks(start, stop)``, in order: the whole file's
    (``range_digest(beton, 0, n)``) comes from the same leaves as its content digest."""
    digest = hashlib.sha256(RANGE_PREFIX)
    for one in leaves:
        digest.update(one)
    return digest.hexdigest()


def _leaves(beton: BetonFile, start: int, stop: int, threads: int) -> list[bytes]:
    """The leaves in order (32 bytes per block); blocks are handed to the pool ``BLOCKS_IN_FLIGHT``
    at a time, so that no future per block of the whole file exists at once, and the file's pages
    read are unmapped after each batch (mapped, the whole file stays in the RSS: 32 bytes a sample
    of float32[4] + int64, 3.2 GB at 100M rows; they stay in the page cache)."""
    spans = blocks(start, stop)
    leaves: list[bytes] = []
    with ThreadPoolExecutor(threads) if threads > 1 and len(spans) > 1 else nullcontext() as pool:
        for at in range(0, len(spans), BLOCKS_IN_FLIGHT):
            batch = spans[at : at + BLOCKS_IN_FLIGHT]
            leaves.extend((pool.map if pool else map)(lambda b: leaf(beton, *b), batch))
            release_mapped(beton.mm)
    return leaves


def leaf_releasing(beton: BetonFile, number: int, start: int, stop: int) -> bytes:
    """``leaf`` of the ``number``-th block, for a caller that submits every block to its pool at
    once: every ``BLOCKS_IN_FLIGHT``-th block also unmaps the file's pages read so far (else, while
    the blocks run ahead of everything else on the pool, the whole file stays mapped: 4 GB of the
    verify job's RSS at 100M rows of float32[4] + int64). Other threads' reads just map them again."""
    digest = leaf(beton, start, stop)
    if number % BLOCKS_IN_FLIGHT == BLOCKS_IN_FLIGHT - 1:
        release_mapped(beton.mm)
    return digest


def leaf(beton: BetonFile, start: int, stop: int) -> bytes:
    """The sha256 leaf of one block of ``blocks``: callers may hash the blocks on their own threads."""
    positions = np.arange(start, stop)
    columns = [_column(beton, info, positions) for info in beton.fields]
    digest = hashlib.sha256()
    if all(isinstance(c, np.ndarray) for c in columns):
        digest.update(np.hstack(columns).tobytes())  # fixed-size only: sample-major bytes in one go
        return digest.digest()
    has_custom = any(stored_kind(f, beton.path).custom_allocations for f in beton.fields)
    hashed = 0  # payload bytes since the file's pages were last unmapped (large images: GBs a batch)
    for i, position in enumerate(positions):
        allocations = beton.custom_allocations(int(position)) if has_custom else []
        for column in columns:
            if isinstance(column, np.ndarray):
                digest.update(column[i])
            else:
                for part in column(i, int(position), allocations):
                    digest.update(part)
                    hashed += len(part)
        if has_custom:
            digest.update(np.uint64(len(allocations)).astype("<u8").tobytes())
            for ptr, size in allocations:
                digest.update(np.uint64(size).astype("<u8").tobytes())
                digest.update(beton.read(ptr, size))
                hashed += size
        if hashed >= RELEASE_EVERY_BYTES:
            release_mapped(beton.mm)
            hashed = 0
    return digest.digest()


def _column(beton: BetonFile, info, positions: np.ndarray):
    """An (n, k) uint8 array of every position's canonical bytes, or a function (i, position, allocs) -> parts."""
    meta = beton.metadata[info.name][positions]
    return stored_kind(info, beton.path).digest_column(beton, info, positions, meta)
