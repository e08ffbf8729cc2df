"""The writer holds no Python object per sample, and writes the bytes plain ffcv writes."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from betonbuild.config.load import load_config
from betonbuild.mapped_pages import shared_array
from betonbuild.write import beton_writer
from betonbuild.write.workplan import WorkPlan
from betonbuild.write.writer import write_beton


class Rows:
    """ndarray + int + a json value whose size varies, so samples straddle pages (ffcv's retry)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        i = int(i)
        blob = {"i": i, "pad": "x" * ((i * 7919) % 3000)}
        return np.full(4, i, dtype=np.float32), i * 3, blob


def rows_spec(chunksize: int):
    return load_config(
        {
            "datasets": {
                "d": {
                    "source": {"kind": "python", "factory": "x:y"},
                    "fields": {
                        "x": {"type": "ndarray", "dtype": "float32", "shape": [4]},
                        "y": {"type": "int"},
                        "meta": {"type": "json"},
                    },
                    "writer": {"chunksize": chunksize, "page_size": "2MiB"},
                }
            }
        }
    ).datasets["d"]


def plain_ffcv(path: Path, order: np.ndarray, chunksize: int) -> None:
    from ffcv.fields import IntField, JSONField, NDArrayField
    from ffcv.writer import DatasetWriter

    fields = {"x": NDArrayField(dtype=np.dtype("float32"), shape=(4,)), "y": IntField(), "meta": JSONField()}
    writer = DatasetWriter(str(path), fields, page_size=1 << 21, num_workers=1)
    writer.from_indexed_dataset(Rows(len(order)), indices=order, chunksize=chunksize)


@pytest.mark.parametrize("chunksize", [1, 37])
def test_one_worker_writes_the_bytes_plain_ffcv_writes(tmp_path: Path, monkeypatch, chunksize: int):
    # records moved to the worker's file every 5 allocations: many moves, some next to page retries;
    # the table's (and the order's) pages released every 7 samples, and copied into the file 3 pages at a time
    monkeypatch.setattr(beton_writer, "ALLOCATIONS_PER_FLUSH", 5)
    monkeypatch.setattr(beton_writer, "RELEASE_EVERY", 7)
    monkeypatch.setattr(beton_writer, "TABLE_BLOCK", 3 * 4096 + 40)
    order = np.random.default_rng(3).permutation(3000)
    plain_ffcv(tmp_path / "plain.beton", order, chunksize)
    # the order in shared memory, as the workflow's full write has it: the worker drops its pages too
    write_beton(rows_spec(chunksize), Rows(3000), shared_array(order), tmp_path / "ours.beton", num_workers=1)
    plain, ours = ((tmp_path / f"{side}.beton").read_bytes() for side in ("plain", "ours"))
    assert len(plain) > 3 << 21, "the samples fill several pages"
    assert hashlib.sha256(ours).hexdigest() == hashlib.sha256(plain).hexdigest()


def test_two_workers_write_every_sample_and_allocation_once(tmp_path: Path, monkeypatch):
    from betonbuild.beton.format import BetonFile

    monkeypatch.setattr(beton_writer, "ALLOCATIONS_PER_FLUSH", 64)
    order = np.arange(5000)[::-1].copy()
    write_beton(rows_spec(10), Rows(5000), order, tmp_path / "two.beton", num_workers=2)
    beton = BetonFile(str(tmp_path / "two.beton"))
    table = beton.alloc_table
    assert sorted(table["sample_id"].tolist()) == sorted(list(range(5000)) * 2), "x and meta: one record each"
    assert np.array_equal(beton.metadata["y"], order * 3)


def rss_shmem_kib() -> int:
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("RssShmem:")))


def test_released_table_pages_leave_the_rss_and_keep_their_content():
    from multiprocessing import shared_memory

    block = shared_memory.SharedMemory(create=True, size=64 << 20)
    try:
        table = np.frombuffer(block.buf, dtype=np.uint32)
        table[:] = np.arange(table.size, dtype=np.uint32)  # every page touched
        touched = rss_shmem_kib()
        beton_writer.release_table_pages(block)
        assert rss_shmem_kib() < touched - 60_000, "the 64 MiB left this process's RSS"
        assert np.array_equal(table, np.arange(table.size, dtype=np.uint32)), "and kept their content"
        beton_writer.release_table_pages(block, 4096 * 5, 100)  # a part of one page, mid-table
        assert int(table[4096 * 5 // 4]) == 4096 * 5 // 4
        del table
    finally:
        block.close()
        block.unlink()


def test_a_plan_by_group_is_the_plan_of_the_groups_lists():
    """``by_group`` (webdataset's shards, from arrays) cuts the items the lists of pairs cut: one per
    group, in the order the groups first appear, each in the order's order."""
    rng = np.random.default_rng(5)
    order = rng.permutation(5000).astype(np.int64)
    shard_of = order // 37  # shards of 37 samples, visited in a shuffled order
    lists: dict[int, list[tuple[int, int]]] = {}
    for dest, (index, shard) in enumerate(zip(order.tolist(), shard_of.tolist())):
        lists.setdefault(shard, []).append((dest, index))
    plan, expected = WorkPlan.by_group(order, shard_of), WorkPlan.groups(list(lists.values()))
    for column in ("sources", "bounds", "destinations"):
        assert getattr(plan, column).dtype == np.int64
        assert np.array_equal(getattr(plan, column), getattr(expected, column)), column
    assert WorkPlan.groups(plan) is plan
    assert WorkPlan.by_group(np.zeros(0, np.int64), np.zeros(0, np.int64)).num_items == 0


def test_work_items_of_groups_become_two_int64_columns():
    plan = WorkPlan.groups([[(0, 7), (1, 8)], [], [(2, 3)]])
    assert plan.num_items == 3 and plan.num_samples == 3
    assert [(list(d), s.tolist()) for d, s in (plan.item(k) for k in range(3))] == [
        ([0, 1], [7, 8]),
        ([], []),
        ([2], [3]),
    ]
    even = WorkPlan.even(np.array([5, 4, 3, 2, 1]), 2)
    assert [(list(d), s.tolist()) for d, s in (even.item(k) for k in range(even.num_items))] == [
        ([0, 1], [5, 4]),
        ([2, 3], [3, 2]),
        ([4], [1]),
    ]


PEAK = textwrap.dedent(
    """
    import json, resource, sys
    import numpy as np
    from betonbuild.config.load import load_config
    from betonbuild.write.writer import write_beton
    import ffcv.writer  # imported before the baseline: torch and numba are a constant

    n = int(sys.argv[2])
    column = np.zeros((n, 4), dtype=np.float32)

    class Rows:
        def __len__(self):
            return n

        def __getitem__(self, i):
            return column[i], 1

    spec = load_config({"datasets": {"d": {
        "source": {"kind": "python", "factory": "x:y"},
        "fields": {"x": {"type": "ndarray", "dtype": "float32", "shape": [4]}, "y": {"type": "int"}},
        "writer": {"chunksize": 100},
    }}}).datasets["d"]
    order = np.arange(n)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    write_beton(spec, Rows(), order, sys.argv[1], num_workers=2)
    parent = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(json.dumps({"parent_kib": parent, "worker_kib": workers}))
    """
)


@pytest.mark.slow
def test_memory_per_extra_sample_is_what_the_format_needs(tmp_path: Path):
    """Two sizes in fresh processes: the growth per extra sample stays near the format's own
    (metadata record 16 bytes, in shared memory that the parent copies to the file) plus the order
    (8 bytes) and the source column (16); ffcv's own writer grows by ~490 bytes a sample."""
    peaks = {}
    for n in (200_000, 600_000):
        done = subprocess.run(
            [sys.executable, "-c", PEAK, str(tmp_path / f"{n}.beton"), str(n)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr
        peaks[n] = json.loads(done.stdout.strip().splitlines()[-1])
        (tmp_path / f"{n}.beton").unlink()
    extra = 400_000
    parent = (peaks[600_000]["parent_kib"] - peaks[200_000]["parent_kib"]) * 1024 / extra
    worker = (peaks[600_000]["worker_kib"] - peaks[200_000]["worker_kib"]) * 1024 / extra
    assert parent < 100, f"parent grows by {parent:.0f} bytes a sample ({peaks})"
    assert worker < 100, f"a worker grows by {worker:.0f} bytes a sample ({peaks})"


def test_the_plan_of_10000_shards_holds_no_python_object_per_sample():
    """webdataset's work items at a million samples in 10,000 shards: numpy arrays (peak < 64 bytes a
    sample; the list of (destination, index) tuples it replaces held about 130)."""
    from betonbuild.sources.webdataset import WebDatasetSource  # why: only this test reads a webdataset source

    class TenThousandShards:
        offsets = np.arange(0, 1_000_001, 100)

    rows = np.random.default_rng(1).permutation(1_000_000).astype(np.int64)
    tracemalloc.start()
    plan = WebDatasetSource.work_items(TenThousandShards(), rows)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert plan.num_items == 10_000 and plan.num_samples == 1_000_000
    assert peak < 64 * 1_000_000
    destinations, sources = plan.item(0)
    assert (sources // 100 == sources[0] // 100).all() and np.array_equal(rows[destinations], sources)
