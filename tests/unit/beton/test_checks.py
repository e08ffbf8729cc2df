"""Unit tests of betonbuild.beton.checks: a file ffcv wrote passes every structural check; each kind of
layout damage is found and named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from beton_files import PAGE_SIZE, corrupt_copy, metadata_offset, set_header, table_offset, write_every_field
from conftest import ListDataset

from betonbuild.beton import runs
from betonbuild.beton.checks import structural_checks
from betonbuild.beton.format import ALLOC_TABLE_TYPE, BetonFile


@pytest.fixture(autouse=True, params=["windows", "windows_of_3", "sorted_whole"])
def table_reading(request, monkeypatch):
    """Every check, read as a large file is (in key-order windows: here of 3 rows too, so a file of a few
    samples spans many) and as a table of too many runs is (sorted whole): the same results."""
    if request.param == "windows_of_3":
        monkeypatch.setattr(runs, "WINDOW", 3)
    elif request.param == "sorted_whole":
        monkeypatch.setattr(runs, "MAX_RUNS", 0)
    return request.param


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, list[tuple]]:
    return write_every_field(tmp_path_factory.mktemp("beton") / "all_fields.beton")


def structure(path: Path, **kwargs) -> dict[str, dict]:
    return {c["name"]: c for c in structural_checks(BetonFile(path), **kwargs)}


def test_a_file_written_by_ffcv_passes_every_structural_check(written):
    checks = structure(written[0])
    assert set(checks) == {
        "data_region_aligned",
        "allocations_in_file",
        "allocations_in_one_page",
        "sample_ids",
        "no_overlap",
        "samples_on_one_page",
        "metadata_pointers",
        "no_empty_allocations",
    }
    assert all(c["ok"] for c in checks.values()), checks


@pytest.mark.parametrize("grown", [0, 2])  # in windows of 3 rows, the third overlaps the next window's first
def test_overlapping_allocations_are_found(written, tmp_path: Path, grown):
    good = BetonFile(written[0])
    order = np.argsort(good.alloc_table["ptr"])
    first = int(order[grown])
    at = table_offset(good, first, "size")
    grown = int(good.alloc_table["size"][first]) + 100
    checks = structure(
        corrupt_copy(written, tmp_path, lambda d: d.__setitem__(slice(at, at + 8), np.uint64(grown).tobytes()))
    )
    assert not checks["no_overlap"]["ok"] and "1 allocations overlap" in checks["no_overlap"]["detail"]


def test_allocation_crossing_a_page_and_a_sample_split_over_two_pages_are_found(written, tmp_path: Path):
    good = BetonFile(written[0])
    entry = int(np.argmax(good.alloc_table["ptr"]))
    at = table_offset(good, entry, "ptr")
    moved = good.data_start + PAGE_SIZE - 4  # straddles the end of the first page

    def edit(data):
        data[at : at + 8] = np.uint64(moved).tobytes()
        data.extend(b"\0" * PAGE_SIZE)  # a second page, so the allocation stays inside the file
        table = bytes(data[good.alloc_table_ptr : good.size])
        data[good.alloc_table_ptr : good.alloc_table_ptr + PAGE_SIZE] = b"\0" * PAGE_SIZE
        data[good.alloc_table_ptr + PAGE_SIZE :] = table
        set_header(data, alloc_table_ptr=good.alloc_table_ptr + PAGE_SIZE)

    checks = structure(corrupt_copy(written, tmp_path, edit))
    assert not checks["allocations_in_one_page"]["ok"]
    assert "1 allocations cross a page boundary" in checks["allocations_in_one_page"]["detail"]
    assert not checks["metadata_pointers"]["ok"]  # the metadata still points at the old place


def test_sample_whose_allocations_lie_on_two_pages_is_found(written, tmp_path: Path):
    good = BetonFile(written[0])
    entry = int(np.argmax(good.alloc_table["ptr"]))
    at = table_offset(good, entry, "ptr")

    def edit(data):
        table = bytes(data[good.alloc_table_ptr : good.size])
        data[good.alloc_table_ptr :] = b"\0" * PAGE_SIZE + table
        moved_at = at + PAGE_SIZE
        data[moved_at : moved_at + 8] = np.uint64(good.alloc_table_ptr + 64).tobytes()  # onto the new page
        set_header(data, alloc_table_ptr=good.alloc_table_ptr + PAGE_SIZE)

    checks = structure(corrupt_copy(written, tmp_path, edit))
    assert not checks["samples_on_one_page"]["ok"]
    assert "1 samples have allocations on more than one page" in checks["samples_on_one_page"]["detail"]


def test_metadata_pointer_of_another_sample_is_found(written, tmp_path: Path):
    good = BetonFile(written[0])
    at = metadata_offset(good, "blob", 4, "ptr")
    other = good.metadata["blob"][5]["ptr"]
    checks = structure(
        corrupt_copy(written, tmp_path, lambda d: d.__setitem__(slice(at, at + 8), np.uint64(other).tobytes()))
    )
    detail = checks["metadata_pointers"]["detail"]
    assert not checks["metadata_pointers"]["ok"] and "field 'blob': sample 4's" in detail


def test_size_zero_allocations_are_flagged_and_fail_unless_their_field_allows_empty(tmp_path: Path):
    from ffcv.fields import BytesField, IntField
    from ffcv.writer import DatasetWriter

    path = tmp_path / "empty.beton"
    samples = [(np.frombuffer(b"ab" if i % 3 else b"", dtype=np.uint8), i) for i in range(6)]
    DatasetWriter(
        str(path), {"blob": BytesField(), "n": IntField()}, page_size=PAGE_SIZE, num_workers=1
    ).from_indexed_dataset(ListDataset(samples))
    strict = structure(path)["no_empty_allocations"]
    assert not strict["ok"] and strict["flagged"] == 2 and "2 size-0 allocations ('blob': 2)" in strict["detail"]
    assert "ffcv's Loader mis-reads them" in strict["detail"]
    allowed = structure(path, allow_empty=("blob",))["no_empty_allocations"]
    assert allowed["ok"] and allowed["flagged"] == 2 and "allowed by allow_empty" in allowed["detail"]
    assert structure(path)["metadata_pointers"]["ok"]  # the colliding pointers are still told apart


def test_the_table_in_any_order_passes_and_its_damage_is_still_found(written, tmp_path: Path):
    """Two writer workers append their allocations one after the other: the table is sorted runs, not
    one sorted table. Reversed, it is one run per allocation; every check reads it in key order."""
    good = BetonFile(written[0])
    n = len(good.alloc_table)
    order = np.r_[np.arange(1, n, 2), np.arange(0, n, 2)]  # two interleaved "workers"
    for rows in (order, np.arange(n)[::-1]):
        table = good.alloc_table[rows].tobytes()
        reordered = corrupt_copy(
            written, tmp_path, lambda d, t=table: d.__setitem__(slice(good.alloc_table_ptr, None), t)
        )
        checks = structure(reordered)
        assert all(c["ok"] for c in checks.values()), checks
        last = int(np.flatnonzero(rows == int(np.argmax(good.alloc_table["ptr"])))[0])
        at = good.alloc_table_ptr + last * ALLOC_TABLE_TYPE.itemsize + ALLOC_TABLE_TYPE.fields["sample_id"][1]
        before = int(good.alloc_table["sample_id"][rows[last]])

        def edit(d, at=at, table=table, before=before):
            d[good.alloc_table_ptr :] = table
            d[at : at + 8] = np.uint64((before + 1) % good.num_samples).tobytes()  # another sample's

        checks = structure(corrupt_copy(written, tmp_path, edit))
        assert not checks["metadata_pointers"]["ok"] and f"sample {before}'s" in checks["metadata_pointers"]["detail"]
