"""1. JPEG write: betonbuild vs one plain ffcv ``DatasetWriter(num_workers=cores)`` process (issue 6).

The JPEG-bound case: every sample is a 256x256 crop encoded at q90, so both sides spend most of
their CPU in libjpeg-turbo. The source is a memory-mapped ``.npy`` so that nobody pays for decoding.
- ``plain_ffcv``: ``bench/harness/sides/plain_write.py`` (ffcv's documented indexed-dataset write);
- ``betonbuild_write``: ``betonbuild write --workers cores`` (source manifest incl. sha256 of the
  .npy, checked samples, the same ffcv encode);
- ``snakemake``: ``snakemake --cores cores results/jpeg/jpeg.beton`` from a clean project: manifest,
  smoke write + its verification gate, and one write job. The full verification is excluded, as
  issue 6 asks.
- ``snakemake_partitions``: the same dataset with ``partitions: cores`` (the case issue 6 names):
  one write_part job per part, one writer worker each, then the merge.
``betonbuild write`` gets the dataset without ``partitions:``, since it writes the whole file anyway.
Both encode the same pixels with the same cv2 call at the same quality, so the files have the same
content digest; it is checked in every round.
"""

from __future__ import annotations

from . import data
from .runner import Context, Side, alternate, clean, inner_seconds, median_of, ratio, summarise, target
from .workflow import median_rule_seconds, reset_project, stage_recorder, supports_partitions, write_config

ID, NAME = 1, "jpeg_write"
TITLE = "JPEG write: betonbuild vs plain ffcv DatasetWriter"


def run(ctx: Context) -> dict:
    n = ctx.sizes["jpeg_samples"]
    images, labels = data.crops(ctx.cache / "data", n)
    work = ctx.cache / NAME
    partitions = ctx.cores if supports_partitions(ctx.tree) else None
    spec = {
        "source": {"kind": "arrays", "columns": {"image": str(images), "label": str(labels)}},
        "fields": {"image": {"type": "rgb_image", "write_mode": "jpg", "jpeg_quality": 90}, "label": {"type": "int"}},
    }
    write_config(work, {"jpeg": spec, **({"jpeg_parts": {**spec, "partitions": partitions}} if partitions else {})})
    plain, ours = work / "plain.beton", work / "betonbuild.beton"
    built = work / "results" / "jpeg" / "jpeg.beton"
    stages, after_snakemake = stage_recorder(work)
    sides = [
        Side(
            "plain_ffcv",
            ctx.side_script("plain_write", images, labels, plain, ctx.cores, "jpg"),
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
        Side(
            "snakemake",
            ctx.snakemake(work, "--cores", str(ctx.cores), "results/jpeg/jpeg.beton"),
            work,
            output=built,
            before=reset_project(work),
            after=after_snakemake,
        ),
    ]
    parts_stages, after_parts = stage_recorder(work)
    if partitions:
        sides.append(
            Side(
                "snakemake_partitions",
                ctx.snakemake(work, "--cores", str(ctx.cores), "results/jpeg_parts/jpeg_parts.beton"),
                work,
                output=work / "results" / "jpeg_parts" / "jpeg_parts.beton",
                before=reset_project(work),
                after=after_parts,
            )
        )
    rounds = alternate(ctx, NAME, sides)
    ratios = [ratio(rounds, side.name, "plain_ffcv") for side in sides[1:]]
    goal = "betonbuild no slower than plain ffcv (issue 6), verification excluded"
    result = {
        "id": ID,
        "name": NAME,
        "title": TITLE,
        "data": f"{n} crops 256x256 (memory-mapped .npy, {n * data.CROP_BYTES / 2**30:.1f} GiB) -> rgb_image jpg q90 "
        f"+ int label; {ctx.cores} workers"
        + (f"; snakemake_partitions: partitions: {partitions}" if partitions else "; no partitions in this tree"),
        "sides": summarise(ctx, rounds, sides),
        "ratios": ratios,
        "targets": [target(goal, r["of"], "<=", 1.0, r["median"]) for r in ratios],
        "content": "content digests of all the files equal in every round",
        "snakemake_rule_seconds": median_rule_seconds(stages[1:]),  # stages[0] is the warm-up round
        "snakemake_partitions_rule_seconds": median_rule_seconds(parts_stages[1:]),
        "rounds": rounds,
    }
    result["notes"] = notes(result)
    return result


def notes(result: dict) -> list[str]:
    """Where the time goes: in-process write time vs whole process, and the workflow's stages."""
    sides = result["sides"]
    out = []
    for name in ("plain_ffcv", "betonbuild_write"):
        whole, inner_median = sides[name]["seconds"]["median"], median_of(result["rounds"], name, "in_process_seconds")
        out.append(
            f"{name}: {whole:.2f} s whole process, of which {inner_median:.2f} s inside the write call "
            f"(the rest: interpreter, imports, {'the source manifest, ' if name != 'plain_ffcv' else ''}exit)"
        )
    for side in ("snakemake", "snakemake_partitions"):
        if result.get(f"{side}_rule_seconds"):
            jobs = ", ".join(f"{k} {v:.1f} s" for k, v in result[f"{side}_rule_seconds"].items())
            out.append(f"{side} jobs (median, summed per rule): {jobs}")
    return out
