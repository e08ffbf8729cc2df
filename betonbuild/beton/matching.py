"""Allocations looked up by (pointer, sample[, size]) in a copy of the allocation table sorted by pointer.

The reader sorts its whole table once (``BetonFile._sorted_table``, for JPEG sizes and custom fields);
the structural checks sort one window of samples at a time (``betonbuild.beton.runs``).
"""

from __future__ import annotations

import numpy as np

MATCH_BLOCK = 1 << 18  # pointers matched at once by match_sorted
MAX_EQUAL_POINTERS = 4  # allocations sharing one pointer (size-0 ones collide with the next) searched per lookup


def sort_allocations(
    ptr: np.ndarray, sample: np.ndarray, size: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ptr, sample_id, size) of allocations sorted by pointer, sample, size: what ``match_sorted`` searches."""
    order = np.lexsort((size, sample, ptr))
    return ptr[order], sample[order], size[order]


def match_sorted(
    table: tuple[np.ndarray, np.ndarray, np.ndarray],
    ptrs: np.ndarray,
    samples: np.ndarray,
    sizes: np.ndarray | None = None,
) -> np.ndarray:
    """Index (into ``table``, from ``sort_allocations``) of the allocation of each (ptr, sample[, size]); -1 where none.

    Without ``sizes`` the largest of equal (ptr, sample) allocations is taken: a size-0 allocation
    shares its pointer with the next allocation, and a JPEG is never empty.
    """
    sorted_ptr, sorted_sample, sorted_size = table
    ptrs = np.asarray(ptrs, dtype=np.uint64)
    samples = np.asarray(samples, dtype=np.uint64)
    found = np.full(len(ptrs), -1, dtype=np.int64)
    n = len(sorted_ptr)
    if n == 0 or len(ptrs) == 0:
        return found
    for lo in range(0, len(ptrs), MATCH_BLOCK):  # blocks: the temporaries stay a few MiB at any size
        block = slice(lo, lo + MATCH_BLOCK)
        want_ptr, want_sample, out = ptrs[block], samples[block], found[block]
        want_size = None if sizes is None else np.asarray(sizes)[block]
        start = np.searchsorted(sorted_ptr, want_ptr, side="left")
        for k in range(MAX_EQUAL_POINTERS):
            at = np.minimum(start + k, n - 1)
            hit = (start + k < n) & (sorted_ptr[at] == want_ptr) & (sorted_sample[at] == want_sample)
            if want_size is not None:
                hit &= sorted_size[at] == want_size
                out[:] = np.where(hit & (out < 0), at, out)
            else:
                out[:] = np.where(hit, at, out)
    return found
