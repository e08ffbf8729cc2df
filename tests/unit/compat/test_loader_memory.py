"""betonbuild._compat.ffcv_loader_memory: inside ``lean_os_cache`` ffcv's Reader maps its tables (a
100M-row file's 4 GB are not copied into the Loader's process) and reads the same values."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import pytest

ffcv = pytest.importorskip("ffcv")
from conftest import ListDataset  # noqa: E402
from ffcv.fields import IntField, NDArrayField  # noqa: E402
from ffcv.loader import Loader, OrderOption  # noqa: E402
from ffcv.reader import Reader  # noqa: E402
from ffcv.writer import DatasetWriter  # noqa: E402

from betonbuild._compat.ffcv_loader_memory import lean_os_cache  # noqa: E402


def mapped(array: np.ndarray) -> bool:
    base = array
    while base is not None and not isinstance(base, mmap.mmap):
        base = getattr(base, "base", None)
    return base is not None


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("lean") / "rows.beton"
    rows = [(np.arange(4, dtype=np.float32) + i, i * 7) for i in range(300)]
    fields = {"x": NDArrayField(np.dtype("float32"), (4,)), "label": IntField()}
    DatasetWriter(str(path), fields, num_workers=2).from_indexed_dataset(ListDataset(rows), chunksize=10)
    return path


def test_the_reader_maps_its_tables_inside_and_reads_them_outside(written: Path):
    copied = Reader(str(written))
    with lean_os_cache(16):
        lean = Reader(str(written))
    assert mapped(lean.metadata) and mapped(lean.alloc_table)
    assert not lean.metadata.flags.writeable and not lean.alloc_table.flags.writeable
    assert lean.metadata.dtype == copied.metadata.dtype and np.array_equal(lean.metadata, copied.metadata)
    assert np.array_equal(lean.alloc_table, copied.alloc_table)
    assert not mapped(Reader(str(written)).metadata)  # restored after the block


def test_a_loader_batch_inside_reads_what_the_file_holds(written: Path):
    with lean_os_cache(16):
        loader = Loader(
            str(written),
            batch_size=16,
            num_workers=1,
            order=OrderOption.SEQUENTIAL,
            indices=list(range(16)),
            os_cache=True,
        )
    kept = loader.reader.alloc_table
    assert len(kept) == 16 and set(kept["sample_id"].tolist()) == set(range(16))  # the batch's allocations only
    x, label = next(iter(loader))
    assert np.array_equal(np.asarray(x), np.arange(4, dtype=np.float32)[None, :] + np.arange(16)[:, None])
    assert np.array_equal(np.asarray(label).ravel(), np.arange(16) * 7)
