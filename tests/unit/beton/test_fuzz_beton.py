"""Hostile .beton files: 10,000 mutations of real ffcv outputs give BetonFormatError or a result, nothing else.

Three small files are written by plain ffcv (every built-in field type; a custom field with a
bytes field; int/float only, which has no data pages). Each example patches a few bytes of one of
them in place (header, descriptors, metadata, payloads, allocation table; integers set to
boundary values; truncation; extension), runs everything the reader offers on it (parse,
structural checks, content digest, describe with every sample summarised, every payload read and
decoded), then restores the file. Asserted per example: only BetonFormatError escapes, it takes
well under a second, and the Python heap (tracemalloc, numpy's buffers included) never grows by
more than the file's size plus a small constant.
"""

from __future__ import annotations

import os
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from conftest import ListDataset
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from betonbuild.beton.checks import structural_checks
from betonbuild.beton.describe import describe
from betonbuild.beton.format import ALLOC_TABLE_TYPE, CUSTOM_TYPE_ID, RGB_IMAGE_TYPE_ID, BetonFile
from betonbuild.beton.payloads import decode_image
from betonbuild.custom import FixedUTF8Field
from betonbuild.errors import BetonFormatError

EXAMPLES = 10_000
# A hang guard, not a speed claim: the refusals take milliseconds, but CI shares 2 cores with other
# work, and a timed assertion must not turn a slow moment into a red build.
PER_EXAMPLE_SECONDS = 5.0
HEAP_SLACK = 1 << 20  # bytes beyond the file's size that one example may allocate at its peak
TRACE_EVERY = 8
HANDLERS = {"title": FixedUTF8Field}


def _write(path: Path, fields: dict, samples: list) -> Path:
    from ffcv.writer import DatasetWriter

    DatasetWriter(str(path), fields, page_size=1 << 21, num_workers=1).from_indexed_dataset(
        ListDataset(samples), chunksize=2
    )
    return path


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> list[dict]:
    """Three real .beton files, each with the byte ranges worth mutating."""
    import torch
    from beton_files import make_samples
    from ffcv.fields import BytesField, FloatField, IntField, JSONField, NDArrayField, RGBImageField, TorchTensorField

    tmp = tmp_path_factory.mktemp("fuzz")
    every_type = _write(
        tmp / "all.beton",
        {
            "label": IntField(),
            "score": FloatField(),
            "emb": NDArrayField(dtype=np.dtype("float32"), shape=(3, 4)),
            "tens": TorchTensorField(dtype=torch.int16, shape=(5,)),
            "blob": BytesField(),
            "meta": JSONField(),
            "raw_img": RGBImageField(write_mode="raw"),
            "jpg_img": RGBImageField(write_mode="jpg", jpeg_quality=90),
        },
        make_samples()[:5],
    )
    with_custom = _write(
        tmp / "custom.beton",
        {"title": FixedUTF8Field(8), "n": IntField(), "b": BytesField()},
        [(f"t{i}é", i, np.arange(i + 1, dtype=np.uint8)) for i in range(5)],
    )
    numbers = _write(tmp / "numbers.beton", {"a": IntField(), "b": FloatField()}, [(i, i / 3) for i in range(7)])
    out = []
    for path in (every_type, with_custom, numbers):
        beton = BetonFile(path, custom_handlers=HANDLERS)
        assert all(c["ok"] for c in structural_checks(beton))
        table = beton.alloc_table
        payloads = [(int(p), int(s)) for p, s in zip(table["ptr"], table["size"])]
        regions = [
            (0, 24),
            (24, beton.metadata_start),
            (beton.metadata_start, beton.metadata_end),
            (beton.alloc_table_ptr, beton.size),
        ] + [(p, p + s) for p, s in payloads if s]
        out.append(
            {
                "path": path,
                "data": path.read_bytes(),
                "regions": [r for r in regions if r[1] > r[0]],
                "boundaries": [
                    0,
                    1,
                    2,
                    24,
                    beton.metadata_start,
                    beton.metadata_end,
                    beton.data_start,
                    beton.alloc_table_ptr,
                    beton.size,
                    beton.page_size,
                    2**31,
                    2**32 - 1,
                    2**32,
                    2**63 - 1,
                    2**63,
                    2**64 - 1,
                    10**12,
                ]
                + [p for p, _ in payloads],
            }
        )
    return out


def exercise(path: Path) -> None:
    """Everything the reader does with a file; returns normally or raises BetonFormatError."""
    beton = BetonFile(path, custom_handlers=HANDLERS)
    describe(beton, samples=10, digest=True)  # structural checks, pages, bytes per field, summaries, digest
    for info in beton.fields:
        for row in range(min(beton.num_samples, 10)):
            try:
                if info.type_id == RGB_IMAGE_TYPE_ID:
                    decode_image(beton, info.name, row)  # the summaries above read but do not decode images
                elif info.type_id == CUSTOM_TYPE_ID:
                    beton.custom_allocations(row)
            except BetonFormatError:
                pass  # one bad sample: the others are still tried


EDIT_KINDS = ("byte", "bits", "u8", "u16", "u32", "u64", "truncate", "extend")


def mutations(base_count: int):
    """(base file, [(edit kind, where, value, pick)]): flat integer draws keep hypothesis's own cost low."""
    edit = st.tuples(
        st.integers(0, len(EDIT_KINDS) - 1), st.integers(0, 2**32), st.integers(0, 2**64 - 1), st.integers(0, 64)
    )
    return st.tuples(st.integers(0, base_count - 1), st.lists(edit, min_size=1, max_size=3))


def apply_edits(base: dict, edits, fd: int) -> list[tuple[int, bytes]] | int:
    """Patches the file in place; returns what restores it (ranges to rewrite, or a length to restore)."""
    data = base["data"]
    size = len(data)
    restore: list[tuple[int, bytes]] = []
    regions, boundaries = base["regions"], base["boundaries"]
    for kind_index, where, value, pick in edits:
        kind = EDIT_KINDS[kind_index]
        start, stop = regions[where % len(regions)]
        offset = start + (where // len(regions)) % (stop - start)
        if kind == "truncate":
            os.ftruncate(fd, offset)
            return size
        if kind == "extend":
            os.pwrite(fd, bytes([value & 0xFF]) * (1 + value % 4096), size)
            return size
        width = {"byte": 1, "bits": 1, "u8": 1, "u16": 2, "u32": 4, "u64": 8}[kind]
        if kind == "u64" and pick < len(boundaries):
            value = boundaries[pick] + (value % 3) - 1  # a boundary, or one either side
        offset = min(offset, size - width)
        old = data[offset : offset + width]
        if kind == "bits":
            new = bytes([old[0] ^ (1 << (value % 8))])
        else:
            new = (value % (1 << (8 * width))).to_bytes(width, "little")
        restore.append((offset, old))
        os.pwrite(fd, new, offset)
    return restore


def restore_file(fd: int, base: dict, restore) -> None:
    if isinstance(restore, int):
        os.ftruncate(fd, restore)
        os.pwrite(fd, base["data"], 0)
    else:
        for offset, old in reversed(restore):
            os.pwrite(fd, old, offset)


@pytest.mark.slow  # 10,000 mutated files: about 19 s
def test_fuzzed_files_raise_only_beton_format_errors_fast_and_within_memory(bases, tmp_path: Path):
    copies = []
    for i, base in enumerate(bases):
        path = tmp_path / f"fuzz-{i}.beton"
        path.write_bytes(base["data"])
        copies.append((path, os.open(path, os.O_RDWR)))
    outcomes = {"parsed": 0, "refused": 0}

    @seed(20261129)
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(mutations(len(bases)))
    def fuzz(mutation):
        index, edits = mutation
        path, fd = copies[index]
        restore = apply_edits(bases[index], edits, fd)
        size = os.fstat(fd).st_size
        traced = sum(outcomes.values()) % TRACE_EVERY == 0  # tracing costs 3x: every few examples suffice
        if traced:
            tracemalloc.start()
        started = time.perf_counter()
        try:
            exercise(path)
            outcomes["parsed"] += 1
        except BetonFormatError as exc:
            assert str(exc)
            outcomes["refused"] += 1
        finally:
            elapsed = time.perf_counter() - started
            peak = tracemalloc.get_traced_memory()[1] if traced else 0
            tracemalloc.stop()
            restore_file(fd, bases[index], restore)
        assert elapsed < PER_EXAMPLE_SECONDS, f"{edits} took {elapsed:.2f} s"
        assert peak <= size + HEAP_SLACK, f"{edits}: heap grew by {peak} bytes for a {size}-byte file"

    started = time.perf_counter()
    try:
        fuzz()
    finally:
        for _, fd in copies:
            os.close(fd)
    print(f"{EXAMPLES} mutated files in {time.perf_counter() - started:.1f} s: {outcomes}")
    assert outcomes["parsed"] + outcomes["refused"] == EXAMPLES
    # Both outcomes are common: the mutations reach past the header checks into the contents.
    assert outcomes["refused"] > EXAMPLES // 10 and outcomes["parsed"] > EXAMPLES // 10, outcomes
    for path, _ in copies:
        exercise(path)  # every file was restored exactly


HOSTILE = {
    "alloc_table_ptr_zero": lambda d: d.__setitem__(slice(16, 24), (0).to_bytes(8, "little")),
    "alloc_table_ptr_beyond_eof": lambda d: d.__setitem__(slice(16, 24), (2**63).to_bytes(8, "little")),
    "10**12_samples": lambda d: d.__setitem__(slice(8, 16), (10**12).to_bytes(8, "little")),
    "65535_fields": lambda d: d.__setitem__(slice(2, 4), (65535).to_bytes(2, "little")),
    "truncated_to_100_bytes": lambda d: d.__delitem__(slice(100, None)),
    "truncated_in_the_table": lambda d: d.__delitem__(slice(len(d) - ALLOC_TABLE_TYPE.itemsize - 5, None)),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_header_is_refused_in_under_a_second_without_allocating(bases, tmp_path: Path, name):
    data = bytearray(bases[0]["data"])
    HOSTILE[name](data)
    path = tmp_path / "hostile.beton"
    path.write_bytes(bytes(data))
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(BetonFormatError) as info:
            exercise(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - started < PER_EXAMPLE_SECONDS
    assert peak < 256 * 1024, f"refusing {name} allocated {peak} bytes"
    assert str(path) in str(info.value)
