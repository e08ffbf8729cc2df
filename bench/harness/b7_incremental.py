"""7. Incremental rebuild after changing 1 of 16 partitions' source vs a clean build (issue 6: <= 0.25x).

A webdataset dataset of 16 shards with ``partitions: 16``, one shard per partition. Both sides run
``snakemake --cores cores all``, which builds the .beton, verifies it and makes the report assets,
as a user would after an edit:
- ``clean``: from an empty project (results, logs, benchmarks and .snakemake removed).
- ``incremental``: right after that, with one shard changed (its first image mirrored; the sample
  count is the same). Issue 6 expects the shard list, the manifest, that one part, the merge and the
  verification to rerun, and nothing else. The jobs that actually ran are recorded.
The shard alternates between its two versions, so each clean build builds the state the previous
incremental build ended in. Content check: for each state, the incremental build and the clean build
produce the same content digest, and the two states' digests differ.
"""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path

from . import data
from .runner import ContentMismatch, Context, Side, alternate, ratio, summarise, target
from .workflow import median_rule_seconds, reset_project, stage_recorder, supports_partitions, write_config

ID, NAME = 7, "incremental"
TITLE = "Incremental rebuild (1 of 16 partitions changed) vs clean build"
GOAL = "rebuild after changing 1 of 16 partitions' source at most 0.25x of the clean build (issue 6)"


def run(ctx: Context) -> dict:
    partitions = ctx.sizes["incremental_partitions"]
    if not supports_partitions(ctx.tree):
        return {
            "id": ID,
            "name": NAME,
            "title": TITLE,
            "status": "pending",
            "target_text": "<= 0.25",
            "reason": "the measured tree has no `partitions:` in its config schema yet (issue 6 is in progress), "
            f"so a dataset is one write job and there is no partition to change. Target: {GOAL}.",
        }
    n = ctx.sizes["incremental_samples"]
    source, pattern = data.shards(ctx.cache / "data", n, partitions)
    work = ctx.cache / NAME
    shards = work / "shards"
    shutil.rmtree(shards, ignore_errors=True)
    shutil.copytree(source, shards, ignore=shutil.ignore_patterns("spec.json"))
    changed = shards / f"train-{partitions // 2:04d}.tar"
    versions = [work / "original.tar", work / "mirrored.tar"]
    shutil.copyfile(changed, versions[0])
    mirror_first_image(changed, versions[1])
    write_config(
        work,
        {
            "inc": {
                "source": {
                    "kind": "webdataset",
                    "shards": pattern.replace(str(source), str(shards)),
                    "keys": {"image": "jpg", "label": "cls"},
                    "decode": "rgb8",
                },
                "fields": {
                    "image": {"type": "rgb_image", "write_mode": "jpg", "jpeg_quality": 90},
                    "label": {"type": "int"},
                },
                "partitions": partitions,
            }
        },
    )
    built = work / "results" / "inc" / "inc.beton"
    state = {"version": 0}
    digests: dict[int, str] = {}

    def toggle() -> None:
        state["version"] = 1 - state["version"]
        shutil.copyfile(versions[state["version"]], changed)  # a new mtime and new content

    clean_stages, clean_after = stage_recorder(work)
    inc_stages, inc_after = stage_recorder(work)

    def after(recorder):
        def hook(record: dict, stdout: str, stderr: str) -> None:
            recorder(record, stdout, stderr)
            record["version"] = state["version"]

        return hook

    sides = [
        Side(
            "clean",
            ctx.snakemake(work, "--cores", str(ctx.cores), "all"),
            work,
            output=built,
            before=reset_project(work),
            after=after(clean_after),
        ),
        Side(
            "incremental",
            ctx.snakemake(work, "--cores", str(ctx.cores), "all"),
            work,
            output=built,
            before=toggle,
            after=after(inc_after),
        ),
    ]

    def check(row: dict) -> dict:
        for side in ("clean", "incremental"):
            version, found = row[side]["version"], row[side]["digest"]
            if digests.setdefault(version, found) != found:
                raise ContentMismatch(
                    f"state {version}: {side} build has digest {found}, another build {digests[version]}"
                )
        if len(set(digests.values())) != len(digests):
            raise ContentMismatch("changing the shard did not change the content digest")
        return {"digest_by_state": dict(digests)}

    rounds = alternate(ctx, NAME, sides, check=check)
    share = ratio(rounds, "incremental", "clean")
    jobs = rounds[-1]["incremental"]["jobs"]
    return {
        "id": ID,
        "name": NAME,
        "title": TITLE,
        "data": f"{partitions} WebDataset shards, {n} JPEG q90 crops -> rgb_image jpg q90 + int label, "
        f"partitions: {partitions}; shard {changed.name} alternates between two versions",
        "sides": summarise(ctx, rounds, sides),
        "ratios": [share],
        "targets": [target(GOAL, share["of"], "<=", 0.25, share["median"])],
        "content": "for each shard version, the clean and the incremental build have the same content digest; the "
        "two versions' digests differ",
        "rounds": rounds,
        "notes": [
            "jobs the incremental build ran: " + ", ".join(f"{k} {v}" for k, v in jobs.items()),
            "clean build, seconds per rule (median): "
            + ", ".join(f"{k} {v:.1f}" for k, v in median_rule_seconds(clean_stages[1:]).items()),
            "incremental build, seconds per rule (median): "
            + ", ".join(f"{k} {v:.1f}" for k, v in median_rule_seconds(inc_stages[1:]).items()),
        ],
    }


def mirror_first_image(source: Path, target: Path) -> None:
    """A copy of the shard whose first ``.jpg`` member is mirrored: one sample's content changes."""
    from PIL import Image, ImageOps

    done = False
    with tarfile.open(source) as tin, tarfile.open(target, "w") as tout:
        for member in tin:
            payload = tin.extractfile(member).read() if member.isfile() else b""
            if member.isfile() and member.name.endswith(".jpg") and not done:
                out = io.BytesIO()
                ImageOps.mirror(Image.open(io.BytesIO(payload))).save(out, format="JPEG", quality=90)
                payload, done = out.getvalue(), True
            info = tarfile.TarInfo(member.name)
            info.size, info.mtime, info.mode = len(payload), member.mtime, member.mode
            tout.addfile(info, io.BytesIO(payload))
