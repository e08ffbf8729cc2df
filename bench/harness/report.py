"""Results out: ``bench/results.json`` for machines, the harness's table in ``bench/RESULTS.md`` and
the "Measured" section of ``README.md``, both rendered from results.json alone (``--render``).

A run of some benchmarks replaces their entries and keeps the others, each with its own date,
command, commit and load. A benchmark that failed is recorded as failed (which side, its command,
the error's tail, the commit, the date); its last good figures are kept under ``last_success`` and
shown only as that, never as current. In RESULTS.md and README.md only the text between the
markers is rewritten; the rest is left alone.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
from pathlib import Path

from . import plots

BEGIN = "<!-- HARNESS:BEGIN (written by `make bench`, python -m bench.harness; edit bench/harness/report.py) -->"
END = "<!-- HARNESS:END -->"
README_BEGIN = (
    "<!-- BENCH:BEGIN (generated from bench/results.json by `python -m bench.harness --render`; "
    "edit bench/harness/report.py) -->"
)
README_END = "<!-- BENCH:END -->"
# The notes the README quotes beside the ratios (by how they start): the throughputs and limits.
HEADLINE_NOTES = ("throughput", "encode limit", "`snakemake -n all`")
ERROR_TAIL_LINES = 30
FENCE = "`" * 3
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


def commit_of(entry: dict) -> str:
    """The commit an entry was measured at (the short hash its ``tree`` starts with), else the tree's name."""
    tree = entry.get("tree") or "?"
    first = tree.split(" ", 1)[0]
    return first if re.fullmatch(r"[0-9a-f]{7,40}", first) else tree


def failed(entry: dict) -> bool:
    return entry.get("status") not in ("measured", "pending", None)


def _at(entry: dict) -> str:
    return f"`{commit_of(entry)}` {entry.get('measured_at', '?')}"


def _figure_rows(entry: dict, load: bool, label: str = "") -> list[str]:
    """The rows of one measured entry: its ratios, then the targets that are not ratios."""
    found = entry.get("load1")
    load_cell = (f" {found['min']:.1f}-{found['max']:.1f} |" if found else " |") if load else ""
    start = f"| {entry['id']} | {entry['title']} | {label}"
    targets = {t["of"]: t for t in entry.get("targets", [])}
    rows = []
    for r in entry.get("ratios", []):
        t = targets.get(r["of"])
        goal = f"{t['op']} {t['value']}" if t else "report only"
        rows.append(
            f"{start}{r['of']} | **{r['median']:.2f}** ({r['min']:.2f}-{r['max']:.2f}) | {goal} | "
            f"{_met(t['met']) if t else '-'} |{load_cell} {_at(entry)} |"
        )
    for t in entry.get("targets", []):
        if t["of"] not in {r["of"] for r in entry.get("ratios", [])}:
            measured = "" if t["measured"] is None else f"**{t['measured']:g}**"
            rows.append(
                f"{start}{t['of']} | {measured} | {t['op']} {t['value']} | {_met(t['met'])} |{load_cell} {_at(entry)} |"
            )
    return rows


def _failure_summary(entry: dict) -> str:
    failure = entry.get("failure", {})
    if failure.get("side"):
        return f"side `{failure['side']}` exited {failure.get('exit', '?')}"
    return entry.get("status", "error")


def table(results: dict, load: bool = True) -> list[str]:
    """One row per measured ratio (or per pending or failed benchmark): the summary a reader looks at
    first. Every row with a figure names the commit it was measured at."""
    lines = [
        "| # | benchmark | ratio | median of per-pair ratios (min-max) | target | met |"
        + (" load1 during runs |" if load else "")
        + " measured at (commit, date) |",
        "|---|---|---|---|---|---|---|" + ("---|" if load else ""),
    ]
    blank = " |" if load else ""
    for entry in results["benchmarks"].values():
        if failed(entry):
            lines.append(
                f"| {entry['id']} | {entry['title']} | **FAILED**: {_failure_summary(entry)} | | "
                f"{entry.get('target_text', '')} | **FAILED** |{blank} {_at(entry)} |"
            )
            last = entry.get("last_success")
            if last:
                label = f"last successful measurement (at `{commit_of(last)}`, not current): "
                lines += _figure_rows(last, load, label=label)
        elif entry.get("status") != "measured":
            lines.append(
                f"| {entry['id']} | {entry['title']} | | | {entry.get('target_text', '')} | "
                f"{entry.get('status', 'pending')} |{blank} |"
            )
        else:
            lines += _figure_rows(entry, load)
    return lines


def _error_tail(entry: dict) -> str:
    failure = entry.get("failure", {})
    text = failure.get("error_tail") or entry.get("reason", "")
    tail = "\n".join(text.rstrip().splitlines()[-ERROR_TAIL_LINES:])
    return tail.replace(FENCE, "'" * 3)


def failure_details(entry: dict) -> list[str]:
    """A failed benchmark's section: FAILED, when, at which commit, which side and command, the error's tail;
    then its last good figures, labelled as the last successful measurement."""
    failure = entry.get("failure", {})
    lines = [
        f"**FAILED** {entry.get('measured_at', '?')} at commit `{commit_of(entry)}` (tree `{entry.get('tree', '?')}`), "
        f"by `{entry.get('command', '?')}`: {_failure_summary(entry)}.",
        "",
    ]
    if failure.get("side_command"):
        lines += [f"The failing command: `{failure['side_command']}`.", ""]
    lines += ["The error's tail:", "", FENCE + "text", _error_tail(entry), FENCE, ""]
    last = entry.get("last_success")
    if not last:
        return lines + ["No successful measurement of this benchmark is recorded.", ""]
    lines += [
        f"#### Last successful measurement, at commit `{commit_of(last)}` ({last.get('measured_at', '?')}): "
        "not current",
        "",
    ]
    return lines + details(last)[2:]


def details(entry: dict) -> list[str]:
    lines = [f"### {entry['id']}. {entry['title']}", ""]
    if failed(entry):
        return lines + failure_details(entry)
    if entry.get("status") != "measured":
        lines += [f"**{entry.get('status', 'pending')}**: {entry.get('reason', '')}", ""]
        return lines
    lines += [
        f"Measured {entry['measured_at']} at commit `{commit_of(entry)}` by `{entry['command']}` "
        f"({entry['duration_s']:.0f} s), tree `{entry['tree']}`, {entry['pairs']} timed rounds"
        + (" after one warm-up round." if entry.get("warmup", True) else " (no warm-up round)."),
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
    if entry.get("tables"):  # a benchmark's own markdown (b9's per-stage costs)
        lines += [*entry["tables"], ""]
    return lines


def _machine_text(m: dict) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in m.get("versions", {}).items() if v)
    return (
        f"{m.get('cores')} cores ({m.get('cpu_model')}), {m.get('ram_gib')} GiB RAM, kernel {m.get('kernel')}, "
        f"Python {m.get('python')}, {versions}"
    )


def render(results: dict) -> str:
    meta = results.get("last_run", {})
    m = meta.get("machine", {})
    lines = [
        BEGIN,
        "## The benchmark harness (`make bench`)",
        "",
        *(
            [
                "**QUICK RUN** (`--quick`: small sizes, 2 pairs): it checks that everything runs; these are not the "
                "benchmarks' figures, which are in bench/results.json and bench/RESULTS.md.",
                "",
            ]
            if results.get("quick")
            else []
        ),
        "The latest figure of each benchmark; each one below names its date, command and measured commit. "
        f"Last run {meta.get('date', '?')}: `{meta.get('command', '?')}` on {_machine_text(m)}. "
        "A benchmark whose last run failed says FAILED, with the side, its command and the error; its last "
        "good figures, if any, are labelled as such. Machine-readable: [results.json](results.json). How it measures: "
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


def _headline_notes(entry: dict) -> list[str]:
    """The README's lines of throughputs and limits, each naming the commit (a failed one's: labelled as old)."""
    shown = entry.get("last_success") if failed(entry) else entry
    if not shown or shown.get("status") != "measured":
        return []
    if shown is entry:
        at = f"at {_at(shown)}"
    else:
        at = f"last successful measurement, at `{commit_of(shown)}` {shown.get('measured_at', '?')}, not current"
    return [
        f"- {entry['id']}. {entry['title']}: {note} ({at})."
        for note in shown.get("notes", [])
        if note.startswith(HEADLINE_NOTES)
    ]


def render_readme(results: dict) -> str:
    """README's "Measured" section: the summary table and the throughputs, every figure with its commit."""
    m = results.get("last_run", {}).get("machine", {})
    lines = [
        README_BEGIN,
        "The latest figure of each benchmark, generated from [bench/results.json](bench/results.json) "
        "(`python -m bench.harness --render`); [bench/RESULTS.md](bench/RESULTS.md) gives each one's "
        "commands, data, per-pair ratios and load. Medians of per-pair whole-process time ratios, sides "
        f"alternating, on {_machine_text(m)}.",
        "",
        *table(results, load=False),
        "",
    ]
    notes = [line for entry in results["benchmarks"].values() for line in _headline_notes(entry)]
    if notes:
        lines += [*notes, ""]
    lines.append(README_END)
    return "\n".join(lines)


def replace_region(text: str, begin: str, end: str, region: str) -> str | None:
    """``text`` with the part from ``begin`` to ``end`` (both included) replaced; None without both markers."""
    if begin not in text or end not in text:
        return None
    head, rest = text.split(begin, 1)
    return head + region + rest.split(end, 1)[1]


def update_markdown(path: Path, results: dict) -> None:
    """Rewrites only the harness's region of RESULTS.md (created after the first paragraph if missing)."""
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    region = render(results)
    replaced = replace_region(text, BEGIN, END, region)
    if replaced is not None:
        text = replaced
    else:
        at = text.find("\n## ")
        text = (text + "\n" + region + "\n") if at < 0 else (text[: at + 1] + region + "\n\n" + text[at + 1 :])
    path.write_text(text)
    for entry in results["benchmarks"].values():  # pictures the entries link to, beside the markdown
        plots.draw(path.parent, entry, commit_of(entry))


def update_readme(path: Path, results: dict) -> None:
    """Rewrites README's BENCH region; the markers must be there (their place in the README is chosen by hand)."""
    replaced = replace_region(path.read_text(), README_BEGIN, README_END, render_readme(results))
    if replaced is None:
        raise SystemExit(f"{path}: no {README_BEGIN!r} ... {README_END!r} section to rewrite")
    path.write_text(replaced)
