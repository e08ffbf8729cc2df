"""Unit tests of betonbuild.beton.describe: the description behind ``betonbuild inspect`` (pages, bytes per
field, first samples) and its text rendering."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from beton_files import (
    FIELD_ORDER,
    NUM_SAMPLES,
    PAGE_SIZE,
    TITLES,
    corrupt_copy,
    descriptor_offset,
    metadata_offset,
    write_every_field,
    write_titles,
)

from betonbuild.beton import digest
from betonbuild.beton.describe import as_text, bytes_per_field, describe, describe_incomplete, page_usage
from betonbuild.beton.digest import content_digest
from betonbuild.beton.format import BetonFile, UnregisteredCustomField
from betonbuild.custom import FixedUTF8Field


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, list[tuple]]:
    return write_every_field(tmp_path_factory.mktemp("beton") / "all_fields.beton")


@pytest.fixture(scope="module")
def beton(written) -> BetonFile:
    return BetonFile(written[0])


def test_describe_reports_pages_fill_ratio_and_bytes_per_field(beton: BetonFile, written):
    info = describe(beton, samples=2)
    usage = page_usage(beton)
    assert usage["pages"] == 1 and usage["pages_used"] == 1 and usage["allocations"] == 6 * NUM_SAMPLES
    assert usage["allocated_bytes"] == int(beton.alloc_table["size"].sum())
    assert usage["fill_ratio"] == round(usage["allocated_bytes"] / PAGE_SIZE, 4)
    per_field = bytes_per_field(beton)
    assert per_field["emb"] == {"metadata": 8 * NUM_SAMPLES, "data": 48 * NUM_SAMPLES}
    assert per_field["blob"]["data"] == sum(s[4].size for s in written[1])
    assert per_field["raw_img"]["data"] == sum(s[6].size for s in written[1])
    assert sum(v["data"] for v in per_field.values()) == usage["allocated_bytes"]
    assert info["structure_ok"] and [f["name"] for f in info["fields"]] == FIELD_ORDER
    assert info["fields"][2]["arguments"] == {"dtype": "<f4", "shape": [3, 4]}
    assert info["fields"][7]["image_modes"] == {"jpeg": NUM_SAMPLES, "raw": 0}
    first = info["samples"][0]["fields"]
    assert (
        first["label"] == -4000
        and first["meta"] == '{"index":0,"name":"crop-0","tags":[],"nested":{"x":0.0,"ok":true}}'
    )
    assert first["raw_img"] == "raw 40x24, 2880 bytes" and first["blob"].startswith("3 bytes: 00 01 02")


def test_describe_summarises_a_custom_field_with_its_class(tmp_path: Path):
    beton = BetonFile(write_titles(tmp_path / "custom.beton"), custom_handlers={"title": FixedUTF8Field})
    assert describe(beton, samples=1)["samples"][0]["fields"]["title"] == repr(TITLES[0])


def test_describe_with_digest_adds_the_content_digest(beton: BetonFile):
    assert "content_digest" not in describe(beton, samples=0)
    info = describe(beton, samples=0, digest=True)
    assert info["content_digest"] == content_digest(beton) and info["samples"] == []


def test_a_corrupt_value_is_described_not_raised(written, tmp_path: Path):
    at = metadata_offset(BetonFile(written[0]), "blob", 0, "ptr")
    path = corrupt_copy(written, tmp_path, lambda d: d.__setitem__(slice(at, at + 8), np.uint64(10).tobytes()))
    info = describe(BetonFile(path), samples=1)
    assert info["samples"][0]["fields"]["blob"].startswith("unreadable: payload [10, ")
    assert info["structure_ok"] is False


def test_describe_incomplete_keeps_the_header_and_every_field(written, tmp_path: Path):
    path = corrupt_copy(written, tmp_path, lambda d: d.__setitem__(descriptor_offset(0), 255))
    with pytest.raises(UnregisteredCustomField) as error:
        BetonFile(path)
    info = describe_incomplete(str(path), error.value)
    assert info["file"] == str(path) and info["header"]["num_samples"] == NUM_SAMPLES
    assert [f["name"] for f in info["fields"]] == FIELD_ORDER
    assert info["fields"][0] == {"name": "label", "type": "custom", "type_id": 255}  # no arguments to decode
    assert info["fields"][2]["arguments"] == {"dtype": "<f4", "shape": [3, 4]}
    assert info["incomplete"] == str(error.value)
    text = as_text(info)
    assert "   0  label            custom       type id 255" in text
    assert text.endswith(f"incomplete    {error.value}")


def test_as_text_shows_header_layout_fields_structure_and_samples(beton: BetonFile):
    text = as_text(describe(beton, samples=2, digest=True))
    lines = text.splitlines()
    assert lines[0] == f"file          {beton.path} ({beton.size / 1024**2:.1f} MiB)"
    assert lines[1] == f"format        version 2, page size 2.0 MiB ({PAGE_SIZE} bytes)"
    assert lines[2] == f"samples       {NUM_SAMPLES}"
    assert lines[3].startswith(f"data region   bytes [{beton.data_start}, {beton.alloc_table_ptr}): 1 pages, 1 used")
    assert "   2  emb              ndarray" in text and "dtype=<f4, shape=[3, 4]" in text
    assert "jpeg 10, raw 0" in text and "note=" not in text
    assert "structure     ok: aligned pages" in text
    assert f"content       sha256 {content_digest(beton)}" in text
    assert "first 2 samples" in text and "  [1]" in text and "  [2]" not in text


def test_as_text_lists_failed_and_flagged_checks(beton: BetonFile):
    info = describe(beton, samples=0)
    info["structure"] = [
        {"name": "no_overlap", "ok": False, "detail": "1 allocations overlap the one before them"},
        {"name": "no_empty_allocations", "ok": True, "detail": "2 size-0 allocations", "flagged": 2},
        {"name": "sample_ids", "ok": True, "detail": "every allocation belongs to one of the samples"},
    ]
    text = as_text(info)
    assert "structure     PROBLEMS" in text
    assert "  - no_overlap: 1 allocations overlap the one before them" in text
    assert "  - no_empty_allocations: 2 size-0 allocations" in text and "sample_ids" not in text
    assert "first 0 samples" not in text


def test_the_content_digest_read_in_batches_with_its_pages_dropped_is_the_same(beton: BetonFile, monkeypatch):
    """Blocks go to the pool a batch at a time and the file's mapped pages are dropped after each batch
    (a 100M-row file would otherwise stay resident): the digest, on 1 or 2 threads, does not change."""
    whole = content_digest(beton)
    monkeypatch.setattr(digest, "BLOCK", 1)
    one_per_block = content_digest(beton)
    assert one_per_block != whole  # the leaves are per block: the definition depends on BLOCK, not on batches
    monkeypatch.setattr(digest, "BLOCKS_IN_FLIGHT", 2)
    dropped = []
    monkeypatch.setattr(digest, "release_mapped", lambda mm: dropped.append(mm))
    assert content_digest(beton, threads=1) == content_digest(beton, threads=2) == one_per_block
    assert len(dropped) == 2 * -(-beton.num_samples // 2) and all(mm is beton.mm for mm in dropped)
