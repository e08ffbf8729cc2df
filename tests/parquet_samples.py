"""Small real Parquet files and Hugging Face dataset directories for the parquet and huggingface
source tests: numbers, fixed and variable lists, text, and JPEG-encoded crops of scikit-image's
photos in a Hugging Face ``Image`` column ({bytes, path}). Made here, never downloaded."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

NUMERIC_FIELDS = {
    "id": {"type": "int"},
    "score": {"type": "float"},
    "vec": {"type": "ndarray", "dtype": "float32", "shape": [8]},
}
IMAGE_FIELDS = {"image": {"type": "rgb_image", "write_mode": "raw"}, "label": {"type": "int"}}


def numeric_table(n: int, start: int = 0):
    """id (int64), score (float64), vec (8 x float32, fixed-size list), tokens (variable int32 lists), text."""
    import pyarrow as pa

    ids = np.arange(start, start + n, dtype=np.int64)
    rng = np.random.default_rng(start)
    vec = rng.standard_normal((n, 8)).astype(np.float32)
    return pa.table(
        {
            "id": ids,
            "score": rng.standard_normal(n),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(vec.reshape(-1)), 8),
            "tokens": pa.array([list(range(int(i) % 5 + 1)) for i in ids], type=pa.list_(pa.int32())),
            "text": [f"row {i}" for i in ids],
        }
    )


def write_numeric(path: Path, n: int, start: int = 0, row_group_size: int = 16) -> Path:
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(numeric_table(n, start), path, row_group_size=row_group_size)
    return path


def jpeg_crops(n: int, size: int = 32) -> list[bytes]:
    """JPEG bytes of ``n`` crops of the astronaut and coffee photos."""
    from PIL import Image

    from betonbuild.demo import colour_photos, crops

    photos = colour_photos()
    images = crops(photos["astronaut"], size=size, count=(n + 1) // 2) + crops(
        photos["coffee"], size=size, count=n // 2
    )
    encoded = []
    for crop in images[:n]:
        buffer = io.BytesIO()
        Image.fromarray(crop).save(buffer, format="JPEG", quality=90)
        encoded.append(buffer.getvalue())
    return encoded


def hf_image_dataset(n: int, size: int = 32):
    """A ``datasets.Dataset`` with an Image feature (JPEG bytes) and a ClassLabel-like int label."""
    import datasets

    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    rows = {"image": [{"bytes": b, "path": None} for b in jpeg_crops(n, size)], "label": [i % 2 for i in range(n)]}
    return datasets.Dataset.from_dict(rows, features=features)
