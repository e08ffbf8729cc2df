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
    MATCH_BLOCK,
    PAYLOAD_TYPE_IDS,
    POINTER_TYPES,
    RGB_IMAGE_TYPE_ID,
    BetonFile,
    FieldInfo,
)

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
    """The allocations that lie inside the data region (``mask`` over the table), and their pages.

    Where every allocation is inside (any file a writer finished), ``ptr``, ``size`` and ``sample``
    are views of the memory-mapped table, and the pages are computed by the checks that need them
    and dropped: a file's checks hold no copy of its table longer than one check (at 1 allocation
    a sample, 41 bytes a sample were held through all of them)."""

    mask: np.ndarray
    ptr: np.ndarray
    size: np.ndarray
    sample: np.ndarray
    shift: np.uint64

    @classmethod
    def of(cls, beton: BetonFile) -> _Inside:
        table = beton.alloc_table
        ptr, size = table["ptr"], table["size"]
        end = np.uint64(beton.alloc_table_ptr)
        mask = (ptr >= np.uint64(beton.data_start)) & (ptr <= end) & (size <= end)
        mask &= ptr <= end - np.where(mask, size, 0).astype(np.uint64)  # no overflow on hostile sizes
        sample = table["sample_id"]
        if not mask.all():
            ptr, size, sample = ptr[mask], size[mask], sample[mask]
        return cls(mask, ptr, size, sample, np.uint64(beton.page_shift))

    def first_page(self) -> np.ndarray:
        return self.ptr >> self.shift

    def last_page(self) -> np.ndarray:
        return (self.ptr + np.maximum(self.size, np.uint64(1)) - np.uint64(1)) >> self.shift


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
    n = len(table)
    outside = int(n - inside.mask.sum())
    return _check(
        "allocations_in_file",
        outside == 0,
        f"all {n} allocations lie inside the data region"
        if not outside
        else f"{outside} of {n} allocations lie outside the data region "
        f"(first: ptr {int(table['ptr'][~inside.mask][0])}, size {int(table['size'][~inside.mask][0])})",
    )


def _allocations_in_one_page(inside: _Inside) -> dict[str, Any]:
    crossing = int((inside.first_page() != inside.last_page()).sum())
    return _check(
        "allocations_in_one_page",
        crossing == 0,
        "every allocation lies inside one page" if not crossing else f"{crossing} allocations cross a page boundary",
    )


def _sample_ids(beton: BetonFile) -> dict[str, Any]:
    beyond = int((beton.alloc_table["sample_id"] >= np.uint64(beton.num_samples)).sum())
    return _check(
        "sample_ids",
        beyond == 0,
        f"every allocation belongs to one of the {beton.num_samples} samples"
        if not beyond
        else f"{beyond} allocations name a sample id beyond num_samples ({beton.num_samples})",
    )


def _no_overlap(inside: _Inside) -> dict[str, Any]:
    overlaps = 0
    if len(inside.ptr) > 1:
        order = np.argsort(inside.ptr, kind="stable")
        sp, ss = inside.ptr[order], inside.size[order]
        del order
        overlaps = int((sp[1:] < sp[:-1] + ss[:-1]).sum())
    return _check(
        "no_overlap",
        overlaps == 0,
        "no two allocations overlap" if not overlaps else f"{overlaps} allocations overlap the one before them",
    )


def _samples_on_one_page(inside: _Inside) -> dict[str, Any]:
    split = 0
    if len(inside.sample):
        first_page = inside.first_page()
        by_sample = np.lexsort((first_page, inside.sample))
        ids, pg = inside.sample[by_sample], first_page[by_sample]
        del first_page, by_sample
        starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        split = int((np.maximum.reduceat(pg, starts) != np.minimum.reduceat(pg, starts)).sum())
    return _check(
        "samples_on_one_page",
        split == 0,
        "each sample's allocations lie on one page"
        if not split
        else f"{split} samples have allocations on more than one page",
    )


def _metadata_pointers(beton: BetonFile) -> dict[str, Any]:
    problems = []
    for info in beton.fields:
        if info.type_id in POINTER_TYPES:
            problems += _pointer_problems(beton, info)
    return _check(
        "metadata_pointers",
        not problems,
        "every metadata pointer is an allocation of its own sample, of the size the metadata says"
        if not problems
        else "; ".join(problems),
    )


def _pointer_problems(beton: BetonFile, info: FieldInfo) -> list[str]:
    """One field's pointers matched against the table in blocks of samples: the temporaries (rows,
    sizes, matches) stay a few MiB at any size (whole columns of them were 32 bytes a sample)."""
    pointers, sizes = beton.pointer_column(info), beton._size_or_none(info)
    missing, first, problems = 0, -1, []
    for lo in range(0, beton.num_samples, MATCH_BLOCK):
        hi = min(beton.num_samples, lo + MATCH_BLOCK)
        rows = np.arange(lo, hi, dtype=np.uint64)
        found = beton.match_allocations(pointers[lo:hi], rows, None if sizes is None else sizes[lo:hi])
        lost = found < 0
        if lost.any():
            missing += int(lost.sum())
            first = lo + int(np.argmax(lost)) if first < 0 else first
        elif info.type_id == RGB_IMAGE_TYPE_ID and not missing:
            problems += _image_problems(beton, info, found, lo)
    if info.type_id == RGB_IMAGE_TYPE_ID:
        problems = _merged(problems)
    if not missing:
        return problems
    row, at = first, slice(first, first + 1)
    if sizes is not None and beton.match_allocations(pointers[at], np.array([row], dtype=np.uint64))[0] >= 0:
        return [
            f"field '{info.name}': sample {row}'s allocation at {int(pointers[row])} is not "
            f"{int(sizes[row])} bytes as its metadata says ({missing} such samples)"
        ]
    return [
        f"field '{info.name}': sample {row}'s pointer {int(pointers[row])} is not an allocation "
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


def _image_problems(beton: BetonFile, info: FieldInfo, found: np.ndarray, lo: int) -> list[tuple[str, str, int]]:
    """Raw images whose allocation is not width*height*3 bytes, and unknown image modes, among the
    samples from ``lo`` that ``found`` matched: (kind, message, count)."""
    problems = []
    column = beton.metadata[info.name][lo : lo + len(found)]
    raw = column["mode"] == IMAGE_MODE_RAW
    want = column["width"].astype(np.uint64) * column["height"].astype(np.uint64) * np.uint64(3)
    wrong = raw & (beton._sorted_table[2][found] != want)
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


def _no_empty_allocations(beton: BetonFile, allow_empty: tuple[str, ...]) -> dict[str, Any]:
    empty = int((beton.alloc_table["size"] == 0).sum())
    if not empty:
        return _check("no_empty_allocations", True, "no size-0 allocations")
    allowed = 0
    per_field = {}
    for info in beton.fields:
        if info.type_id in PAYLOAD_TYPE_IDS:
            count = int((beton.metadata[info.name]["size"] == 0).sum())
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
