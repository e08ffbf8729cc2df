"""``betonbuild status``: which datasets are up to date, and why the others would rebuild.

Summarises Snakemake's own dry run (its jobs and their ``reason:`` lines) per dataset.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

JOB_RE = re.compile(r"^(?:local)?(?:rule|checkpoint) (\w+):\n((?:[ \t]+.*\n)*)", re.M)
DATASET_RE = re.compile(r"^\s+wildcards: .*?\bds=([A-Za-z0-9_-]+)", re.M)
REASON_RE = re.compile(r"^\s+reason: (.*)$", re.M)


def short_reason(reason: str) -> str:
    """Snakemake prints whole params dicts; the first clause says enough."""
    reason = reason.split(": before:")[0]
    reason = reason.replace("Union of exclusive params before and now across all output", "").rstrip(": ")
    return reason if len(reason) <= 160 else reason[:157] + "..."


def plan(dry_run_output: str) -> dict[str, list[tuple[str, str]]]:
    """dataset -> [(rule, reason)] of the jobs a dry run would execute."""
    jobs: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for rule, body in JOB_RE.findall(dry_run_output):
        ds = DATASET_RE.search(body)
        if ds:
            reason = REASON_RE.search(body)
            jobs[ds.group(1)].append((rule, short_reason(reason.group(1)) if reason else ""))
    return jobs


def status(datasets: list[str], snakemake_args: list[str]) -> tuple[str, int]:
    cmd = [str(Path(sys.executable).parent / "snakemake"), "-n", "--cores", "1", *snakemake_args]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        return result.stdout + result.stderr, result.returncode
    jobs = plan(result.stdout)
    lines = []
    width = max((len(d) for d in datasets), default=0)
    for ds in datasets:
        if not jobs.get(ds):
            lines.append(f"{ds:<{width}}  up to date")
            continue
        lines.append(f"{ds:<{width}}  would rebuild:")
        for rule, reason in jobs[ds]:
            lines.append(f"{'':<{width}}    {rule}: {reason}")
        if "source_manifest" in [r for r, _ in jobs[ds]]:
            lines.append(
                f"{'':<{width}}    (source.json is derived again first; "
                "the later stages rerun only if its content changes)"
            )
    return "\n".join(lines), 0
