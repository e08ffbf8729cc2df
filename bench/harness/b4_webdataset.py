"""4. WebDataset: ``betonbuild write`` vs plain ffcv ``DatasetWriter.from_webdataset`` (issue 4: >= 1.6x faster).

Same shards (16 by default, JPEG q90 crops with a ``cls`` label), same fields (``image`` jpg q90 +
``label`` int), ``cores`` workers on both sides:
- ``plain_ffcv``: ``bench/harness/sides/plain_wds.py``, the pipeline ``decode('rgb8').to_tuple('jpg', 'cls')``.
  ffcv decodes every sample twice: once in a counting pass, then again in the write pass.
- ``betonbuild_write``: ``betonbuild write`` on a webdataset source. It counts the samples from the
  tar headers (and hashes the shards for the manifest), then decodes each sample once.
Both decode the same JPEG files to the same pixels and encode them with the same cv2 call, so the
content digests are equal. This is checked in every round. (This is the harness's own
benchmark; ``bench/webdataset_write.py`` is a separate, deeper study with phase timings.)
"""

from __future__ import annotations

from . import data
from .runner import Context, Side, alternate, clean, inner_seconds, median_of, ratio, summarise, target
from .workflow import write_config

ID, NAME = 4, "webdataset"
TITLE = "WebDataset: betonbuild write vs DatasetWriter.from_webdataset"


def run(ctx: Context) -> dict:
    n, count = ctx.sizes["wds_samples"], ctx.sizes["wds_shards"]
    directory, pattern = data.shards(ctx.cache / "data", n, count)
    work = ctx.cache / NAME
    write_config(
        work,
        {
            "wds": {
                "source": {
                    "kind": "webdataset",
                    "shards": pattern,
                    "keys": {"image": "jpg", "label": "cls"},
                    "decode": "rgb8",
                },
                "fields": {
                    "image": {"type": "rgb_image", "write_mode": "jpg", "jpeg_quality": 90},
                    "label": {"type": "int"},
                },
            }
        },
    )
    plain, ours = work / "plain.beton", work / "betonbuild.beton"
    sides = [
        Side(
            "plain_ffcv",
            ctx.side_script("plain_wds", pattern, plain, ctx.cores),
            work,
            output=plain,
            before=clean(plain),
            after=inner_seconds,
        ),
        Side(
            "betonbuild_write",
            ctx.betonbuild(
                "write",
                "--config",
                "config.yaml",
                "--dataset",
                "wds",
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
    rounds = alternate(ctx, NAME, sides)
    speedup = ratio(rounds, "plain_ffcv", "betonbuild_write")
    shard_bytes = sum(p.stat().st_size for p in directory.glob("*.tar"))
    plain_inner = median_of(rounds, "plain_ffcv", "in_process_seconds")
    ours_inner = median_of(rounds, "betonbuild_write", "in_process_seconds")
    return {
        "id": ID,
        "name": NAME,
        "title": TITLE,
        "data": f"{count} shards, {n} JPEG q90 crops 256x256, {shard_bytes / 2**20:.0f} MiB -> rgb_image jpg q90 + "
        f"int label; {ctx.cores} workers",
        "sides": summarise(ctx, rounds, sides),
        "ratios": [speedup],
        "targets": [
            target(
                "betonbuild at least 1.6x faster than from_webdataset (issue 4)",
                speedup["of"],
                ">=",
                1.6,
                speedup["median"],
            )
        ],
        "content": "content digests of both files equal in every round (identical JPEG payloads and labels)",
        "rounds": rounds,
        "notes": [
            f"inside the write call: plain ffcv {plain_inner:.2f} s (count pass + write pass), betonbuild "
            f"{ours_inner:.2f} s (write only); the rest of each whole-process time is start-up, imports, exit and, "
            "for betonbuild, "
            "the shard list (tar headers + sha256) and the manifest",
        ],
    }
