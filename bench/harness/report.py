"""Results out: ``bench/results.json`` for machines, and the harness's table in ``bench/RESULTS.md``.

A run of some benchmarks replaces their entries and keeps the others, each with its own date,
command and load, so the file always holds the latest figure of every benchmark. In RESULTS.md
only the text between the two HARNESS markers is rewritten; other sections are left alone.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
from pathlib import Path

BEGIN = "<!-- HARNESS:BEGIN (written by `make bench`, python -m bench.harness; edit bench/harness/report.py) -->"
END = "<!-- HARNESS:END -->"
PACKAGES = ("ffcv", "numpy", "opencv-python", "snakemake", "webdataset", "torch", "pillow")


def machine() -> dict:
    mem_kib = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal"))
    model = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?"
    )
    versions = {}
    for package in PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "cores": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "ram_gib": round(mem_kib / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "versions": versions,
    }


def load_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"benchmarks": {}}


def save_json(path: Path, results: dict) -> None:
    ordered = dict(sorted(results["benchmarks"].items(), key=lambda kv: kv[1].get("id", 99)))
    path.write_text(json.dumps({**results, "benchmarks": ordered}, indent=1) + "\n")


def _seconds(stats: dict) -> str:
    s = stats["seconds"]
    return f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"


def _met(value) -> str:
    return {True: "**met**", False: "**missed**", None: "pending"}[value]


def table(results: dict) -> list[str]:
    """One row per measured ratio (or per pending benchmark): the summary a reader looks at first."""
    lines = [
        "| # | benchmark | ratio | median of per-pair ratios (min-max) | target | met | load1 during runs |",
        "|---|---|---|---|---|---|---|",
    ]
    for entry in results["benchmarks"].values():
        load = entry.get("load1")
        load_text = f"{load['min']:.1f}-{load['max']:.1f}" if load else ""
        if entry.get("status") != "measured":
            lines.append(
                f"| {entry['id']} | {entry['title']} | | | {entry.get('target_text', '')} | "
                f"{entry.get('status', 'pending')} | |"
            )
            continue
        targets = {t["of"]: t for t in entry.get("targets", [])}
        for r in entry.get("ratios", []):
            t = targets.get(r["of"])
            goal = f"{t['op']} {t['value']}" if t else "report only"
            lines.append(
                f"| {entry['id']} | {entry['title']} | {r['of']} | **{r['median']:.2f}** "
                f"({r['min']:.2f}-{r['max']:.2f}) | {goal} | {_met(t['met']) if t else '-'} | {load_text} |"
            )
        for t in entry.get("targets", []):
            if t["of"] not in {r["of"] for r in entry.get("ratios", [])}:
                measured = "" if t["measured"] is None else f"**{t['measured']:g}**"
                lines.append(
                    f"| {entry['id']} | {entry['title']} | {t['of']} | {measured} | {t['op']} {t['value']} | "
                    f"{_met(t['met'])} | {load_text} |"
                )
    return lines


def details(entry: dict) -> list[str]:
    lines = [f"### {entry['id']}. {entry['title']}", ""]
    if entry.get("status") != "measured":
        lines += [f"**{entry.get('status', 'pending')}**: {entry.get('reason', '')}", ""]
        return lines
    lines += [
        f"Measured {entry['measured_at']} by `{entry['command']}` ({entry['duration_s']:.0f} s), tree "
        f"`{entry['tree']}`, {entry['pairs']} timed rounds after one warm-up round.",
        "",
        f"Data: {entry['data']}.",
        "",
    ]
    lines += [
        "| side | command | wall s median (min-max) | CPU s | peak RSS MiB | load1 | other cores |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, stats in entry["sides"].items():
        lines.append(
            f"| {name} | `{stats['command']}` | {_seconds(stats)} | {stats['cpu_seconds']:.1f} | "
            f"{stats['max_rss_mib']} | {stats['load1']['median']:.1f} | {stats['other_cores']['median']:.2f} |"
        )
    lines.append("")
    for r in entry.get("ratios", []):
        quiet = (
            f"; the {r['quiet_pairs']} pairs during which the rest of the machine used < 0.3 cores: median "
            f"{r['quiet_median']:.2f}"
            if r.get("quiet_pairs")
            else "; no pair ran on a quiet machine"
        )
        lines.append(f"- `{r['of']}` per pair: {', '.join(f'{x:.2f}' for x in r['per_pair'])}{quiet}.")
    for t in entry.get("targets", []):
        lines.append(
            f"- Target: {t['text']}: `{t['of']}` {t['op']} {t['value']}; measured {t['measured']}: {_met(t['met'])}."
        )
    lines.append(f"- Content: {entry['content']}.")
    lines += [f"- {note}" for note in entry.get("notes", [])]
    lines.append("")
    return lines


def render(results: dict) -> str:
    meta = results.get("last_run", {})
    m = meta.get("machine", {})
    versions = ", ".join(f"{k} {v}" for k, v in m.get("versions", {}).items() if v)
    lines = [
        BEGIN,
        "## The benchmark harness (`make bench`)",
        "",
        "The latest figure of each benchmark; each one below names its date, command and measured commit. "
        f"Last run {meta.get('date', '?')}: `{meta.get('command', '?')}` on {m.get('cores')} cores "
        f"({m.get('cpu_model')}), {m.get('ram_gib')} GiB RAM, kernel {m.get('kernel')}, Python {m.get('python')}, "
        f"{versions}. Machine-readable: [results.json](results.json). How it measures: "
        "[bench/harness/runner.py](harness/runner.py) (whole processes from outside, sides alternating "
        "A B A B after an untimed warm-up round, content digests compared in every round).",
        "",
        "Ratios are time ratios: below 1 the first side is faster. Medians of per-pair ratios, min-max over "
        "the pairs; load1 is the 1-minute load average at the start of each run (2 cores: load 2 means "
        "another job used the whole machine).",
        "",
        *table(results),
        "",
    ]
    for entry in results["benchmarks"].values():
        lines += details(entry)
    lines.append(END)
    return "\n".join(lines)


def update_markdown(path: Path, results: dict) -> None:
    """Rewrites only the harness's region of RESULTS.md (created after the first paragraph if missing)."""
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    region = render(results)
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        text = head + region + tail
    else:
        at = text.find("\n## ")
        text = (text + "\n" + region + "\n") if at < 0 else (text[: at + 1] + region + "\n\n" + text[at + 1 :])
    path.write_text(text)
