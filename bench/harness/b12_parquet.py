"""12. Parquet sources (issue 20): ``betonbuild write`` of a Parquet source vs plain ffcv.

- ``rows``: ``parquet_rows`` rows (issue 20: 1M) of an int64, a float64 and a 64-element float32
  list (a fixed-size list column), in row groups of 64Ki rows. Plain ffcv writes the same rows from
  in-memory numpy arrays (``sides/b12_plain_rows.py``). Targets: write / plain <= 1.1, and the
  betonbuild write's peak RSS <= 1.5 GiB.
- ``images``: ``parquet_images`` JPEG crops (q90) in a Hugging Face ``Image`` column ({bytes, path})
  + an int label, 100 rows per row group as ``datasets`` writes image Parquet. Plain ffcv decodes
  each with PIL and re-encodes it (``RGBImageField(write_mode="jpg")``, ``sides/b12_plain_reencode.py``);
  betonbuild's field is ``write_mode: jpg``, plus ``source_jpeg: keep`` with ``--parquet-jpeg keep``
  (the source's JPEG bytes stored as they are; issue 20's target: write / plain reencode <= 0.3).
  Re-encoding, both sides store the same bytes (content digests compared); keeping, the stored
  JPEGs are the source's, so only the sample counts are compared.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from . import data
from .runner import Context, Side, alternate, clean, inner_seconds, median_of, ratio, summarise, target
from .workflow import write_config

ID, NAME = 12, "parquet"
TITLE = "Parquet source write (rows; HF Image column of JPEGs) vs plain ffcv"
ROW_GROUP = 1 << 16
IMAGE_ROW_GROUP = 100  # what datasets' to_parquet writes for image datasets
VECTOR = 64
RSS_LIMIT_MIB = 1536


def rows_data(root: Path, n: int, seed: int = 12) -> tuple[Path, Path]:
    """(rows.parquet, rows.npz): the same n rows for both sides, made once."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory = root / f"parquet-rows-{n}-{seed}"
    spec = {"kind": "parquet_rows", "n": n, "seed": seed, "row_group": ROW_GROUP}
    if not data._ready(directory, spec):
        print(f"  preparing {n} Parquet rows in {directory}", flush=True)
        tmp = data._fresh(directory)
        rng = np.random.default_rng(seed)
        ids = np.arange(n, dtype=np.int64)
        score = rng.standard_normal(n)
        vec = rng.standard_normal((n, VECTOR), dtype=np.float32)
        table = pa.table(
            {"id": ids, "score": score, "vec": pa.FixedSizeListArray.from_arrays(pa.array(vec.reshape(-1)), VECTOR)}
        )
        pq.write_table(table, tmp / "rows.parquet", row_group_size=ROW_GROUP)
        np.savez(tmp / "rows.npz", id=ids, score=score, vec=vec)
        data._publish(tmp, directory, spec)
    return directory / "rows.parquet", directory / "rows.npz"


def images_data(root: Path, n: int, seed: int = 13) -> Path:
    """images.parquet: n JPEG crops (q90) as a Hugging Face Image struct column, and a label."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    directory = root / f"parquet-images-{n}-{seed}"
    spec = {"kind": "parquet_images", "n": n, "seed": seed, "row_group": IMAGE_ROW_GROUP}
    if not data._ready(directory, spec):
        print(f"  preparing {n} JPEG crops as a Parquet Image column in {directory}", flush=True)
        tmp = data._fresh(directory)
        jpegs, labels = [], []
        for image, label, _ in data.photo_crops(n, seed):
            buffer = io.BytesIO()
            Image.fromarray(image).save(buffer, format="JPEG", quality=90)
            jpegs.append(buffer.getvalue())
            labels.append(label)
        image = pa.StructArray.from_arrays(
            [pa.array(jpegs, pa.binary()), pa.array([f"{k}.jpg" for k in range(n)])], ["bytes", "path"]
        )
        table = pa.table({"image": image, "label": pa.array(labels, pa.int64())})
        pq.write_table(table, tmp / "images.parquet", row_group_size=IMAGE_ROW_GROUP)
        data._publish(tmp, directory, spec)
    return directory / "images.parquet"


def write_side(ctx: Context, work: Path, dataset: str, out: Path) -> Side:
    command = ctx.betonbuild(
        "write", "--config", "config.yaml", "--dataset", dataset, "--output", str(out), "--workers", str(ctx.cores)
    )
    return Side(f"betonbuild_write_{dataset}", command, work, output=out, before=clean(out), after=inner_seconds)


def same_count(row: dict) -> dict:
    """The check of the keep case: the stored JPEGs differ by design; both files hold every sample."""
    from betonbuild.beton.format import BetonFile

    counts = {name: BetonFile(str(path)).num_samples for name, path in COUNTED.items()}
    if len(set(counts.values())) != 1:
        raise RuntimeError(f"sample counts differ: {counts}")
    return {"samples": next(iter(counts.values())), "sides": sorted(counts), "digests": "differ by design (keep)"}


COUNTED: dict[str, Path] = {}


def run(ctx: Context) -> dict:
    n_rows, n_images, jpeg = ctx.sizes["parquet_rows"], ctx.sizes["parquet_images"], ctx.sizes["parquet_jpeg"]
    rows_parquet, rows_npz = rows_data(ctx.cache / "data", n_rows)
    images_parquet = images_data(ctx.cache / "data", n_images)
    work = ctx.cache / NAME
    image_field = {"type": "rgb_image", "write_mode": "jpg", **({"source_jpeg": "keep"} if jpeg == "keep" else {})}
    write_config(
        work,
        {
            "rows": {
                "source": {"kind": "parquet", "path": str(rows_parquet)},
                "fields": {
                    "id": {"type": "int"},
                    "score": {"type": "float"},
                    "vec": {"type": "ndarray", "dtype": "float32", "shape": [VECTOR]},
                },
            },
            "images": {
                "source": {"kind": "parquet", "path": str(images_parquet)},
                "fields": {"image": image_field, "label": {"type": "int"}},
            },
        },
    )
    plain_rows, ours_rows = work / "plain_rows.beton", work / "rows.beton"
    plain_images, ours_images = work / "plain_images.beton", work / "images.beton"
    row_sides = [
        Side(
            "plain_ffcv_rows",
            ctx.side_script("b12_plain_rows", rows_npz, plain_rows, ctx.cores),
            work,
            output=plain_rows,
            before=clean(plain_rows),
            after=inner_seconds,
        ),
        write_side(ctx, work, "rows", ours_rows),
    ]
    image_sides = [
        Side(
            "plain_ffcv_reencode",
            ctx.side_script("b12_plain_reencode", images_parquet, plain_images, ctx.cores),
            work,
            output=None if jpeg == "keep" else plain_images,
            before=clean(plain_images),
            after=inner_seconds,
        ),
        write_side(ctx, work, "images", ours_images),
    ]
    if jpeg == "keep":
        image_sides[1].output = None
        COUNTED.update({"plain_ffcv_reencode": plain_images, "betonbuild_write_images": ours_images})
    rows_rounds = alternate(ctx, f"{NAME}-rows", row_sides)
    image_rounds = alternate(ctx, f"{NAME}-images", image_sides, check=same_count if jpeg == "keep" else None)
    rows_ratio = ratio(rows_rounds, "betonbuild_write_rows", "plain_ffcv_rows")
    images_ratio = ratio(image_rounds, "betonbuild_write_images", "plain_ffcv_reencode")
    sides = {**summarise(ctx, rows_rounds, row_sides), **summarise(ctx, image_rounds, image_sides)}
    rss = sides["betonbuild_write_rows"]["max_rss_mib"]
    targets = [
        target(
            "write / plain ffcv from in-memory arrays <= 1.1 (issue 20)",
            rows_ratio["of"],
            "<=",
            1.1,
            rows_ratio["median"],
        ),
        target(
            "peak RSS of the write <= 1.5 GiB (issue 20)", "betonbuild_write_rows max_rss_mib", "<=", RSS_LIMIT_MIB, rss
        ),
    ]
    if jpeg == "keep":
        targets.append(
            target(
                "source_jpeg: keep, write / plain ffcv reencode <= 0.3 (issue 20)",
                images_ratio["of"],
                "<=",
                0.3,
                images_ratio["median"],
            )
        )
    return {
        "id": ID,
        "name": NAME,
        "title": TITLE,
        "data": f"rows: {n_rows} x (int64, float64, {VECTOR} x float32) in row groups of {ROW_GROUP}; images: "
        f"{n_images} JPEG q90 256x256 crops in an Image struct column, {IMAGE_ROW_GROUP} per row group, "
        f"betonbuild {'keeps the JPEGs (source_jpeg: keep)' if jpeg == 'keep' else 're-encodes (write_mode: jpg)'}; "
        f"{ctx.cores} workers",
        "sides": sides,
        "ratios": [rows_ratio, images_ratio],
        "targets": targets,
        "content": "rows: content digests equal in every round; images: "
        + ("sample counts equal (keep stores other JPEG bytes)" if jpeg == "keep" else "content digests equal"),
        "rounds": [{**r, **{k: v for k, v in i.items() if k != "content"}} for r, i in zip(rows_rounds, image_rounds)],
        "notes": [
            f"in-process write call, rows: plain {median_of(rows_rounds, 'plain_ffcv_rows', 'in_process_seconds'):.2f}"
            f" s, betonbuild {median_of(rows_rounds, 'betonbuild_write_rows', 'in_process_seconds'):.2f} s; images: "
            f"plain {median_of(image_rounds, 'plain_ffcv_reencode', 'in_process_seconds'):.2f} s, betonbuild "
            f"{median_of(image_rounds, 'betonbuild_write_images', 'in_process_seconds'):.2f} s",
        ],
    }
