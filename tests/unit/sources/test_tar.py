"""The tar parser of shards (betonbuild.sources.tar): member names exactly as tarfile gives them
(ustar, GNU, PAX; plain and compressed), webdataset's key split, and why a quiet end is refused."""

from __future__ import annotations

import pytest
from wds_samples import LONG_DIR, damaged_tar, odd_tar, photo_shard_bytes, tarfile_members

from betonbuild.sources.tar import open_shard, split_key, tar_members

pytest.importorskip("webdataset")


@pytest.mark.parametrize(
    "name",
    [
        "000123.jpg",
        "dir/000123.seg.png",
        "dir.v1/0001.jpg",
        "a/b.c/d.e.f",
        "noext",
        "dir.v1/noext",
        ".hidden",
        "x.",
        "café/0005.JPG",
        "__key__.json",
        "a//b.c",
    ],
)
def test_split_key_is_webdatasets_base_plus_ext(name):
    from webdataset.tariterators import base_plus_ext

    assert split_key(name) == tuple(base_plus_ext(name))


def _scanned(path) -> list[tuple[str, bool, int]]:
    with open_shard(str(path)) as (fh, size):
        return [(name, regular, size if regular else 0) for name, regular, size in tar_members(fh, size)]


@pytest.mark.parametrize("compression", ["", "gz", "bz2", "xz"])
@pytest.mark.parametrize("fmt", ["ustar", "gnu", "pax"])
def test_tar_scan_names_every_member_as_tarfile_does(tmp_path, fmt, compression):
    path = odd_tar(tmp_path / f"odd.tar{'.' + compression if compression else ''}", fmt, compression)
    scanned = _scanned(path)
    assert scanned == tarfile_members(path)
    names = [(name, regular) for name, regular, _ in scanned]
    assert (f"{LONG_DIR}/0004.jpg", True) in names and ("café/0005.jpg", True) in names
    assert ("dir.v1", False) in names and ("0007.jpg", False) in names


@pytest.mark.parametrize(
    "how, members_read", [("cut_between_samples", 6), ("garbage_header", 6), ("no_end_blocks", 15)]
)
def test_tarfile_alone_reads_these_shards_without_an_error(tmp_path, how, members_read):
    """Why the scan requires the end-of-archive blocks: tarfile (so webdataset) just stops early."""
    data, members = photo_shard_bytes(tmp_path)
    path = tmp_path / "bad.tar"
    path.write_bytes(damaged_tar(data, members, how)[0])
    assert [(name, regular) for name, regular, _ in tarfile_members(path)] == [
        (name, True) for name, _, _ in members[:members_read]
    ]
