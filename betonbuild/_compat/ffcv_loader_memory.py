"""ffcv's Loader without the per-sample dict and sets its memory manager builds and never reads.

ffcv 1.0.2's ``MemoryManager.__init__`` builds ``ptr_to_size`` (a dict entry per allocation) and
``sample_to_pages`` / ``page_to_samples`` (a set per sample and per page) for every sample of the
file, whatever the Loader reads: measured 2M rows of float32[4] + int, the Loader batch's process
peaked at 1.4 GB (~600 bytes a sample, 12 GB at 20M rows), for a batch of 16 samples. The OS-cache
manager reads through its sorted ``ptrs`` and ``sizes`` alone (its compiled ``read``: a
``searchsorted`` over ``ptrs``); the SEQUENTIAL order the verification batch uses reads neither
mapping (only QUASI_RANDOM reads ``page_to_samples``, ``ProcessCacheManager`` ``sample_to_pages``).
``lean_os_cache(samples)`` makes the Loaders created inside it use an ``OSCacheManager`` whose
constructor builds ``ptrs`` and ``sizes`` as ffcv's does, from the allocations of the samples the
Loader will read (ids below ``samples``) and nothing else, and lets the Reader's copy of the whole
allocation table go (the memory managers are its only readers); ffcv's reading code is unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np

from betonbuild._compat import Checked

CHECKED = (
    Checked(
        "ffcv",
        "1.0.2",
        why="MemoryManager.__init__'s per-sample dict and sets skipped for the OS-cache manager, which never "
        "reads them: the Loader batch of a 2M-row file peaked at 1.4 GB, ~600 bytes a sample",
    ),
)


@contextlib.contextmanager
def lean_os_cache(samples: int) -> Iterator[None]:
    """Inside: ``Loader(..., os_cache=True)`` builds the lean OS-cache manager for a Loader that reads
    samples 0..samples-1 only (see the module docstring)."""
    import ffcv.loader.loader as loader_module
    from ffcv.memory_managers.os_cache import OSCacheContext, OSCacheManager

    class LeanOSCacheManager(OSCacheManager):
        def __init__(self, reader):  # no super().__init__(): skipping it is the point
            self.reader = reader
            alloc_table = reader.alloc_table[reader.alloc_table["sample_id"] < np.uint64(samples)]
            reader.alloc_table = alloc_table
            order = np.argsort(alloc_table["ptr"])  # as ffcv's: the same sort, the same tie order
            self.ptrs = alloc_table["ptr"][order]
            self.sizes = alloc_table["size"][order]
            self.context = OSCacheContext(self)

    original = loader_module.OSCacheManager
    loader_module.OSCacheManager = LeanOSCacheManager
    try:
        yield
    finally:
        loader_module.OSCacheManager = original
