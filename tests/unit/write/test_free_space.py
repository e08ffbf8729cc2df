"""A full write or a merge that cannot fit on the disk is refused before it starts (issue 16)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from betonbuild.config.load import load_config
from betonbuild.errors import WriteError
from betonbuild.workflow.stages import _estimated_size, build, make_source_manifest
from betonbuild.write.free_space import SKIP_VARIABLE, check_free_space, estimated_from_smoke


def test_a_write_larger_than_the_free_space_is_refused_naming_both(tmp_path: Path):
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(WriteError) as info:
        check_free_space("big", tmp_path / "out" / "big.beton", 2 * free)
    message = str(info.value)
    assert message.startswith("dataset 'big': big.beton will be about ")
    assert f"the disk holding {tmp_path / 'out'} has " in message and "free space or point `results`" in message
    check_free_space("big", tmp_path / "out" / "big.beton", free // 2)  # fits
    check_free_space("big", tmp_path / "out" / "big.beton", None)  # no estimate: no check


def test_the_check_can_be_skipped_as_the_message_says(tmp_path: Path, monkeypatch):
    monkeypatch.setenv(SKIP_VARIABLE, "1")
    check_free_space("big", tmp_path / "big.beton", 10 * shutil.disk_usage(tmp_path).free)


def test_the_estimate_scales_the_smoke_file(tmp_path: Path):
    smoke = tmp_path / "smoke.beton"
    smoke.write_bytes(b"x" * 8000)
    assert estimated_from_smoke(smoke, 8, 1_000_000) == 1_000_000_000
    assert estimated_from_smoke(tmp_path / "missing.beton", 8, 10) is None


def test_a_full_write_that_would_fill_the_disk_stops_before_writing(tmp_path: Path):
    np.save(tmp_path / "x.npy", np.zeros((200, 16), dtype=np.float32))
    source = {"kind": "arrays", "columns": {"x": str(tmp_path / "x.npy")}}
    entry = {"source": source, "fields": {"x": {"type": "ndarray", "dtype": "float32", "shape": [16]}}}
    spec = load_config({"datasets": {"d": {**entry, "smoke": {"samples": 4}}}}).datasets["d"]
    results = tmp_path / "results"
    results.mkdir()
    make_source_manifest(spec, str(results / "source.json"))
    build(
        spec, str(results / "source.json"), str(results / "smoke.beton"), str(results / "smoke.write.json"), smoke=True
    )
    # a smoke file as large as the disk: the full file would be 25x that
    with open(results / "smoke.beton", "r+b") as fh:
        fh.truncate(shutil.disk_usage(results).free)
    with pytest.raises(WriteError, match="d.beton will be about"):
        build(spec, str(results / "source.json"), str(results / "d.beton"), str(results / "d.write.json"))
    assert not (results / "d.beton").exists() and not list(results.glob(".d.beton.tmp-*"))


def test_a_smoke_file_of_one_mostly_empty_page_does_not_scale_the_page(tmp_path: Path):
    """Four samples of 64 bytes fill a sliver of an 8 MiB page: 20M rows like them are ~2 GB, not the
    page size per four samples (tens of TiB: every large dataset was refused)."""
    np.save(tmp_path / "x.npy", np.zeros((200, 16), dtype=np.float32))
    source = {"kind": "arrays", "columns": {"x": str(tmp_path / "x.npy")}}
    entry = {"source": source, "fields": {"x": {"type": "ndarray", "dtype": "float32", "shape": [16]}}}
    spec = load_config({"datasets": {"d": {**entry, "smoke": {"samples": 4}}}}).datasets["d"]
    make_source_manifest(spec, str(tmp_path / "source.json"))
    build(
        spec, str(tmp_path / "source.json"), str(tmp_path / "smoke.beton"), str(tmp_path / "s.write.json"), smoke=True
    )
    assert (tmp_path / "smoke.beton").stat().st_size >= 8 << 20
    estimate = _estimated_size(tmp_path / "smoke.beton", 20_000_000)
    assert 20_000_000 * (64 + 8 + 24) <= estimate <= 20_000_000 * (64 + 16 + 24) + (17 << 20)  # + 2 pages
