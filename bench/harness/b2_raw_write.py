"""2. Raw arrays write (I/O-bound, >= 2 GB): betonbuild vs plain ffcv, and both vs ``cp`` of the result (issue 6).

Each sample is 192 KiB of raw uint8 pixels (an ``ndarray`` field) plus an int, so there is almost
no CPU work. ``cp`` of the written file is the limit of this disk/page cache for the same bytes.
We cannot drop the page cache (no root): every side reads its input from the page cache and writes into it.
Each run is therefore also followed by a timed ``sync`` (``flush_seconds``), the cost of getting
its output onto the disk. Issue 6 sets no number here. It asks for the ratio, and for when
partitioning pays, since the merge copies the data once more. ``snakemake`` (manifest, smoke gate,
one write job) and ``snakemake_partitions`` (the same with ``partitions: cores`` parts + merge) show it.
"""

from __future__ import annotations

from . import data
from .runner import Context, Side, alternate, clean, inner_seconds, median_of, ratio, summarise
from .workflow import median_rule_seconds, reset_project, stage_recorder, supports_partitions, write_config

ID, NAME = 2, "raw_write"
TITLE = "Raw arrays write (I/O-bound) vs plain ffcv vs cp"


def run(ctx: Context) -> dict:
    n = data.raw_samples(int(ctx.sizes["raw_gib"] * (1 << 30)))
    images, labels = data.crops(ctx.cache / "data", n, seed=5)
    work = ctx.cache / NAME
    partitions = ctx.cores if supports_partitions(ctx.tree) else None
    spec = {
        "source": {"kind": "arrays", "columns": {"image": str(images), "label": str(labels)}},
        "fields": {"image": {"type": "ndarray", "dtype": "uint8", "shape": [256, 256, 3]}, "label": {"type": "int"}},
    }
    write_config(work, {"raw": spec, **({"raw_parts": {**spec, "partitions": partitions}} if partitions else {})})
    plain, ours, copy = work / "plain.beton", work / "betonbuild.beton", work / "copy.beton"
    built = work / "results" / "raw" / "raw.beton"
    stages, after_snakemake = stage_recorder(work)
    sides = [
        Side(
            "plain_ffcv",
            ctx.side_script("plain_write", images, labels, plain, ctx.cores, "raw"),
            work,
            output=plain,
            before=clean(plain),
            after=inner_seconds,
            flush=True,
        ),
        Side(
            "betonbuild_write",
            ctx.betonbuild(
                "write",
                "--config",
                "config.yaml",
                "--dataset",
                "raw",
                "--output",
                str(ours),
                "--workers",
                str(ctx.cores),
            ),
            work,
            output=ours,
            before=clean(ours, work / "betonbuild.beton.write.json"),
            after=inner_seconds,
            flush=True,
        ),
        Side("cp", ["cp", str(plain), str(copy)], work, output=copy, before=clean(copy), flush=True),
        Side(
            "snakemake",
            ctx.snakemake(work, "--cores", str(ctx.cores), "results/raw/raw.beton"),
            work,
            output=built,
            before=reset_project(work),
            after=after_snakemake,
            flush=True,
        ),
    ]
    parts_stages, after_parts = stage_recorder(work)
    if partitions:
        sides.append(
            Side(
                "snakemake_partitions",
                ctx.snakemake(work, "--cores", str(ctx.cores), "results/raw_parts/raw_parts.beton"),
                work,
                output=work / "results" / "raw_parts" / "raw_parts.beton",
                before=reset_project(work),
                after=after_parts,
                flush=True,
            )
        )
    rounds = alternate(ctx, NAME, sides)
    ratios = [
        ratio(rounds, "betonbuild_write", "plain_ffcv"),
        ratio(rounds, "plain_ffcv", "cp"),
        ratio(rounds, "betonbuild_write", "cp"),
        ratio(rounds, "betonbuild_write", "cp", "seconds_with_flush", " (each + sync)"),
        *(ratio(rounds, side.name, "plain_ffcv") for side in sides[3:]),
    ]
    result = {
        "id": ID,
        "name": NAME,
        "title": TITLE,
        "data": f"{n} samples x (uint8 256x256x3 + int) = {n * data.CROP_BYTES / 2**30:.2f} GiB from a memory-mapped "
        f".npy; {ctx.cores} workers"
        + (f"; snakemake_partitions: partitions: {partitions}" if partitions else "; no partitions in this tree"),
        "sides": summarise(ctx, rounds, sides),
        "ratios": ratios,
        "targets": [],
        "content": "content digests of all the files equal in every round",
        "snakemake_rule_seconds": median_rule_seconds(stages[1:]),  # stages[0] is the warm-up round
        "snakemake_partitions_rule_seconds": median_rule_seconds(parts_stages[1:]),
        "rounds": rounds,
    }
    gib = n * data.CROP_BYTES / 2**30
    result["notes"] = [
        f"throughput (median, whole process): plain ffcv {gib / result['sides']['plain_ffcv']['seconds']['median']:.2f}"
        f" GiB/s, betonbuild write {gib / result['sides']['betonbuild_write']['seconds']['median']:.2f} GiB/s, "
        f"cp {gib / result['sides']['cp']['seconds']['median']:.2f} GiB/s (page cache to page cache)",
        f"in-process write call: plain {median_of(rounds, 'plain_ffcv', 'in_process_seconds'):.2f} s, betonbuild "
        f"{median_of(rounds, 'betonbuild_write', 'in_process_seconds'):.2f} s; sync after each (to disk): "
        + ", ".join(f"{s.name} {median_of(rounds, s.name, 'flush_seconds'):.2f} s" for s in sides),
    ]
    for side in ("snakemake", "snakemake_partitions"):
        if result.get(f"{side}_rule_seconds"):
            result["notes"].append(
                f"{side} jobs (median, summed per rule): "
                + ", ".join(f"{k} {v:.1f} s" for k, v in result[f"{side}_rule_seconds"].items())
            )
    return result
