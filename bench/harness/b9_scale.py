"""9. Scale (issue 16): three source families at 10k, 100k and 1M samples, and 20M rows, vs plain ffcv.

Each case (family, N) is generated locally into its own directory, measured, and removed:
- ``folder``: an ImageNet layout, 1,000 class folders ``n%08d/`` (N classes below 1,000 samples)
  of 32x32 JPEG q90 files ``<class>_<k>.JPEG``;
- ``arrays``: ``.npy`` columns ``x`` float32[4] (seeded normal) + ``label`` int64;
- ``webdataset``: tar shards of 1,000 samples (``jpg`` + ``cls``), the same JPEGs and labels.
The JPEGs: 500 distinct seeded 256x256 crops of the bundled colour photographs, box-downscaled to
32x32 and encoded once; sample k is image k % 500 with a JPEG comment naming k inserted after its
JFIF header. So every file is a valid, unique JPEG (its own sha256), while the pixels repeat
every 500 samples. Every sample is still opened, decoded and re-encoded by both sides.

Sides of a case, run in this order in each round (``scale_pairs`` rounds, default 1, no warm-up
round: the generation has just filled the page cache, and a 1M case takes minutes); with
``--scale-case-partitions P`` every case's dataset has ``partitions: P`` (issue 16: 1,000):
- ``plain_ffcv``: a whole-process plain ffcv write of the same data (``sides/plain_folder.py``,
  ``sides/plain_columns.py``, ``sides/plain_wds.py``), 100 samples per chunk, ``cores`` workers;
- ``build``: ``snakemake --cores cores all`` from a clean project (listing, manifest, smoke, gate,
  write, verification (``verify.mode: auto``: full up to 100,000 samples, sampled above; ``full``
  with ``--scale-verify full``), report assets); each job's wall time, ``max_rss`` and ``max_pss``
  from its Snakemake benchmark file;
- ``dry_run``: ``snakemake -n all`` on the built project; ``noop``: ``snakemake --cores cores all`` again.
The content check of every round: the plain file and the built file have the same content digest;
the dry run and the no-op run plan and run no job (else the notes say which).

Above ``PLAIN_MAX_ROWS`` rows (``--scale-rows 100000000``, the issue's 100M target) plain ffcv would
run out of memory: the rows case is the build alone, its target every job's peak RSS <= 4 GB.

Derived: full build / plain per case; for arrays the write job alone / plain (same chunksize);
per-sample seconds of every job (and of Snakemake itself: the build's wall time minus its jobs')
and their growth, largest N / smallest N; the largest job's peak RSS. The growth curve is drawn
beside RESULTS.md (``scale.png``, with ``scale.csv``) from results.json by report.py.
"""

from __future__ import annotations

import shutil
import statistics

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
    same_digests,
    summarise,
)
from .runner import target as make_target
from .workflow import jobs_run, reset_project, rule_records, write_config

ID, NAME = 9, "scale"
TITLE = "Scale: image folder, arrays and shards from 10k to 1M samples (and 20M rows) vs plain ffcv"
FAMILIES = ("folder", "arrays", "webdataset")
POOL = 500  # distinct JPEGs
CHUNK = 100  # samples per chunk handed to a writer worker, both sides
DATASET = "scale"
SNAKEMAKE_ITSELF = "snakemake_itself"  # the build's wall time minus the sum of its jobs' (DAG, scheduling, start-up)
GB_IN_MIB = 1e9 / 2**20
GROWTH_LIMIT = 1.25
# plain ffcv's writer holds ~500 bytes a sample (9.8 GB at 20M rows): above this many rows it would run
# out of memory, so the rows case runs the build alone (`--scale-rows 100000000`: the 100M target)
PLAIN_MAX_ROWS = 30_000_000
RSS_100M_GB = 4.0
FIELDS_IMAGE = {"image": {"type": "rgb_image", "write_mode": "jpg", "jpeg_quality": 90}, "label": {"type": "int"}}
PLOT = {"file": "scale.png", "csv": "scale.csv"}


def counts(text) -> list[int]:
    """``"10000,100000"`` -> [10000, 100000]; zeros dropped."""
    return sorted({int(part) for part in str(text).replace(" ", "").split(",") if part and int(part) > 0})


def run(ctx: Context) -> dict:
    families = [f for f in str(ctx.sizes["scale_families"]).split(",") if f]
    unknown = set(families) - set(FAMILIES)
    if unknown:
        raise ValueError(f"--scale-families: unknown {sorted(unknown)}; choose from {', '.join(FAMILIES)}")
    pool = data.tiny_jpegs(POOL)
    cases = [measure_case(ctx, family, n, pool) for family in families for n in counts(ctx.sizes["scale_samples"])]
    if ctx.sizes["scale_rows"] > 0:
        cases.append(measure_case(ctx, "arrays", ctx.sizes["scale_rows"], pool, tag=f"rows_{ctx.sizes['scale_rows']}"))
    return assemble(cases, ctx.sizes["scale_verify"])


def prepare(ctx: Context, family: str, n: int, pool: list[bytes], work) -> tuple[dict, list[str]]:
    """The case's data and config; (dataset spec, plain ffcv command)."""
    source = work / "data"
    plain = work / "plain.beton"
    if family == "folder":
        root = data.scale_folder(source / "folder", n, pool)
        spec = {"source": {"kind": "image_folder", "root": str(root)}, "fields": FIELDS_IMAGE}
        command = ctx.side_script("plain_folder", root, plain, ctx.cores, CHUNK)
    elif family == "arrays":
        x, label = data.scale_arrays(source / "arrays", n)
        spec = {
            "source": {"kind": "arrays", "columns": {"x": str(x), "label": str(label)}},
            "fields": {"x": {"type": "ndarray", "dtype": "float32", "shape": [4]}, "label": {"type": "int"}},
        }
        command = ctx.side_script("plain_columns", x, label, plain, ctx.cores, CHUNK)
    else:
        pattern = data.scale_shards(source / "shards", n, pool, ctx.sizes["scale_shard_samples"])
        spec = {
            "source": {"kind": "webdataset", "shards": pattern, "keys": {"image": "jpg", "label": "cls"}},
            "fields": FIELDS_IMAGE,
        }
        command = ctx.side_script("plain_wds", pattern, plain, ctx.cores)  # from_webdataset: chunks of 100 too
    verify = {"mode": ctx.sizes["scale_verify"]}
    parts = {"partitions": ctx.sizes["scale_case_partitions"]} if ctx.sizes["scale_case_partitions"] else {}
    write_config(work, {DATASET: {**spec, **parts, "writer": {"chunksize": CHUNK}, "verify": verify}})
    return spec, command


def measure_case(ctx: Context, family: str, n: int, pool: list[bytes], tag: str = "") -> dict:
    parts = ctx.sizes["scale_case_partitions"]
    tag = tag or f"{family}_{n}" + (f"_in_{parts}_partitions" if parts else "")
    work = ctx.cache / NAME / tag
    shutil.rmtree(work, ignore_errors=True)
    print(f"  {tag}: generating {n} samples in {work}", flush=True)
    try:
        _, plain_command = prepare(ctx, family, n, pool, work)
        return _measure(ctx, family, n, tag, work, plain_command)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # GBs at 1M; made again in a minute


def _measure(ctx: Context, family: str, n: int, tag: str, work, plain_command: list[str]) -> dict:
    plain, built = work / "plain.beton", work / "results" / DATASET / f"{DATASET}.beton"
    with_plain = not (tag.startswith("rows") and n > PLAIN_MAX_ROWS)
    jobs_per_round: list[dict] = []

    def after_build(record: dict, stdout: str, stderr: str) -> None:
        jobs_per_round.append(rule_records(work, since=record["started_at"]))
        record["jobs"] = jobs_run(stderr)

    def planned(record: dict, stdout: str, stderr: str) -> None:
        record["jobs"] = jobs_run(stdout + stderr)

    names = {k: f"{tag}_{k}" for k in ("plain_ffcv", "build", "dry_run", "noop")}
    sides = [
        *(
            [Side(names["plain_ffcv"], plain_command, work, output=plain, before=clean(plain), after=inner_seconds)]
            if with_plain
            else []
        ),
        Side(
            names["build"],
            ctx.snakemake(work, "--cores", str(ctx.cores), "all"),
            work,
            output=built,
            before=reset_project(work),
            after=after_build,
        ),
        Side(names["dry_run"], ctx.snakemake(work, "-n", "all"), work, after=planned),
        Side(names["noop"], ctx.snakemake(work, "--cores", str(ctx.cores), "all"), work, after=planned),
    ]

    def check(row: dict) -> dict:
        content = same_digests(row, sides) if with_plain else {"digest": row[names["build"]]["digest"], "sides": []}
        if not row[names["build"]]["jobs"]:
            raise ContentMismatch(f"{tag}: the clean build ran no job")
        content["not_noop"] = {k: row[names[k]]["jobs"] for k in ("dry_run", "noop") if row[names[k]]["jobs"]}
        return content

    rounds = alternate(ctx, f"{NAME}-{tag}", sides, check=check, pairs=ctx.sizes["scale_pairs"], warmup=False)
    stats = summarise(ctx, rounds, sides)
    build_s = stats[names["build"]]["seconds"]["median"]
    plain_s = stats[names["plain_ffcv"]]["seconds"]["median"] if with_plain else None
    case = {
        "family": family,
        "n": n,
        "tag": tag,
        "sides": stats,
        "rounds": rounds,
        "seconds": {k: stats[v]["seconds"]["median"] if v in stats else plain_s for k, v in names.items()},
        "plain_rss_mib": stats[names["plain_ffcv"]]["max_rss_mib"] if with_plain else None,
        "plain_in_process_s": median_of(rounds, names["plain_ffcv"], "in_process_seconds") if with_plain else None,
        "build_largest_process_rss_mib": stats[names["build"]]["max_rss_mib"],
        "jobs": job_costs(jobs_per_round, n, build_s),
        "not_noop": [r["content"]["not_noop"] for r in rounds if r["content"]["not_noop"]],
        "ratios": [ratio(rounds, names["build"], names["plain_ffcv"], label=f" ({family}, {n} samples)")]
        if with_plain
        else [],
    }
    if family == "arrays" and with_plain and all("write" in jobs for jobs in jobs_per_round):  # not partitioned
        case["ratios"].append(write_job_ratio(rounds, jobs_per_round, names, family, n))
    return case


def job_costs(jobs_per_round: list[dict], n: int, build_seconds: float) -> dict:
    """Per rule: median wall seconds, peak max_rss/max_pss (MiB) over the rounds, and seconds per sample;
    plus Snakemake itself (the build's median wall time minus the jobs' sum: it runs them one after another
    here, a single dataset's chain)."""
    rules = sorted({rule for run in jobs_per_round for rule in run})
    costs = {}
    for rule in rules:
        seconds = statistics.median(run[rule]["s"] for run in jobs_per_round if rule in run)
        peaks = {
            key: [run[rule][key] for run in jobs_per_round if run.get(rule, {}).get(key) is not None]
            for key in ("max_rss", "max_pss")
        }
        costs[rule] = {
            "s": round(seconds, 3),
            "max_rss_mib": max(peaks["max_rss"]) if peaks["max_rss"] else None,
            "max_pss_mib": max(peaks["max_pss"]) if peaks["max_pss"] else None,
            "s_per_sample": seconds / n,
        }
    itself = max(0.0, build_seconds - sum(c["s"] for c in costs.values()))
    costs[SNAKEMAKE_ITSELF] = {
        "s": round(itself, 3),
        "max_rss_mib": None,
        "max_pss_mib": None,
        "s_per_sample": itself / n,
    }
    return costs


def write_job_ratio(rounds: list[dict], jobs_per_round: list[dict], names: dict, family: str, n: int) -> dict:
    """The write job alone (its benchmark file's wall time) / plain ffcv's whole process, per round."""
    pseudo = [
        {
            "write_job": {"seconds": jobs["write"]["s"], "other_cores": row[names["build"]]["other_cores"]},
            "plain_ffcv": row[names["plain_ffcv"]],
        }
        for row, jobs in zip(rounds, jobs_per_round, strict=True)
    ]
    found = ratio(pseudo, "write_job", "plain_ffcv", label=f" ({family}, {n} samples, chunksize {CHUNK})")
    return {**found, "of": f"{names['build']} write job / {names['plain_ffcv']}{found['of'].split('plain_ffcv', 1)[1]}"}


def growth(cases: list[dict]) -> dict[str, dict]:
    """Per family (the N cases, not the rows case): per stage, seconds per sample at the largest N /
    at the smallest N. Only stages both ran; none with a single N."""
    out = {}
    for family in FAMILIES:
        found = sorted(
            (c for c in cases if c["family"] == family and not c["tag"].startswith("rows")), key=lambda c: c["n"]
        )
        if len(found) < 2:
            continue
        small, large = found[0], found[-1]
        stages = sorted(set(small["jobs"]) & set(large["jobs"]))
        out[family] = {
            "from": small["n"],
            "to": large["n"],
            "stages": {
                stage: round(large["jobs"][stage]["s_per_sample"] / small["jobs"][stage]["s_per_sample"], 3)
                for stage in stages
                if small["jobs"][stage]["s_per_sample"] > 0
            },
        }
    return out


def largest_job(case: dict) -> tuple[str, float | None]:
    """(rule, max_rss MiB) of the case's job with the highest peak RSS."""
    measured = [(c["max_rss_mib"], rule) for rule, c in case["jobs"].items() if c["max_rss_mib"] is not None]
    if not measured:
        return "?", None
    rss, rule = max(measured)
    return rule, rss


def growth_of(family: str, info: dict, stage: str = "") -> str:
    where = stage or "worst stage"
    return f"{family} {where}: s/sample at {info['to']} / at {info['from']}"


def worst_stage(info: dict) -> tuple[str, float]:
    stage = max(info["stages"], key=info["stages"].get)
    return stage, info["stages"][stage]


def targets(cases: list[dict], growths: dict) -> list[dict]:
    """The issue's targets that these cases measure: at the largest folder case, build / plain <= 1.3,
    dry run <= 10 s, no-op <= 5 s (the issue: 1.28M files); per family, its worst stage's growth <= 1.25
    (every stage's in ``growth_table``); the rows case's write job / plain <= 1.0 and largest job's peak
    RSS <= 2.5 GB (Snakemake's max_rss, GB = 10^9 bytes)."""
    found = []
    folders = sorted((c for c in cases if c["family"] == "folder"), key=lambda c: c["n"])
    if folders:
        big = folders[-1]
        build = big["ratios"][0]
        found.append(
            make_target(
                "full build / plain ffcv <= 1.3x (issue 16, 1.28M images)", build["of"], "<=", 1.3, build["median"]
            )
        )
        for side, limit in (("dry_run", 10.0), ("noop", 5.0)):
            what = "`snakemake -n all`" if side == "dry_run" else "no-op `snakemake all`"
            found.append(
                make_target(
                    f"{what} <= {limit:g} s (issue 16, 1.28M images)",
                    f"{big['tag']} {what} seconds",
                    "<=",
                    limit,
                    big["seconds"][side],
                )
            )
    for family, info in growths.items():
        if info["stages"]:
            stage, value = worst_stage(info)
            text = f"per-sample cost of every stage, largest N vs smallest, <= 1.25x (issue 16; worst: {stage})"
            found.append(make_target(text, growth_of(family, info), "<=", GROWTH_LIMIT, value))
    for case in (c for c in cases if c["tag"].startswith("rows")):
        rule, rss = largest_job(case)
        if case["n"] > PLAIN_MAX_ROWS:  # the build alone: it completes, within the 4 GB
            found.append(
                make_target(
                    f"{case['n']:,} rows complete, peak RSS of every job <= {RSS_100M_GB:g} GB (issue 16, 100M rows)",
                    f"{case['tag']} largest job ({rule}) max_rss MiB",
                    "<=",
                    round(GB_IN_MIB * RSS_100M_GB),
                    rss,
                )
            )
            continue
        write = next(r for r in case["ratios"] if "write job" in r["of"])
        found.append(
            make_target(
                "write job / plain ffcv, same chunksize, <= 1.0x (issue 16, 20M rows)",
                write["of"],
                "<=",
                1.0,
                write["median"],
            )
        )
        found.append(
            make_target(
                "peak RSS of the largest job <= 2.5 GB (issue 16, 20M rows)",
                f"{case['tag']} largest job ({rule}) max_rss MiB",
                "<=",
                round(GB_IN_MIB * 2.5),
                rss,
            )
        )
    return found


def growth_table(growths: dict) -> list[str]:
    """Markdown: every stage's growth per family, against the issue's 1.25x."""
    lines = ["| family | stage | s/sample at largest N / at smallest N | <= 1.25 |", "|---|---|---|---|"]
    for family, info in growths.items():
        for stage, value in info["stages"].items():
            met = "**met**" if value <= GROWTH_LIMIT else "**missed**"
            lines.append(f"| {family} | {stage} ({info['to']} vs {info['from']}) | {value:.2f} | {met} |")
    return lines


def cost_table(cases: list[dict]) -> list[str]:
    """Markdown: per case, every stage's seconds, µs per sample and peak RSS."""
    lines = ["| case | stage | s | µs / sample | max_rss MiB | max_pss MiB |", "|---|---|---|---|---|---|"]
    for case in cases:
        for stage, c in case["jobs"].items():
            rss = "" if c["max_rss_mib"] is None else f"{c['max_rss_mib']:.0f}"
            pss = "" if c["max_pss_mib"] is None else f"{c['max_pss_mib']:.0f}"
            lines.append(f"| {case['tag']} | {stage} | {c['s']:.2f} | {1e6 * c['s_per_sample']:.1f} | {rss} | {pss} |")
    return lines


def curves(cases: list[dict]) -> dict:
    """What the growth plot draws: per family, per stage (and plain ffcv's and the build's whole processes),
    [N, µs per sample] points (N cases only)."""
    out: dict = {}
    for case in sorted(cases, key=lambda c: c["n"]):
        if case["tag"].startswith("rows"):
            continue
        series = {stage: c["s_per_sample"] for stage, c in case["jobs"].items()}
        series["plain_ffcv (whole)"] = case["seconds"]["plain_ffcv"] / case["n"]
        series["build (whole)"] = case["seconds"]["build"] / case["n"]
        for stage, seconds in series.items():
            out.setdefault(case["family"], {}).setdefault(stage, []).append([case["n"], round(1e6 * seconds, 3)])
    return out


def case_note(case: dict) -> str:
    s = case["seconds"]
    rule, rss = largest_job(case)
    jobs = ", ".join(f"{k} {v['s']:.1f} s" for k, v in case["jobs"].items())
    extra = f"; NOT a no-op: {case['not_noop']}" if case["not_noop"] else ""
    plain = (
        f"plain ffcv {s['plain_ffcv']:.1f} s ({case['plain_in_process_s']:.1f} s inside the write, "
        f"peak RSS {case['plain_rss_mib']} MiB)"
        if s["plain_ffcv"] is not None
        else f"plain ffcv not run (above {PLAIN_MAX_ROWS:,} rows it runs out of memory)"
    )
    return (
        f"{case['tag']}: {plain}, full build "
        f"{s['build']:.1f} s ({jobs}), largest job {rule} max_rss {rss} MiB (largest single process of the build "
        f"{case['build_largest_process_rss_mib']} MiB); `snakemake -n all` {s['dry_run']:.1f} s, no-op "
        f"{s['noop']:.1f} s{extra}"
    )


def assemble(cases: list[dict], verify_mode: str = "auto") -> dict:
    growths = growth(cases)
    ratios = [r for case in cases for r in case["ratios"]]
    described = ", ".join(c["tag"] for c in cases)
    return {
        "id": ID,
        "name": NAME,
        "title": TITLE,
        "data": f"cases {described}; 32x32 JPEG q90 (500 distinct images, each sample's file made unique by a "
        "JPEG comment), float32[4] + int64 .npy columns, shards of 1,000 samples; generated per case, removed "
        f"after it; verify.mode {verify_mode}",
        "sides": {name: stats for case in cases for name, stats in case["sides"].items()},
        "ratios": ratios,
        "targets": targets(cases, growths),
        "content": "content digests of plain ffcv's file and the built file equal in every round of every case",
        "cases": [{k: v for k, v in case.items() if k not in ("sides", "rounds")} for case in cases],
        "growth": growths,
        "plot": {**PLOT, "curves": curves(cases)},
        "tables": [
            "Per-sample cost growth of every stage (the issue: <= 1.25x from 10k to 1M samples"
            + (
                "; `verify.mode: auto` samples above 100,000 samples, so verify's cost per sample falls there):"
                if verify_mode == "auto"
                else "):"
            ),
            "",
            *growth_table(growths),
            "",
            "Seconds, µs per sample and peak RSS of every job (Snakemake's benchmark files):",
            "",
            *cost_table(cases),
        ],
        "rounds": [row for case in cases for row in case["rounds"]],
        "pairs": max((len(case["rounds"]) for case in cases), default=0),  # scale_pairs, no warm-up round
        "warmup": False,
        "notes": [
            f"growth curve (µs per sample of every stage against N): [{PLOT['file']}]({PLOT['file']}), "
            f"the points as [{PLOT['csv']}]({PLOT['csv']})",
            "per-job peak RSS is Snakemake's max_rss: the job's process tree summed (workers included), sampled "
            "every 0.5 s for 30 s, then every 30 s",
            *(case_note(case) for case in cases),
        ],
    }
