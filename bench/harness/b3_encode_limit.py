"""3. The JPEG encode limit: ``cv2.imencode`` alone over the same images on all cores (issue 10).

No file, no container, no checks: ``bench/harness/sides/imencode.py`` encodes benchmark 1's crops
(RGB->BGR, q90, exactly ffcv's call) in a pool of ``cores`` processes. That is this machine's
ceiling for turning these pixels into JPEG. ``betonbuild write`` of the same images is timed against
it, alternating. Its write rate as a fraction of the limit is ``limit time / betonbuild time``
(reported both for whole processes and for the in-process work alone). Content check: both sides
produce the same JPEG bytes, so the total JPEG size the encoder reports equals the sum of the
image payloads in betonbuild's file.

Issue 18's target: the in-process ratio (imencode's in-process seconds / betonbuild's write call)
>= 0.9.
"""

from __future__ import annotations

import json

import numpy as np

from . import data
from .runner import (
    ContentMismatch,
    Context,
    Side,
    alternate,
    clean,
    inner_seconds,
    median_of,
    ratio,
    summarise,
    target,
)
from .workflow import write_config

ID, NAME = 3, "encode_limit"
TITLE = "JPEG encode limit: cv2.imencode alone vs betonbuild write"


def run(ctx: Context) -> dict:
    n = ctx.sizes["jpeg_samples"]
    images, labels = data.crops(ctx.cache / "data", n)
    work = ctx.cache / NAME
    write_config(
        work,
        {
            "jpeg": {
                "source": {"kind": "arrays", "columns": {"image": str(images), "label": str(labels)}},
                "fields": {
                    "image": {"type": "rgb_image", "write_mode": "jpg", "jpeg_quality": 90},
                    "label": {"type": "int"},
                },
            }
        },
    )
    ours = work / "betonbuild.beton"

    def encoded(record: dict, stdout: str, stderr: str) -> None:
        info = json.loads(stdout.strip().splitlines()[-1])
        record.update(in_process_seconds=info["seconds"], jpeg_bytes=info["jpeg_bytes"])

    sides = [
        Side("imencode", ctx.side_script("imencode", images, ctx.cores), work, after=encoded),
        Side(
            "betonbuild_write",
            ctx.betonbuild(
                "write",
                "--config",
                "config.yaml",
                "--dataset",
                "jpeg",
                "--output",
                str(ours),
                "--workers",
                str(ctx.cores),
            ),
            work,
            output=ours,
            before=clean(ours, work / "betonbuild.beton.write.json"),
            after=inner_seconds,
        ),
    ]
    rounds = alternate(ctx, NAME, sides, check=lambda row: _same_jpeg_bytes(row, ours, n))
    whole = ratio(rounds, "imencode", "betonbuild_write")
    inner = ratio(rounds, "imencode", "betonbuild_write", "in_process_seconds", " (in-process work only)")
    limit = n / median_of(rounds, "imencode", "in_process_seconds")
    result = {
        "id": ID,
        "name": NAME,
        "title": TITLE,
        "data": f"benchmark 1's {n} crops, jpg q90, {ctx.cores} processes",
        "sides": summarise(ctx, rounds, sides),
        "ratios": [whole, inner],
        "targets": [
            target("JPEG write in-process / cv2.imencode limit (issue 18)", inner["of"], ">=", 0.9, inner["median"])
        ],
        "content": "JPEG bytes from cv2.imencode == sum of the image payloads in betonbuild's file, every round",
        "rounds": rounds,
        "notes": [
            f"encode limit {limit:.0f} images/s on {ctx.cores} cores (in-process); betonbuild write "
            f"{n / median_of(rounds, 'betonbuild_write', 'seconds'):.0f} images/s whole process, "
            f"{n / median_of(rounds, 'betonbuild_write', 'in_process_seconds'):.0f} images/s inside its write call",
            f"betonbuild writes at {whole['median']:.0%} of the encode limit end to end and at {inner['median']:.0%} "
            "of it inside the write call",
        ],
    }
    return result


def _same_jpeg_bytes(row: dict, beton_path, n: int) -> dict:
    from betonbuild.beton.format import BetonFile

    beton = BetonFile(str(beton_path))
    stored = int(beton.image_sizes("image", np.arange(beton.num_samples)).sum())
    encoded = row["imencode"]["jpeg_bytes"]
    if beton.num_samples != n or stored != encoded:
        raise ContentMismatch(
            f"cv2.imencode produced {encoded} JPEG bytes for {n} images, betonbuild's file holds "
            f"{stored} in {beton.num_samples} samples"
        )
    return {"jpeg_bytes": encoded}
