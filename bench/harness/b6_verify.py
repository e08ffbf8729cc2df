"""6. Full verification vs the write it verifies (issue 5: verification time <= write time).

Source: an image folder of 20,000 JPEG q95 crops, one class per photograph, as a user's photos
would be. The dataset stores them as rgb_image jpg q90 + int label. Both sides are whole CLI
commands on ``cores`` workers/threads, and each computes the source manifest (sha256 of every file):
- ``write``: ``betonbuild write``. It decodes each source image (PIL), checks it, and ffcv encodes it.
- ``verify``: ``betonbuild verify --mode full``. It decodes every stored JPEG and every source image
  and compares them. It also runs the structural checks, the content digest, the sha256 of the file
  and one ffcv.Loader batch (in a child process that imports ffcv and torch; the verifying process
  itself imports neither).
The verify of a round reads the file its write produced. Content check: the report is ok (exit 0),
and its content digest equals the digest of the file.
"""

from __future__ import annotations

import json

from . import data
from .runner import (
    ContentMismatch,
    Context,
    Side,
    alternate,
    clean,
    digest,
    inner_seconds,
    median_of,
    ratio,
    summarise,
    target,
)
from .workflow import write_config

ID, NAME = 6, "verify"
TITLE = "Full verification vs write"


def run(ctx: Context) -> dict:
    n = ctx.sizes["verify_samples"]
    folder = data.image_folder(ctx.cache / "data", n)
    work = ctx.cache / NAME
    write_config(
        work,
        {
            "crops": {
                "source": {"kind": "image_folder", "root": str(folder)},
                "fields": {
                    "image": {"type": "rgb_image", "write_mode": "jpg", "jpeg_quality": 90},
                    "label": {"type": "int"},
                },
                "verify": {"mode": "full"},
            }
        },
    )
    beton, report = work / "crops.beton", work / "crops.verify.json"
    sides = [
        Side(
            "write",
            ctx.betonbuild(
                "write",
                "--config",
                "config.yaml",
                "--dataset",
                "crops",
                "--output",
                str(beton),
                "--workers",
                str(ctx.cores),
            ),
            work,
            before=clean(beton, work / "crops.beton.write.json", work / "crops.write.json"),
            after=inner_seconds,
        ),
        Side(
            "verify",
            ctx.betonbuild(
                "verify",
                "--config",
                "config.yaml",
                "--dataset",
                "crops",
                str(beton),
                "--threads",
                str(ctx.cores),
                "--mode",
                "full",
                "--output",
                str(report),
            ),
            work,
            before=clean(report),
            after=lambda record, out, err: record.update(_report(report)),
        ),
    ]

    def check(row: dict) -> dict:
        found = digest(beton, min(ctx.cores, 4))
        if row["verify"]["digest"] != found or row["verify"]["mode"] != "full":
            raise ContentMismatch(
                f"verify reported digest {row['verify']['digest']} in mode {row['verify']['mode']}, "
                f"the file has {found}"
            )
        return {"digest": found, "verified_ok": True}

    rounds = alternate(ctx, NAME, sides, check=check)
    share = ratio(rounds, "verify", "write")
    inner = ratio(rounds, "verify", "write", "in_process_seconds", " (in-process work only)")
    last = rounds[-1]["verify"]
    return {
        "id": ID,
        "name": NAME,
        "title": TITLE,
        "data": f"image folder of {n} JPEG q95 crops 256x256 -> rgb_image jpg q90 + int label; {ctx.cores} "
        "workers / threads; verify.mode full",
        "sides": summarise(ctx, rounds, sides),
        "ratios": [share, inner],
        "targets": [
            target("full verification at most the time of the write (issue 5)", share["of"], "<=", 1.0, share["median"])
        ],
        "content": "every report ok, in mode full, with the file's content digest",
        "rounds": rounds,
        "notes": [
            f"in-process: write call {median_of(rounds, 'write', 'in_process_seconds'):.2f} s, verify_beton "
            f"{median_of(rounds, 'verify', 'in_process_seconds'):.2f} s; the rest of each command is start-up, "
            "imports and the source manifest (sha256 of every source file). The write imports ffcv and torch "
            "before its call; the verify's Loader batch imports them in a child process during verify_beton",
            f"JPEG mean absolute error against the source: {last['jpeg_mean_abs_error_mean']} on average, "
            f"{last['jpeg_mean_abs_error_max']} for the worst image",
        ],
    }


def _report(path) -> dict:
    report = json.loads(path.read_text())
    image = next(c for c in report["checks"] if c["name"] == "variable_fields")["fields"]["image"]
    return {
        "in_process_seconds": report["seconds"],
        "digest": report["content_digest"],
        "mode": report["mode"],
        "compared": image["compared"],
        "jpeg_mean_abs_error_mean": image["jpeg_mean_abs_error_mean"],
        "jpeg_mean_abs_error_max": image["jpeg_mean_abs_error_max"],
    }
