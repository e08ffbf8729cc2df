"""Shared by the tests of betonbuild.beton: a .beton written by plain ffcv with every built-in field
type, the samples it holds, and helpers that corrupt a copy of it one edit at a time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from conftest import ListDataset

from betonbuild.beton.format import ALLOC_TABLE_TYPE, FIELD_DESC_TYPE, HEADER_TYPE, BetonFile
from betonbuild.demo import colour_photos

PAGE_SIZE = 1 << 21
NUM_SAMPLES = 10
FIELD_ORDER = ["label", "score", "emb", "tens", "blob", "meta", "raw_img", "jpg_img"]


def make_samples() -> list[tuple]:
    """Real photo crops of varying size, and values that exercise every field."""
    import torch

    photos = colour_photos()
    names = sorted(photos)
    samples = []
    for i in range(NUM_SAMPLES):
        photo = photos[names[i % len(names)]]
        height, width = 24 + 4 * i, 40 - 2 * i
        top, left = 30 + 7 * i, 50 + 3 * i
        image = np.ascontiguousarray(photo[top : top + height, left : left + width, :3])
        samples.append(
            (
                i * 1000 - 4000,  # negative and positive ints
                i / 7 - 0.5,
                (np.arange(12, dtype=np.float32).reshape(3, 4) * (i + 1) - 0.25),
                torch.arange(5, dtype=torch.int16) * (i - 3),
                np.frombuffer(bytes(range(i, i + 3 + 5 * i)), dtype=np.uint8),
                {"index": i, "name": f"crop-{i}", "tags": ["a"] * (i % 3), "nested": {"x": i / 2, "ok": i % 2 == 0}},
                image,
                image,
            )
        )
    return samples


def write_every_field(path: Path) -> tuple[Path, list[tuple]]:
    """One .beton written by plain ffcv (1 worker) with int, float, ndarray, torch, bytes, json, raw and jpg images."""
    import torch
    from ffcv.fields import BytesField, FloatField, IntField, JSONField, NDArrayField, RGBImageField, TorchTensorField
    from ffcv.writer import DatasetWriter

    samples = make_samples()
    fields = {
        "label": IntField(),
        "score": FloatField(),
        "emb": NDArrayField(dtype=np.dtype("float32"), shape=(3, 4)),
        "tens": TorchTensorField(dtype=torch.int16, shape=(5,)),
        "blob": BytesField(),
        "meta": JSONField(),
        "raw_img": RGBImageField(write_mode="raw"),
        "jpg_img": RGBImageField(write_mode="jpg", jpeg_quality=90),
    }
    writer = DatasetWriter(str(path), fields, page_size=PAGE_SIZE, num_workers=1)
    writer.from_indexed_dataset(ListDataset(samples), chunksize=3)
    return path, samples


TITLES = ["crème brûlée", "", "日本語テキスト", "x" * 20]


def write_titles(path: Path) -> Path:
    """A .beton with a custom field (FixedUTF8Field "title", type id 255) and an int field "n"."""
    from ffcv.fields import IntField
    from ffcv.writer import DatasetWriter

    from betonbuild.custom import FixedUTF8Field

    DatasetWriter(
        str(path), {"title": FixedUTF8Field(24), "n": IntField()}, page_size=PAGE_SIZE, num_workers=1
    ).from_indexed_dataset(ListDataset([(t, i) for i, t in enumerate(TITLES)]))
    return path


# --- corrupting a copy ---------------------------------------------------------------------------


def corrupt_copy(written, tmp_path: Path, edit) -> Path:
    """A copy of the good file with ``edit(bytearray)`` applied."""
    data = bytearray(written[0].read_bytes())
    edit(data)
    path = tmp_path / "corrupt.beton"
    path.write_bytes(bytes(data))
    return path


def set_header(data: bytearray, **values) -> None:
    header = np.frombuffer(data, dtype=HEADER_TYPE, count=1).copy()
    for key, value in values.items():
        header[key] = value
    data[: HEADER_TYPE.itemsize] = header.tobytes()


def descriptor_offset(index: int) -> int:
    return HEADER_TYPE.itemsize + FIELD_DESC_TYPE.itemsize * index


def metadata_offset(beton: BetonFile, field: str, row: int, member: str | None = None) -> int:
    offset = beton.metadata_start + beton.metadata_type.itemsize * row + beton.metadata_type.fields[field][1]
    if member is not None:
        offset += beton.metadata_type[field].fields[member][1]
    return offset


def table_offset(beton: BetonFile, entry: int, member: str) -> int:
    return beton.alloc_table_ptr + ALLOC_TABLE_TYPE.itemsize * entry + ALLOC_TABLE_TYPE.fields[member][1]
