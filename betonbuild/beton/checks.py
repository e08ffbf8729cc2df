"""The structural rules ffcv's Loader relies on, checked on a parsed .beton, each as {name, ok, detail}.

A file can parse (``betonbuild.beton.format`` bounds-checks every size and offset) and still break
the Loader: allocations that overlap, cross a page, or that no metadata pointer names. Each rule
below is one entry of the list ``structural_checks`` returns, in this order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from betonbuild.beton.format import (
    IMAGE_MODE_JPEG,
    IMAGE_MODE_RAW,
    PAYLOAD_TYPE_IDS,
    POINTER_TYPES,
    RGB_IMAGE_TYPE_ID,
    BetonFile,
    FieldInfo,
)
from betonbuild.beton.matching import MATCH_BLOCK, match_sorted, sort_allocations
from betonbuild.beton.runs import blocks, key_order_windows, release_every

_EMPTY_ALLOCATION_NOTE = (
    "ffcv's Loader mis-reads them: a size-0 allocation shares its pointer with the next allocation, "
    "so the sample's following field can come back corrupted"
)


def structural_checks(beton: BetonFile, allow_empty: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The layout rules ffcv's Loader relies on, each as {name, ok, detail}.

    ``allow_empty`` names bytes/json fields whose size-0 allocations are accepted (flagged, not failed).
    """
    inside = _Inside.of(beton)
    checks = [
        _data_region_aligned(beton),
        _allocations_in_file(beton, inside),
        _allocations_in_one_page(inside),
        _sample_ids(beton),
        _no_overlap(inside),
        _samples_on_one_page(inside),
        _metadata_pointers(beton),
        _no_empty_allocations(beton, allow_empty),
    ]
    beton.forget_sorted_table()  # not held through the reads that follow; sorted again if JPEG or custom reads need it
    return checks


def _check(name: str, ok: bool, detail: str, **extra) -> dict[str, Any]:
    return {"name": name, "ok": bool(ok), "detail": detail, **extra}


@dataclass(frozen=True)
class _Inside:
    """The allocations that lie inside the data region, and how many do not (and the first of those).

    Where every allocation is inside (any file a writer finished), ``ptr``, ``size`` and ``sample``
    are views of the memory-mapped table, and every check reads them in blocks or in key-order
    windows (``betonbuild.beton.runs``): no check holds a copy of a column, or sorts the table whole
    (they held up to ~60 bytes an allocation). A damaged file's inside allocations are copied."""

    outside: int
    first_outside: int
    ptr: np.ndarray
    size: np.ndarray
    sample: np.ndarray
    shift: np.uint64

    @classmethod
    def of(cls, beton: BetonFile) -> _Inside:
        table = beton.alloc_table
        ptr, size, sample = table["ptr"], table["size"], table["sample_id"]
        bounds = (np.uint64(beton.data_start), np.uint64(beton.alloc_table_ptr))
        outside, first = 0, -1
        for lo, hi in blocks(len(table), release=(beton.mm,)):
            bad = ~_inside(ptr[lo:hi], size[lo:hi], *bounds)
            if bad.any():
                first = lo + int(np.argmax(bad)) if first < 0 else first
                outside += int(bad.sum())
        if outside:
            mask = np.concatenate([_inside(ptr[lo:hi], size[lo:hi], *bounds) for lo, hi in blocks(len(table))])
            ptr, size, sample = ptr[mask], size[mask], sample[mask]
        return cls(outside, first, ptr, size, sample, np.uint64(beton.page_shift))

    def first_page(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        return self.ptr[lo:hi] >> self.shift

    def last_page(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        return (self.ptr[lo:hi] + np.maximum(self.size[lo:hi], np.uint64(1)) - np.uint64(1)) >> self.shift


def _inside(ptr: np.ndarray, size: np.ndarray, start: np.uint64, end: np.uint64) -> np.ndarray:
    """Which [ptr, ptr + size) lie in [start, end], with no overflow on hostile sizes."""
    mask = (ptr >= start) & (ptr <= end) & (size <= end)
    mask &= ptr <= end - np.where(mask, size, 0).astype(np.uint64)
    return mask


def _data_region_aligned(beton: BetonFile) -> dict[str, Any]:
    ps = beton.page_size
    if not len(beton.alloc_table):
        return _check("data_region_aligned", True, "no allocations: the file has no data pages")
    pages = (beton.alloc_table_ptr - beton.data_start) // ps if beton.alloc_table_ptr >= beton.data_start else 0
    aligned = (
        beton.data_start % ps == 0
        and beton.alloc_table_ptr >= beton.data_start
        and ((beton.alloc_table_ptr - beton.data_start) % ps == 0)
    )
    return _check(
        "data_region_aligned",
        aligned,
        f"data region [{beton.data_start}, {beton.alloc_table_ptr}): {pages} whole pages of {ps} bytes, "
        "at absolute multiples of the page size"
        if aligned
        else f"the data region [{beton.data_start}, {beton.alloc_table_ptr}) is not a whole number of "
        f"{ps}-byte pages starting at a multiple of the page size",
    )


def _allocations_in_file(beton: BetonFile, inside: _Inside) -> dict[str, Any]:
    table = beton.alloc_table
    n, outside, first = len(table), inside.outside, inside.first_outside
    return _check(
        "allocations_in_file",
        outside == 0,
        f"all {n} allocations lie inside the data region"
        if not outside
        else f"{outside} of {n} allocations lie outside the data region "
        f"(first: ptr {int(table['ptr'][first])}, size {int(table['size'][first])})",
    )


def _allocations_in_one_page(inside: _Inside) -> dict[str, Any]:
    crossing = sum(
        int((inside.first_page(lo, hi) != inside.last_page(lo, hi)).sum())
        for lo, hi in blocks(len(inside.ptr), release=(inside.ptr,))
    )
    return _check(
        "allocations_in_one_page",
        crossing == 0,
        "every allocation lies inside one page" if not crossing else f"{crossing} allocations cross a page boundary",
    )


def _sample_ids(beton: BetonFile) -> dict[str, Any]:
    sample, n = beton.alloc_table["sample_id"], np.uint64(beton.num_samples)
    beyond = sum(int((sample[lo:hi] >= n).sum()) for lo, hi in blocks(len(sample), release=(sample,)))
    return _check(
        "sample_ids",
        beyond == 0,
        f"every allocation belongs to one of the {beton.num_samples} samples"
        if not beyond
        else f"{beyond} allocations name a sample id beyond num_samples ({beton.num_samples})",
    )


def _no_overlap(inside: _Inside) -> dict[str, Any]:
    """Each allocation in pointer order (equal pointers in table order) starts at or after the end of the one before."""
    overlaps, end_before = 0, None
    for rows in key_order_windows(inside.ptr):
        sp, ss = inside.ptr[rows], inside.size[rows]
        if not len(sp):
            continue
        ends = sp + ss
        overlaps += int((sp[1:] < ends[:-1]).sum()) + int(end_before is not None and sp[0] < end_before)
        end_before = ends[-1]
    return _check(
        "no_overlap",
        overlaps == 0,
        "no two allocations overlap" if not overlaps else f"{overlaps} allocations overlap the one before them",
    )


def _samples_on_one_page(inside: _Inside) -> dict[str, Any]:
    split = 0
    for rows in key_order_windows(inside.sample):  # every sample's allocations in one window
        if not len(rows):
            continue
        ids, pg = inside.sample[rows], inside.ptr[rows] >> inside.shift
        starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        split += int((np.maximum.reduceat(pg, starts) != np.minimum.reduceat(pg, starts)).sum())
    return _check(
        "samples_on_one_page",
        split == 0,
        "each sample's allocations lie on one page"
        if not split
        else f"{split} samples have allocations on more than one page",
    )


def _metadata_pointers(beton: BetonFile) -> dict[str, Any]:
    """Every pointer field's pointers matched against the allocations of their samples, window by
    window of samples (``key_order_windows``: one window's allocations sorted, a few MiB at any size,
    where the whole table sorted by pointer held 32 bytes an allocation)."""
    fields = [_PointerField(beton, info) for info in beton.fields if info.type_id in POINTER_TYPES]
    if fields:
        table, done = beton.alloc_table, 0
        for count, rows in enumerate(key_order_windows(table["sample_id"])):
            if not len(rows):
                continue
            local = sort_allocations(table["ptr"][rows], table["sample_id"][rows], table["size"][rows])
            top = min(beton.num_samples, int(table["sample_id"][rows[-1]]) + 1)  # every allocation of these samples
            for field in fields:
                field.match(local, done, top)
            done = max(done, top)
            release_every((beton.mm,), count)
        none = tuple(np.zeros(0, dtype=np.uint64) for _ in range(3))
        for field in fields:
            field.match(none, done, beton.num_samples)  # samples with no allocation at all
    problems = [problem for field in fields for problem in field.problems()]
    return _check(
        "metadata_pointers",
        not problems,
        "every metadata pointer is an allocation of its own sample, of the size the metadata says"
        if not problems
        else "; ".join(problems),
    )


class _PointerField:
    """One field's pointers matched in blocks of samples, in sample order: its count of pointers that are
    no allocation of their sample, the first of them, and (raw images) sizes and modes."""

    def __init__(self, beton: BetonFile, info: FieldInfo):
        self.beton, self.info = beton, info
        self.pointers, self.sizes = beton.pointer_column(info), beton._size_or_none(info)
        self.missing, self.first, self.size_only = 0, -1, False
        self.images: list[tuple[str, str, int]] = []

    def match(self, local: tuple[np.ndarray, np.ndarray, np.ndarray], lo: int, hi: int) -> None:
        """Samples [lo, hi) against ``local`` (``sort_allocations`` of every allocation of those samples)."""
        for a in range(lo, hi, MATCH_BLOCK):
            b = min(hi, a + MATCH_BLOCK)
            rows = np.arange(a, b, dtype=np.uint64)
            found = match_sorted(local, self.pointers[a:b], rows, None if self.sizes is None else self.sizes[a:b])
            lost = found < 0
            if lost.any():
                if self.first < 0:
                    row = self.first = a + int(np.argmax(lost))
                    alone = np.array([row], dtype=np.uint64)
                    self.size_only = (
                        self.sizes is not None and match_sorted(local, self.pointers[row : row + 1], alone)[0] >= 0
                    )
                self.missing += int(lost.sum())
            elif self.info.type_id == RGB_IMAGE_TYPE_ID and not self.missing:
                self.images += _image_problems(self.beton, self.info, local[2][found], a)

    def problems(self) -> list[str]:
        info, row, missing = self.info, self.first, self.missing
        if not missing:
            return _merged(self.images) if info.type_id == RGB_IMAGE_TYPE_ID else []
        if self.size_only:
            return [
                f"field '{info.name}': sample {row}'s allocation at {int(self.pointers[row])} is not "
                f"{int(self.sizes[row])} bytes as its metadata says ({missing} such samples)"
            ]
        return [
            f"field '{info.name}': sample {row}'s pointer {int(self.pointers[row])} is not an allocation "
            f"of sample {row} ({missing} such samples)"
        ]


def _merged(problems: list[tuple[str, str, int]]) -> list[str]:
    """The image problems of every block, one line per kind: the first block's (a wrong size with the total count)."""
    first: dict[str, str] = {}
    counts: dict[str, int] = {}
    for kind, text, count in problems:
        first.setdefault(kind, text)
        counts[kind] = counts.get(kind, 0) + count
    return [text + (f" ({counts[kind]} such samples)" if kind == "wrong" else "") for kind, text in first.items()]


def _image_problems(beton: BetonFile, info: FieldInfo, sizes: np.ndarray, lo: int) -> list[tuple[str, str, int]]:
    """Raw images whose allocation is not width*height*3 bytes, and unknown image modes, among the
    samples from ``lo`` whose allocations have ``sizes``: (kind, message, count)."""
    problems = []
    column = beton.metadata[info.name][lo : lo + len(sizes)]
    raw = column["mode"] == IMAGE_MODE_RAW
    want = column["width"].astype(np.uint64) * column["height"].astype(np.uint64) * np.uint64(3)
    wrong = raw & (sizes != want)
    unknown = (column["mode"] != IMAGE_MODE_RAW) & (column["mode"] != IMAGE_MODE_JPEG)
    if wrong.any():
        row = int(np.argmax(wrong))
        text = f"field '{info.name}': sample {lo + row}'s raw image allocation is not {int(want[row])} bytes"
        problems.append(("wrong", text, int(wrong.sum())))
    if unknown.any():
        row = int(np.argmax(unknown))
        text = f"field '{info.name}': sample {lo + row} has unknown image mode {int(column['mode'][row])}"
        problems.append(("unknown", text, int(unknown.sum())))
    return problems


def _zeros(column: np.ndarray) -> int:
    return sum(int((column[lo:hi] == 0).sum()) for lo, hi in blocks(len(column), release=(column,)))


def _no_empty_allocations(beton: BetonFile, allow_empty: tuple[str, ...]) -> dict[str, Any]:
    empty = _zeros(beton.alloc_table["size"])
    if not empty:
        return _check("no_empty_allocations", True, "no size-0 allocations")
    allowed = 0
    per_field = {}
    for info in beton.fields:
        if info.type_id in PAYLOAD_TYPE_IDS:
            count = _zeros(beton.metadata[info.name]["size"])
            if count:
                per_field[info.name] = count
                if info.name in allow_empty:
                    allowed += count
    where = ", ".join(f"'{k}': {v}" for k, v in per_field.items()) or "no bytes/json field"
    return _check(
        "no_empty_allocations",
        empty <= allowed,
        f"{empty} size-0 allocations ({where}){' allowed by allow_empty' if empty <= allowed else ''}; "
        f"{_EMPTY_ALLOCATION_NOTE}",
        flagged=empty,
    )
