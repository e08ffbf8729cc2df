"""5. Merge vs ``cp`` of the same bytes on the same disk (issue 6: merge throughput >= 0.8x of cp).

Parts: ``merge_parts`` files written by plain ffcv (1 worker, 8 MiB pages), each of int + 1 MiB of
random bytes per sample. They are made once. The merge of them has the same content digest as the same samples
written as one file, which is checked when they are made.
- ``merge``: ``bench/harness/sides/merge.py``, a fresh process running ``merge_betons(parts, out)``
  as ``rule merge`` does (copy_file_range, then the metadata).
- ``cp_parts``: ``cp part0 ... dir/``. These are the bytes the merge reads, as dense files, so GNU cp
  uses copy_file_range.
- ``cp_merged``: ``cp merged.beton out``. These are the bytes the merge writes. The file is sparse
  (its page padding is holes), so cp uses SEEK_DATA plus read/write.
The target is judged against the faster cp of each round: ``fastest cp / merge`` >= 0.8.
Everything is read from and written to the page cache (caches cannot be dropped without root). Each
round checks that the merge output has the reference content digest, and that the cp copies have
the right sizes.
"""

from __future__ import annotations

from . import data
from .runner import (
    ContentMismatch,
    Context,
    Side,
    alternate,
    clean,
    digest,
    median_of,
    ratio,
    spread,
    summarise,
    target,
)

ID, NAME = 5, "merge"
TITLE = "Merge vs cp of the same bytes"


def run(ctx: Context) -> dict:
    parts = data.merge_parts(ctx.cache / "data", ctx.sizes["merge_parts"], ctx.sizes["merge_part_mib"])
    work = ctx.cache / NAME
    work.mkdir(parents=True, exist_ok=True)
    merged, copy, copies = work / "merged.beton", work / "copy.beton", work / "parts"

    def merge_record(record: dict, stdout: str, stderr: str) -> None:
        import json

        info = json.loads(stdout.strip().splitlines()[-1])
        record.update(in_process_seconds=info["seconds"], method=info["method"])

    sides = [
        Side(
            "merge", ctx.side_script("merge", merged, *parts["parts"]), work, before=clean(merged), after=merge_record
        ),
        Side(
            "cp_parts",
            ["cp", *map(str, parts["parts"]), str(copies)],
            work,
            before=lambda: (clean(copies)(), copies.mkdir()),
        ),
        Side("cp_merged", ["cp", str(parts["reference"]), str(copy)], work, before=clean(copy)),
    ]

    def check(row: dict) -> dict:
        found = digest(merged, min(ctx.cores, 4))
        sizes_ok = copy.stat().st_size == parts["reference"].stat().st_size and sum(
            p.stat().st_size for p in copies.iterdir()
        ) == sum(p.stat().st_size for p in parts["parts"])
        if found != parts["digest"] or not sizes_ok:
            raise ContentMismatch(f"merge output digest {found} (expected {parts['digest']}), cp sizes ok: {sizes_ok}")
        return {"digest": found}

    rounds = alternate(ctx, NAME, sides, check=check)
    for r in rounds:  # the faster cp of each round, as a side of its own
        r["fastest_cp"] = min(r["cp_parts"], r["cp_merged"], key=lambda run: run["seconds"])
    fastest = ratio(rounds, "fastest_cp", "merge")
    inner = [r["fastest_cp"]["seconds"] / r["merge"]["in_process_seconds"] for r in rounds]
    gib = parts["payload_bytes"] / 2**30
    start_up = median_of(rounds, "merge", "seconds") - median_of(rounds, "merge", "in_process_seconds")
    return {
        "id": ID,
        "name": NAME,
        "title": TITLE,
        "data": f"{len(parts['parts'])} parts x {parts['per_part']} samples of int + uint8[1 MiB] random bytes = "
        f"{gib:.2f} GiB of payload",
        "sides": summarise(ctx, rounds, sides),
        "ratios": [fastest],
        "targets": [
            target(
                "merge throughput at least 0.8x of cp of the same bytes (issue 6)",
                fastest["of"],
                ">=",
                0.8,
                fastest["median"],
            )
        ],
        "content": "merge output has the reference digest (= the same samples written as one file) every round; "
        "cp copies have the right sizes",
        "rounds": rounds,
        "notes": [
            f"throughput (median, whole process): merge {gib / median_of(rounds, 'merge', 'seconds'):.2f} GiB/s, "
            f"cp_parts {gib / median_of(rounds, 'cp_parts', 'seconds'):.2f} GiB/s, "
            f"cp_merged {gib / median_of(rounds, 'cp_merged', 'seconds'):.2f} GiB/s",
            f"the merge's own copy (in-process, method {rounds[-1]['merge']['method']}) takes "
            f"{median_of(rounds, 'merge', 'in_process_seconds'):.2f} s: fastest cp / that = "
            f"{spread(inner)['median']:.2f}; the other {start_up:.2f} s of the merge process are Python start-up, "
            "imports (numpy) and exit, a fixed cost that does not grow with the data",
        ],
    }
