"""Unit tests of betonbuild.workflow.resources: every rule's mem_mb and runtime, before and after the
source manifest exists, and the sample count it starts from (``config.spec.count_indices``).

The pinned numbers are what rules/resources.smk computed before its logic moved into the library.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from betonbuild.config.load import load_config
from betonbuild.config.spec import DatasetSpec, WriterSpec, count_indices, resolve_indices
from betonbuild.errors import SourceError
from betonbuild.sources import gathers_fixed_values_one_by_one, source_class
from betonbuild.workflow import resources

N = 50  # rows of the test arrays
INDICES = [None, [3, 1, 4, 1, 5], "3:", ":7", "2:40:3", "::4", " 1 : 8 : 2 ", "0:50", "49:"]


def spec_of(source: dict, fields: dict, **entry) -> DatasetSpec:
    return load_config({"datasets": {"d": {"source": source, "fields": fields, **entry}}}).datasets["d"]


@pytest.fixture
def npz(tmp_path: Path) -> Path:
    path = tmp_path / "digits.npz"
    np.savez(path, images=np.zeros((N, 8, 8), np.uint8), target=np.arange(N, dtype=np.int64))
    return path


@pytest.fixture
def npy_columns(tmp_path: Path) -> dict[str, str]:
    np.save(tmp_path / "images.npy", np.zeros((N, 25, 25), np.float32))
    np.save(tmp_path / "labels.npy", np.arange(N, dtype=np.int64))
    return {"image": str(tmp_path / "images.npy"), "label": str(tmp_path / "labels.npy")}


def digits(npz: Path, **entry) -> DatasetSpec:
    return spec_of(
        {"kind": "arrays", "path": str(npz), "columns": {"image": "images", "label": "target"}},
        {"image": {"type": "ndarray", "dtype": "uint8", "shape": [8, 8]}, "label": {"type": "int"}},
        **entry,
    )


def wine(**entry) -> DatasetSpec:
    """A python source (never opened here): its length is unknown before its manifest exists."""
    return spec_of(
        {"kind": "python", "factory": "adapters.tables:wine_table"},
        {
            "features": {"type": "ndarray", "dtype": "float32", "shape": [13]},
            "label": {"type": "int"},
            "meta": {"type": "json"},
        },
        **entry,
    )


def photos(root: Path, **entry) -> DatasetSpec:
    return spec_of(
        {"kind": "image_folder", "root": str(root)},
        {"image": {"type": "rgb_image", "write_mode": "jpg", "max_resolution": 128}, "label": {"type": "int"}},
        **entry,
    )


def manifest(num_samples: int, nbytes: int, parts: list[int]) -> dict:
    return {
        "num_samples": num_samples,
        "inputs": {"bytes": nbytes},
        "partitions": [{"num_samples": n} for n in parts],
    }


BIG = manifest(10_000_000, 40 << 30, [2_500_000] * 4)


# --- count_indices, next to resolve_indices ------------------------------------------------------


def writer(indices) -> WriterSpec:
    return WriterSpec(num_workers=1, page_size=1 << 23, chunksize=100, indices=indices, shuffle=True, seed=0)


@pytest.mark.parametrize("indices", INDICES)
def test_count_indices_equals_the_length_of_the_resolved_order(indices):
    assert count_indices(writer(indices), N) == len(resolve_indices(writer(indices), N, "d"))


def test_a_range_past_the_end_is_counted_to_the_end_where_resolve_indices_refuses_it():
    assert count_indices(writer("10:1000"), N) == N - 10
    assert count_indices(writer("10:1000:7"), N) == len(range(10, N, 7))
    assert count_indices(writer("60:"), N) == 0


# --- the number of samples -------------------------------------------------------------------------


@pytest.mark.parametrize("indices", INDICES)
def test_an_npz_source_is_counted_from_its_headers_before_the_manifest(npz, indices):
    spec = digits(npz, writer={"indices": indices})
    assert resources.num_samples(spec, None) == len(resolve_indices(spec.writer, N, "d"))


@pytest.mark.parametrize("indices", INDICES)
def test_npy_columns_are_counted_from_their_headers(npy_columns, indices):
    spec = spec_of(
        {"kind": "arrays", "columns": npy_columns},
        {"image": {"type": "ndarray", "dtype": "float32", "shape": [25, 25]}, "label": {"type": "int"}},
        writer={"indices": indices},
    )
    assert resources.num_samples(spec, None) == len(resolve_indices(spec.writer, N, "d"))


def test_an_image_folder_is_counted_by_its_files(tmp_path):
    for name, count in (("a", 3), ("b", 4)):
        (tmp_path / name).mkdir()
        for k in range(count):
            Image.new("RGB", (4, 4)).save(tmp_path / name / f"{k}.png")
    assert resources.num_samples(photos(tmp_path), None) == 7
    assert resources.num_samples(photos(tmp_path, writer={"indices": "1::2"}), None) == 3


def test_the_manifest_wins_once_it_exists(npz):
    assert resources.num_samples(digits(npz, writer={"indices": "3:"}), manifest(12, 0, [12])) == 12


def test_an_unknown_length_is_a_million_whatever_the_indices(tmp_path):
    assert resources.num_samples(wine(), None) == resources.UNKNOWN_LENGTH == 1_000_000
    assert resources.num_samples(wine(writer={"indices": [1, 2]}), None) == 1_000_000
    missing = digits(tmp_path / "missing.npz")
    assert resources.num_samples(missing, None) == 1_000_000


def test_read_manifest_is_none_until_the_file_exists(tmp_path):
    path = tmp_path / "source.json"
    assert resources.read_manifest(None) is None
    assert resources.read_manifest(str(path)) is None
    path.write_text(json.dumps(BIG))
    assert resources.read_manifest(str(path)) == BIG


# --- sizes of one sample -----------------------------------------------------------------------------


def test_sizes_of_one_sample(npz, tmp_path):
    spec = digits(npz)
    assert resources.fixed_bytes(spec) == 64 + 8
    assert resources.decoded_bytes(spec) == 72
    assert resources.record_bytes(spec) == 16  # the ndarray's pointer and the int
    image_folder = photos(tmp_path)
    assert resources.fixed_bytes(image_folder) == 8
    assert resources.decoded_bytes(image_folder) == 8 + 3 * 128**2
    python = wine()
    assert resources.fixed_bytes(python) == 13 * 4 + 8
    assert resources.decoded_bytes(python) == 13 * 4 + 8 + python.writer.page_size  # json: one page
    assert resources.seconds_per_sample(python) == 0.002 + 0.0002 * 2
    assert resources.seconds_per_sample(image_folder) == 0.05 + 0.0002


def test_an_npz_is_resident_and_npy_columns_are_memory_mapped(npz, npy_columns):
    assert source_class(digits(npz)).resident_bytes(digits(npz)) == N * 64 + N * 8
    npy = spec_of(
        {"kind": "arrays", "columns": npy_columns},
        {"image": {"type": "ndarray", "dtype": "float32", "shape": [25, 25]}, "label": {"type": "int"}},
    )
    assert source_class(npy).resident_bytes(npy) == 0
    assert source_class(wine()).resident_bytes(wine()) == 0


def test_a_python_source_is_gathered_value_by_value(npz, tmp_path):
    assert gathers_fixed_values_one_by_one(wine())
    assert not gathers_fixed_values_one_by_one(digits(npz))
    assert not gathers_fixed_values_one_by_one(photos(tmp_path))


def test_write_threads_follow_num_workers_at_most_the_cores(npz):
    assert resources.write_threads(digits(npz, writer={"num_workers": -1}), 6) == 6
    assert resources.write_threads(digits(npz, writer={"num_workers": 3}), 6) == 3
    assert resources.write_threads(digits(npz, writer={"num_workers": 8}), 6) == 6


# --- per rule: the numbers rules/resources.smk gave ------------------------------------------------


def test_source_manifest(npz):
    assert resources.source_manifest_mem_mb(digits(npz), None) == 769
    # a python source's length is known only once the manifest job opened it: room for 32M samples
    assert resources.source_manifest_mem_mb(wine(), None, attempt=2) == 2 * (768 + 245)
    assert resources.source_manifest_mem_mb(digits(npz), BIG) == 845
    assert resources.source_manifest_runtime([str(npz), "/missing"]) == 11
    assert resources.source_manifest_runtime([]) == 10
    assert resources.source_manifest_runtime([], attempt=3) == 30


def test_the_manifest_job_refuses_a_source_longer_than_its_memory_was_declared_for():
    room = resources.source_manifest_mem_mb(wine(), None)
    resources.check_manifest_memory(wine(), resources.MANIFEST_ORDER_ROOM, room)  # fits
    with pytest.raises(SourceError) as info:
        resources.check_manifest_memory(wine(), 2 * 10**9, room)
    needed = 768 + 15259  # 2e9 samples x 8 bytes
    assert str(info.value) == (
        f"dataset 'd': the source has 2,000,000,000 samples: the source_manifest job needs about {needed:,} MB "
        f"for their order, more than the {room:,} MB it was given (mem_mb, estimated before the length was "
        f"known); run again as `snakemake <targets> --set-resources source_manifest:mem_mb={needed}` (the option "
        "last: it takes several values), or set it under set-resources in your profile, or select fewer samples "
        "with writer.indices"
    )
    resources.check_manifest_memory(wine(), 2 * 10**9, needed)  # the fix, followed
    resources.check_manifest_memory(wine(writer={"indices": "0:1000"}), 2 * 10**9, room)  # the other fix


def test_write(npz):
    spec = digits(npz)
    assert resources.write_mem_mb(spec, None, 2) == 1314
    assert resources.write_mem_mb(spec, BIG, 4) == 2086
    assert resources.write_mem_mb(spec, BIG, 4, attempt=2) == 2 * 2086
    assert resources.write_runtime(spec, None, 2) == 11
    assert resources.write_runtime(spec, BIG, 1) == 158
    assert resources.write_runtime(spec, BIG, 4) == 58
    assert resources.write_runtime(wine(), None, 2) == 51


def test_smoke(npz):
    assert resources.smoke_mem_mb(digits(npz), None) == 1042 + 1  # the whole order: 50 x 8 bytes
    assert resources.smoke_mem_mb(wine(), BIG) == 1042 + 77  # 10M x 8 bytes: drawn from, and surveyed
    assert resources.smoke_runtime(wine(smoke={"samples": 20_000}), BIG) == 14
    assert resources.smoke_runtime(digits(npz), None, attempt=2) == 22


def test_parts(npz):
    spec = digits(npz, partitions=4)
    assert resources.part_samples(spec, None, 0) == 13
    assert resources.part_samples(digits(npz, samples_per_partition=20), None, 1) == 20
    assert resources.part_samples(spec, BIG, 3) == 2_500_000
    assert resources.part_mem_mb(spec, BIG, 0) == 1099
    assert resources.part_runtime(spec, BIG, 0) == 47
    assert resources.part_runtime(wine(partitions=2), None, 1) == 51
    # 2.5M positions, all within one window: 8 flag bytes, the 16-byte record, the 72-byte row twice (the
    # file's payload and the source's) and the ndarray's 24-byte allocation each, over 768 + the order
    assert resources.part_verify_mem_mb(spec, BIG, 0) == 768 + 20 + 459
    assert resources.part_verify_mem_mb(wine(partitions=2), None, 0, attempt=2) == 2 * 1133


def test_merge(npz, tmp_path):
    # the order (10M x 8 bytes), and two blocks of 2^18 rows of the tables (16-byte record, one allocation)
    assert resources.merge_mem_mb(digits(npz), BIG) == 768 + 97
    assert resources.merge_mem_mb(wine(), None) == 816  # 1M x 8, and blocks of 32-byte records + 2 allocations
    part = tmp_path / "0.beton"
    with open(part, "wb") as fh:
        fh.truncate(3 << 30)
    assert resources.merge_runtime([str(part), str(part), "/missing"]) == 13
    assert resources.merge_runtime([], attempt=2) == 20


def test_verify(npz, tmp_path):
    spec = digits(npz)
    assert resources.verify_mem_mb(spec, None) == 770
    # 10M x (8 order + 8 flags), and a window of 4M positions' record, payload, source row and allocation
    assert resources.verify_mem_mb(spec, BIG) == 1625
    # a python source's fixed values are gathered 4096 rows at a time, no longer all at once
    assert resources.verify_mem_mb(wine(), None) == 1236
    beton = tmp_path / "d.beton"
    with open(beton, "wb") as fh:
        fh.truncate(5 << 30)
    assert resources.verify_runtime(spec, None, None, 2) == 11
    assert resources.verify_runtime(spec, BIG, str(beton), 4) == 146
    assert resources.verify_runtime(spec, BIG, "/missing.beton", 4) == 157  # the source's bytes instead
    assert resources.verify_runtime(wine(), None, None, 2) == 24
    assert resources.verify_runtime(wine(verify={"mode": "full"}), BIG, None, 2) == 557
    assert resources.verify_smoke_mem_mb(wine(), None) == 1026
    assert resources.verify_smoke_runtime(photos(tmp_path), manifest(64, 0, [64]), attempt=2) == 2 * 11


def test_demo_data():
    assert resources.demo_data_mem_mb(2) == 4096
    assert resources.demo_data_runtime(3) == 30
