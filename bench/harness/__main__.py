"""``python -m bench.harness``: runs the benchmarks of issue 10 and records them (see bench/harness/__init__.py).

    .venv/bin/python -m bench.harness [--only 1 4] [--quick] [--pairs 5] [--tree COMMIT|worktree|DIR]
    .venv/bin/python -m bench.harness --render

By default it measures the last commit (``--tree HEAD``, or any commit: a ``git archive`` snapshot,
byte-compiled), not the working tree, so that uncommitted edits in a shared checkout cannot leak
into the figures and every figure names the commit it belongs to. It records into bench/results.json
and renders bench/RESULTS.md's harness section and README.md's "Measured" section from it;
``--render`` does only that, measuring nothing. ``--quick`` records into bench/cache/harness/
(``results-quick.json``, ``RESULTS-quick.md``), never into the real figures.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import shutil
import subprocess
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

from . import report
from .runner import REPO, ContentMismatch, Context, SideFailed

MODULES = {
    1: "b1_jpeg_write",
    2: "b2_raw_write",
    3: "b3_encode_limit",
    4: "b4_webdataset",
    5: "b5_merge",
    6: "b6_verify",
    7: "b7_incremental",
    8: "b8_workflow_scale",
    9: "b9_scale",
    10: "b10_imagenet_like",
    11: "b11_field_kinds",
    12: "b12_parquet",
}
GIB = 1 << 30
MAIN_JSON = REPO / "bench" / "results.json"
MAIN_MARKDOWN = REPO / "bench" / "RESULTS.md"
QUICK_JSON, QUICK_MARKDOWN = Path("results-quick.json"), Path("RESULTS-quick.md")  # in --cache

# name: (default, --quick) sizes. Defaults: a few minutes per benchmark on 2 cores.
SIZES = {
    "jpeg_samples": (20_000, 2_000),  # issue 6: 20,000 crops
    "raw_gib": (2.0, 0.25),  # issue 6: at least 2 GB
    "wds_samples": (8_000, 800),  # issue 4: at least 8000 samples in at least 16 shards
    "wds_shards": (16, 16),
    "merge_parts": (4, 4),
    "merge_part_mib": (256, 32),
    "verify_samples": (20_000, 2_000),  # issue 5: 20,000 crops
    "incremental_samples": (8_000, 800),
    "incremental_partitions": (16, 16),  # issue 6: 1 of 16 partitions changed
    "scale_datasets": (200, 20),  # issue 10: 200 datasets x 16 partitions
    "scale_partitions": (16, 16),
    # issue 16 (b9): samples per case (comma-separated), the 20M-row arrays case (0: skipped), ...
    "scale_samples": ("10000,100000,1000000", "2000,10000"),
    "scale_rows": (20_000_000, 100_000),
    "scale_families": ("folder,arrays,webdataset", "folder,arrays,webdataset"),
    "scale_shard_samples": (1000, 1000),
    "scale_pairs": (1, 1),  # timed rounds per case (no warm-up round)
    "scale_verify": ("auto", "auto"),  # the cases' verify.mode (full: every sample compared at any N)
    "scale_case_partitions": (0, 0),  # `partitions:` of every b9 case's dataset (issue 16: 1,000); 0: unpartitioned
    # issue 20 (b12): Parquet rows, JPEGs in an Image column, and whether betonbuild re-encodes or keeps them
    "parquet_rows": (1_000_000, 20_000),
    "parquet_images": (5_000, 300),
    "parquet_jpeg": ("reencode", "reencode"),
    "imagenet_samples": (2000, 200),  # issue 18 (b10): the ImageNet-like folder
    "imagenet_classes": (100, 20),
    "kinds_samples": (200_000, 4_000),  # issue 19 (b11): ragged arrays / strings decoded and written
    "kinds_images": (2_000, 200),  # issue 19 (b11): 256x256 grey crops decoded
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.harness", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", type=int, nargs="+", choices=sorted(MODULES), help="run only these benchmarks")
    parser.add_argument("--quick", action="store_true", help="small sizes and 2 pairs: checks that everything runs")
    parser.add_argument("--pairs", type=int, help="timed rounds per comparison (default 5, --quick 2)")
    parser.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)), help="workers/threads per side")
    parser.add_argument(
        "--tree",
        default="HEAD",
        help="a commit to snapshot (default HEAD), `worktree` (the checkout as it is), or a directory",
    )
    parser.add_argument(
        "--quiet-below",
        type=float,
        default=0.3,
        help="before each run wait until other processes use fewer cores than this (0: never)",
    )
    parser.add_argument("--max-wait", type=float, default=10.0, help="...but at most this many seconds")
    parser.add_argument("--cache", type=Path, default=REPO / "bench" / "cache" / "harness")
    parser.add_argument("--json", type=Path, help=f"default {MAIN_JSON} ({QUICK_JSON.name} in --cache with --quick)")
    parser.add_argument(
        "--markdown", type=Path, help=f"default {MAIN_MARKDOWN} ({QUICK_MARKDOWN.name} in --cache with --quick)"
    )
    parser.add_argument("--readme", type=Path, default=REPO / "README.md", help="its BENCH section is rewritten")
    parser.add_argument("--no-record", action="store_true", help="print only; leave results.json and RESULTS.md")
    parser.add_argument(
        "--render", action="store_true", help="measure nothing: rewrite RESULTS.md and README.md from results.json"
    )
    for name, (default, _) in SIZES.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), help=f"default {default}")
    args = parser.parse_args(argv)
    if args.quick and args.render:
        parser.error("--render renders the real figures; --quick has none")
    quick_dir = args.cache if args.quick else None
    args.json = args.json or (quick_dir / QUICK_JSON.name if quick_dir else MAIN_JSON)
    args.markdown = args.markdown or (quick_dir / QUICK_MARKDOWN.name if quick_dir else MAIN_MARKDOWN)
    if args.quick and {args.json.resolve(), args.markdown.resolve()} & {MAIN_JSON.resolve(), MAIN_MARKDOWN.resolve()}:
        parser.error(f"--quick never records into {MAIN_JSON} or {MAIN_MARKDOWN}: its small sizes are no figures")
    return args


def measured_tree(choice: str, cache: Path) -> tuple[Path, str]:
    """The betonbuild source to measure, and how RESULTS.md names it."""

    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True, check=True).stdout

    if choice == "worktree":
        dirty = git("status", "--porcelain", "--", "betonbuild", "rules", "scripts", "Snakefile", "profiles").strip()
        head = git("rev-parse", "--short", "HEAD").strip()
        return REPO, f"working tree at {head}" + (" + uncommitted edits" if dirty else "")
    if Path(choice).is_dir():
        return Path(choice).resolve(), choice
    commit = git("rev-parse", "--verify", f"{choice}^{{commit}}").strip()
    tree = cache / f"tree-{commit[:12]}"
    if not (tree / "Snakefile").exists():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        # What an installed package has: byte-compiled modules, not recompiled by every process.
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", str(tree / "betonbuild"), str(tree / "scripts")], check=True
        )
    subject = git("log", "-1", "--format=%s", commit).strip()
    return tree, f"{commit[:10]} ({subject[:60]})"


def render_only(args: argparse.Namespace) -> int:
    """``--render``: RESULTS.md's harness section and README's BENCH section from results.json, nothing measured."""
    results = report.load_json(args.json)
    report.update_markdown(args.markdown, results)
    report.update_readme(args.readme, results)
    print(f"rendered {args.markdown} and {args.readme} from {args.json}")
    return 0


def failure_entry(module, exc: BaseException) -> dict:
    """What a failed benchmark records: FAILED, which side and command (when one side's process failed), the error."""
    entry = {"id": module.ID, "name": module.NAME, "title": module.TITLE}
    if isinstance(exc, ContentMismatch):
        return {**entry, "status": "content mismatch", "reason": f"{exc}; no time counts", "failure": {}}
    if isinstance(exc, SideFailed):
        failure = {"side": exc.side, "side_command": exc.command, "exit": exc.exit_code, "error_tail": exc.tail}
    else:
        failure = {"error_tail": "".join(traceback.format_exception(exc))[-4000:]}
    return {**entry, "status": "error", "reason": f"{type(exc).__name__}: {str(exc)[:500]}", "failure": failure}


def record(args: argparse.Namespace, results: dict, entry: dict) -> None:
    """Records ``entry``. A failure replaces the figures, never hides behind them: they are kept, labelled,
    as its ``last_success``."""
    previous = results["benchmarks"].get(entry["name"], {})
    if report.failed(entry):
        last = previous if previous.get("status") == "measured" else previous.get("last_success")
        if last:
            entry["last_success"] = last
        results["last_run"].setdefault("errors", {})[entry["name"]] = entry["reason"]
    results["benchmarks"][entry["name"]] = entry
    report.save_json(args.json, results)
    report.update_markdown(args.markdown, results)
    if not args.quick:
        report.update_readme(args.readme, results)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        return render_only(args)
    sizes = {
        name: getattr(args, name) if getattr(args, name) is not None else pair[int(args.quick)]
        for name, pair in SIZES.items()
    }
    tree, tree_name = measured_tree(args.tree, args.cache)
    sys.path.insert(0, str(tree))  # the digests and data helpers import the measured betonbuild too
    for name in [m for m in sys.modules if m == "betonbuild" or m.startswith("betonbuild.")]:
        del sys.modules[name]
    log_dir = args.cache / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    ctx = Context(
        cache=args.cache,
        tree=tree,
        cores=args.cores,
        pairs=args.pairs or (2 if args.quick else 5),
        quick=args.quick,
        sizes=sizes,
        quiet_below=args.quiet_below,
        max_wait=args.max_wait,
        log_dir=log_dir,
    )
    command = "python -m bench.harness " + shlex.join(argv if argv is not None else sys.argv[1:])
    results = report.load_json(args.json)
    if args.quick:
        results["quick"] = True  # RESULTS-quick.md says so at its top
    results["last_run"] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command.strip(),
        "machine": report.machine(),
        "tree": tree_name,
        "sizes": sizes,
    }
    print(f"measuring {tree_name} on {ctx.cores} cores; logs in {log_dir}", flush=True)
    failed = 0
    for number in args.only or sorted(MODULES):
        module = importlib.import_module(f".{MODULES[number]}", __package__)
        print(f"\n== {number}. {module.TITLE}", flush=True)
        started, load_before = time.monotonic(), os.getloadavg()[0]
        try:
            entry = module.run(ctx)
        except Exception as exc:  # noqa: BLE001 - one broken benchmark must not lose the others' figures
            failed += 1
            traceback.print_exc()
            entry = failure_entry(module, exc)
        if not getattr(module, "KEEP_WORKDIR", False):  # its outputs (GBs); the inputs under data/ stay
            shutil.rmtree(ctx.cache / module.NAME, ignore_errors=True)
        entry.setdefault("status", "measured")
        entry.update(
            measured_at=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            command=command.strip(),
            tree=tree_name,
            pairs=entry.get("pairs", ctx.pairs),  # b9 sets its own (scale_pairs)
            duration_s=round(time.monotonic() - started),
            load1_start_end=[round(load_before, 2), round(os.getloadavg()[0], 2)],
        )
        if entry["status"] == "measured":
            loads = [run["load1"] for r in entry["rounds"] for run in r.values() if "load1" in run]
            entry["load1"] = {"min": min(loads), "max": max(loads)}
        for line in report.table({"benchmarks": {module.NAME: entry}})[2:]:
            print(line)
        if not args.no_record:
            record(args, results, entry)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
