"""8. The workflow's own scale and fixed cost (issue 10; the issues set no number, so both are reported).

a) DAG: ``snakemake -n all`` on a generated config of 200 datasets x 16 partitions (thousands of
   jobs) vs the same for one dataset: wall time and peak RSS of Snakemake itself. The source
   manifests are checkpoints, so they are built first (untimed, kept between runs). Otherwise the
   dry run could not see past them. Without ``partitions:`` in the measured tree, the datasets are
   unpartitioned, and the notes say so.
b) Fixed overhead: one dataset of ONE sample (a 256x256 JPEG crop), end to end with
   ``snakemake --cores cores all`` (manifest, smoke write + gate, write, full verification, report
   assets) from a clean project. It is compared with ``betonbuild write`` and with plain ffcv writing
   that one sample. The three files have the same content digest.
"""

from __future__ import annotations

import subprocess

import numpy as np

from . import data
from .runner import Context, Side, alternate, clean, median_of, ratio, summarise
from .workflow import jobs_run, median_rule_seconds, reset_project, stage_recorder, supports_partitions, write_config

ID, NAME = 8, "workflow_scale"
KEEP_WORKDIR = True  # the 200 built source manifests take minutes to make again
TITLE = "Workflow scale: dry-run DAG of many datasets, fixed cost of a one-sample dataset"


def run(ctx: Context) -> dict:
    dag = dry_runs(ctx)
    overhead = one_sample(ctx)
    return {
        "id": ID,
        "name": NAME,
        "title": TITLE,
        "data": f"{dag['data']}; {overhead['data']}",
        "sides": {**dag["sides"], **overhead["sides"]},
        "ratios": dag["ratios"] + overhead["ratios"],
        "targets": [],
        "content": overhead["content"],
        "rounds": dag["rounds"] + overhead["rounds"],
        "notes": dag["notes"] + overhead["notes"],
    }


def dry_runs(ctx: Context) -> dict:
    count, partitions = ctx.sizes["scale_datasets"], ctx.sizes["scale_partitions"]
    partitioned = supports_partitions(ctx.tree)
    root = ctx.cache / NAME
    x, y = root / "x.npy", root / "y.npy"
    root.mkdir(parents=True, exist_ok=True)
    np.save(x, np.arange(partitions * 4 * 8, dtype=np.uint8).reshape(-1, 8))
    np.save(y, np.arange(partitions * 4, dtype=np.int64))
    spec = {
        "source": {"kind": "arrays", "columns": {"x": str(x), "y": str(y)}},
        "fields": {"x": {"type": "ndarray", "dtype": "uint8", "shape": [8]}, "y": {"type": "int"}},
        **({"partitions": partitions} if partitioned else {}),
    }
    projects = {}
    for size in (1, count):
        work = root / f"datasets-{size}"
        write_config(work, {f"ds{k:03d}": spec for k in range(size)})
        manifests = [f"results/ds{k:03d}/source.json" for k in range(size)]
        print(f"  building the {size} source manifests of {work.name} (untimed)", flush=True)
        subprocess.run(
            ctx.snakemake(work, "--cores", str(ctx.cores), *manifests),
            cwd=work,
            env=ctx.env(),
            check=True,
            capture_output=True,
        )
        projects[size] = work

    def planned(record: dict, stdout: str, stderr: str) -> None:
        record["jobs"] = sum(jobs_run(stdout + stderr).values())

    sides = [
        Side(f"dry_run_{size}", ctx.snakemake(work, "-n", "all"), work, after=planned)
        for size, work in projects.items()
    ]
    rounds = alternate(ctx, f"{NAME}-dag", sides, check=lambda row: {})
    big, small = sides[1].name, sides[0].name
    jobs = rounds[-1][big]["jobs"]
    stats = summarise(ctx, rounds, sides)
    seconds = stats[big]["seconds"]["median"] - stats[small]["seconds"]["median"]
    return {
        "data": f"dry run: {count} datasets x "
        + (f"{partitions} partitions" if partitioned else "1 write job each (no partitions in this tree)"),
        "sides": stats,
        "ratios": [ratio(rounds, big, small)],
        "rounds": rounds,
        "notes": [
            f"`snakemake -n all` plans {jobs} jobs for {count} datasets in "
            f"{stats[big]['seconds']['median']:.1f} s "
            f"({1000 * seconds / max(1, jobs - rounds[-1][small]['jobs']):.1f} ms per job beyond the one-dataset "
            f"run), peak RSS {stats[big]['max_rss_mib']} MiB (one dataset: {stats[small]['max_rss_mib']} MiB)"
        ],
    }


def one_sample(ctx: Context) -> dict:
    images, labels = data.crops(ctx.cache / "data", 1, seed=7)
    work = ctx.cache / NAME / "one-sample"
    write_config(
        work,
        {
            "one": {
                "source": {"kind": "arrays", "columns": {"image": str(images), "label": str(labels)}},
                "fields": {
                    "image": {"type": "rgb_image", "write_mode": "jpg", "jpeg_quality": 90},
                    "label": {"type": "int"},
                },
            }
        },
    )
    plain, ours, built = work / "plain.beton", work / "betonbuild.beton", work / "results" / "one" / "one.beton"
    stages, after = stage_recorder(work)
    sides = [
        Side(
            "one_sample_plain_ffcv",
            ctx.side_script("plain_write", images, labels, plain, 1, "jpg"),
            work,
            output=plain,
            before=clean(plain),
        ),
        Side(
            "one_sample_betonbuild_write",
            ctx.betonbuild("write", "--config", "config.yaml", "--dataset", "one", "--output", str(ours)),
            work,
            output=ours,
            before=clean(ours, work / "betonbuild.beton.write.json"),
        ),
        Side(
            "one_sample_snakemake_all",
            ctx.snakemake(work, "--cores", str(ctx.cores), "all"),
            work,
            output=built,
            before=reset_project(work),
            after=after,
        ),
    ]
    rounds = alternate(ctx, f"{NAME}-one", sides)
    per_rule = median_rule_seconds(stages[1:])
    return {
        "data": "one-sample dataset: one 256x256 crop as jpg q90 + int label",
        "sides": summarise(ctx, rounds, sides),
        "ratios": [
            ratio(rounds, "one_sample_snakemake_all", "one_sample_plain_ffcv"),
            ratio(rounds, "one_sample_betonbuild_write", "one_sample_plain_ffcv"),
        ],
        "content": "one-sample files: content digests equal in every round",
        "rounds": rounds,
        "notes": [
            f"fixed end-to-end cost of a one-sample dataset: {median_of(rounds, sides[2].name, 'seconds'):.1f} s; "
            "its jobs (seconds, median): "
            + ", ".join(f"{k} {v:.1f}" for k, v in per_rule.items())
            + f" (sum {sum(per_rule.values()):.1f} s; the rest is Snakemake's own start-up, DAG and scheduling)"
        ],
    }
