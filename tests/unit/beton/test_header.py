"""The header read from a file's first bytes (betonbuild.beton.header), as the reader parses it,
without the whole-file checks."""

from __future__ import annotations

from pathlib import Path

from beton_files import NUM_SAMPLES, write_every_field

from betonbuild.beton.format import BetonFile
from betonbuild.beton.header import read_header, scaled_size


def test_the_header_is_the_readers_and_needs_only_the_first_bytes(tmp_path: Path):
    path, _ = write_every_field(tmp_path / "all.beton")
    header = read_header(path)
    assert int(header["num_samples"]) == BetonFile(path).num_samples == NUM_SAMPLES
    assert int(header["version"]) == 2
    assert scaled_size(path, NUM_SAMPLES) >= path.stat().st_size - (2 << 21)  # all but <= 2 pages' padding
    with open(path, "r+b") as fh:
        fh.truncate(4 << 30)  # enlarged sparsely (as a test of the free-space check does): the header as it was
    assert int(read_header(path)["num_samples"]) == NUM_SAMPLES
    assert scaled_size(path, NUM_SAMPLES) is None  # its "table" now gigabytes: the table cannot say
    (tmp_path / "short.beton").write_bytes(b"\x02\x00")
    assert read_header(tmp_path / "short.beton") is None
