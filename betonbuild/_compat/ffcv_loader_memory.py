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
Inside it too, the Reader maps its metadata and allocation table (read-only, as its ``fromfile``
copies are) instead of reading them whole: 40 bytes a sample of float32[4] + int64 were copied into
the Loader's process (4 GB at 100M rows) for a batch of 16; mapped, only the pages read are resident.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import numpy as np

from betonbuild._compat import Checked

CHECKED = (
    Checked(
        "ffcv",
        "1.0.2",
        why="MemoryManager.__init__'s per-sample dict and sets skipped for the OS-cache manager, which never "
        "reads them: the Loader batch of a 2M-row file peaked at 1.4 GB, ~600 bytes a sample; Reader.read_metadata "
        "and read_allocation_table (np.fromfile of the whole tables, read-only) mapped instead",
    ),
)
_SELECT_BLOCK = 1 << 18  # allocation-table rows scanned at once for the batch's samples


@contextlib.contextmanager
def lean_os_cache(samples: int) -> Iterator[None]:
    """Inside: ``Loader(..., os_cache=True)`` builds the lean OS-cache manager for a Loader that reads
    samples 0..samples-1 only (see the module docstring)."""
    import ffcv.loader.loader as loader_module
    from ffcv.memory_managers.os_cache import OSCacheContext, OSCacheManager
    from ffcv.reader import Reader
    from ffcv.types import ALLOC_TABLE_TYPE

    class LeanOSCacheManager(OSCacheManager):
        def __init__(self, reader):  # no super().__init__(): skipping it is the point
            self.reader = reader
            table = reader.alloc_table
            keep = [
                np.flatnonzero(table["sample_id"][lo : lo + _SELECT_BLOCK] < np.uint64(samples)) + lo
                for lo in range(0, len(table), _SELECT_BLOCK)
            ]
            alloc_table = table[np.concatenate(keep)] if keep else table[:0].copy()
            reader.alloc_table = alloc_table  # the mapping of the whole table is dropped with the last view
            order = np.argsort(alloc_table["ptr"])  # as ffcv's: the same sort, the same tie order
            self.ptrs = alloc_table["ptr"][order]
            self.sizes = alloc_table["size"][order]
            self.context = OSCacheContext(self)

    def read_metadata(reader):
        offset = reader.header.dtype.itemsize + reader.field_descriptors.nbytes
        reader.metadata = _mapped(reader._fname, offset, reader.metadata_type, int(reader.num_samples))

    def read_allocation_table(reader):
        offset = int(reader.header["alloc_table_ptr"])
        reader.alloc_table = _mapped(reader._fname, offset, np.dtype(ALLOC_TABLE_TYPE), None)

    saved = loader_module.OSCacheManager, Reader.read_metadata, Reader.read_allocation_table
    loader_module.OSCacheManager = LeanOSCacheManager
    Reader.read_metadata, Reader.read_allocation_table = read_metadata, read_allocation_table
    try:
        yield
    finally:
        loader_module.OSCacheManager, Reader.read_metadata, Reader.read_allocation_table = saved


def _mapped(path: str, offset: int, dtype: np.dtype, count: int | None) -> np.ndarray:
    """``count`` records (None: as many as fit) of ``dtype`` from byte ``offset``, read-only, as
    ``np.fromfile(path, dtype, count, offset=offset)`` with ``setflags(write=False)`` reads them."""
    fit = max(0, (os.path.getsize(path) - offset) // dtype.itemsize)
    count = fit if count is None else min(count, fit)
    if count == 0:
        empty = np.zeros(0, dtype=dtype)
        empty.setflags(write=False)
        return empty
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(count,)).view(np.ndarray)
