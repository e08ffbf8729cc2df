"""The pages of a memory-mapped file dropped from this process's resident set.

A read-only file mapping that a pass reads end to end (a .beton's allocation table or metadata, an
arrays source's ``.npy`` columns) keeps every page it touched mapped, and mapped file pages count in
the process's RSS: at 100M rows, gigabytes that no one reads again. ``madvise(MADV_DONTNEED)``
unmaps them; the pages stay in the page cache, and a later read maps them again (a minor fault),
so it is safe while other threads read the same mapping.
"""

from __future__ import annotations

import mmap

import numpy as np


def release_mapped(*arrays: np.ndarray) -> None:
    """Unmaps the pages of the file mapping each array (or a view of it) lies in; others are skipped."""
    for array in arrays:
        base = array
        while base is not None and not isinstance(base, mmap.mmap):
            base = getattr(base, "base", None)
        if base is not None and not base.closed:
            base.madvise(mmap.MADV_DONTNEED)
