"""The pages of a memory-mapped file (or of shared memory) dropped from this process's resident set.

A read-only file mapping that a pass reads end to end (a .beton's allocation table or metadata, an
arrays source's ``.npy`` columns) keeps every page it touched mapped, and mapped file pages count in
the process's RSS: at 100M rows, gigabytes that no one reads again. ``madvise(MADV_DONTNEED)``
unmaps them; the pages stay in the page cache, and a later read maps them again (a minor fault),
so it is safe while other threads read the same mapping.

Memory a process's forked workers read, such as the sample order, counts in every worker's RSS
once it has read it. Private memory inherited through fork cannot be dropped that way (a dropped
private page reads back as zeros); a copy in shared memory (``shared_array``) can, and its pages
stay in the one shared copy.
"""

from __future__ import annotations

import mmap

import numpy as np

# payload bytes a pass over a file's images reads between two unmappings of its pages: a count of
# samples would let a file of large images keep gigabytes mapped between two
RELEASE_EVERY_BYTES = 64 << 20


def release_mapped(*arrays: np.ndarray | None) -> None:
    """Unmaps the pages of the file (or shared) mapping each array (or a view of it) lies in; others,
    and None, are skipped."""
    for array in arrays:
        base = array
        while base is not None and not isinstance(base, mmap.mmap):  # np.frombuffer's base: a memoryview of it
            base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
        if base is not None and not base.closed:
            base.madvise(mmap.MADV_DONTNEED)


def shared_array(array: np.ndarray) -> np.ndarray:
    """A copy of ``array`` in shared anonymous memory (``MAP_SHARED``): processes forked after it read
    the same pages, and each may drop its view of them (``release_mapped``) without losing them."""
    mapping = mmap.mmap(-1, max(array.nbytes, 1))
    shared = np.frombuffer(mapping, dtype=array.dtype, count=array.size).reshape(array.shape)
    shared[...] = array
    return shared
