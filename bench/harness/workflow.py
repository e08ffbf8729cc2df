"""Helpers for the sides that run betonbuild's workflow: configs, clean project directories, job timings."""

from __future__ import annotations

import re
import shutil
import statistics
from collections import Counter
from pathlib import Path

import yaml

PROJECT_STATE = ("results", "logs", "benchmarks", ".snakemake")


def write_config(workdir: Path, datasets: dict) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump({"datasets": datasets}, sort_keys=False))
    return path


def reset_project(workdir: Path):
    """A ``before`` hook: the project as if nothing had ever been built (a clean build)."""

    def reset() -> None:
        for name in PROJECT_STATE:
            shutil.rmtree(workdir / name, ignore_errors=True)

    return reset


def supports_partitions(tree: Path) -> bool:
    """Whether the measured betonbuild knows ``partitions:`` (issue 6), from its config schema."""
    # betonbuild/config/schema/ since the subpackage layout (issue 15), betonbuild/schema/ before it
    paths = [
        tree / "betonbuild" / "config" / "schema" / "config.schema.yaml",
        tree / "betonbuild" / "schema" / "config.schema.yaml",
    ]
    schema = yaml.safe_load(next(p for p in paths if p.exists()).read_text())
    return "partitions" in schema["$defs"]["dataset"]["properties"]


def rule_seconds(workdir: Path, since: float = 0.0) -> dict[str, float]:
    """Wall seconds per rule, summed over its jobs (Snakemake's ``benchmark:`` files written after ``since``)."""
    totals: dict[str, float] = {}
    for tsv in sorted((workdir / "benchmarks").rglob("*.tsv")):
        if tsv.stat().st_mtime < since:
            continue
        rule = tsv.parent.name if tsv.parent != workdir / "benchmarks" else tsv.stem
        lines = tsv.read_text().splitlines()
        if len(lines) > 1:
            totals[rule] = round(totals.get(rule, 0.0) + float(lines[1].split("\t")[0]), 2)
    return totals


def median_rule_seconds(runs: list[dict[str, float]]) -> dict[str, float]:
    """The median over runs of each rule's seconds (0 in a run where it did not run)."""
    names = sorted({name for run in runs for name in run})
    return {name: round(statistics.median(run.get(name, 0.0) for run in runs), 2) for name in names} if runs else {}


def stage_recorder(workdir: Path) -> tuple[list[dict], object]:
    """(runs, after hook): each run's rule seconds (only the jobs of that run) and jobs per rule."""
    runs: list[dict] = []

    def after(record: dict, stdout: str, stderr: str) -> None:
        runs.append(rule_seconds(workdir, since=record["started_at"]))
        record["jobs"] = jobs_run(stderr)

    return runs, after


def jobs_run(snakemake_log: str) -> dict[str, int]:
    """Jobs per rule that ran (or, in a dry run, would run): Snakemake logs each as ``rule NAME:``."""
    return dict(sorted(Counter(re.findall(r"^(?:local)?(?:rule|checkpoint) (\w+):", snakemake_log, re.M)).items()))


def _number(text: str) -> float | None:
    """A benchmark file's value; Snakemake writes NA where it took no sample (a job shorter than its 0.5 s poll)."""
    try:
        return float(text)
    except ValueError:
        return None


def rule_records(workdir: Path, since: float = 0.0) -> dict[str, dict]:
    """Per rule, from Snakemake's ``benchmark:`` files written after ``since``: wall seconds (summed over
    its jobs), and ``max_rss``/``max_pss`` in MiB (the largest job's). Snakemake samples a job's process
    tree (workers summed) every 0.5 s for its first 30 s, then every 30 s, so a late peak can be missed."""
    found: dict[str, dict] = {}
    for tsv in sorted((workdir / "benchmarks").rglob("*.tsv")):
        if tsv.stat().st_mtime < since:
            continue
        rule = tsv.parent.name if tsv.parent != workdir / "benchmarks" else tsv.stem
        lines = tsv.read_text().splitlines()
        if len(lines) < 2:
            continue
        row = dict(zip(lines[0].split("\t"), lines[1].split("\t"), strict=False))
        entry = found.setdefault(rule, {"s": 0.0, "max_rss": None, "max_pss": None, "jobs": 0})
        entry["s"] = round(entry["s"] + (_number(row.get("s", "")) or 0.0), 3)
        entry["jobs"] += 1
        for key in ("max_rss", "max_pss"):
            value = _number(row.get(key, ""))
            if value is not None:
                entry[key] = round(max(entry[key] or 0.0, value), 1)
    return found
