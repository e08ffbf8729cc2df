"""Measuring whole processes from outside, with the sides alternating, and the statistics of the rounds.

Each side is one fresh process tree, timed from spawn to reaped with ``os.wait4`` by ``timer.py``. A
user pays for interpreter start-up, imports (torch, numba) and exit too, so these count on both sides.
``wait4`` also gives the tree's CPU time (children it waited for included) and its peak RSS.
``ru_maxrss`` is the peak of the LARGEST process of the tree, not a sum; ~7 MiB is the floor (the timer's own).

Sides run A B A B ... (with three sides, A B C A B C ...). One untimed warm-up round comes first: it
fills the page cache with the inputs and checks the content before any time counts. Every round is
content-checked too. Before each run: ``sync``, untimed, so that one side does not pay to flush the
previous side's dirty pages. Then, if ``--quiet-below`` is set, a wait for the other jobs on a shared
machine to calm down. Each run records the 1-minute load average and the cores the rest of the
machine used meanwhile (``other_cores``).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TIMER = Path(__file__).with_name("timer.py")
QUIET = 0.3  # a pair is "quiet" when the rest of the machine used fewer cores than this during both runs


class ContentMismatch(RuntimeError):
    """Both sides did not produce the same logical content: their times mean nothing."""


class SideFailed(RuntimeError):
    """One side's process exited non-zero: which side, its command (as RESULTS.md prints it), the tail of its stderr."""

    def __init__(self, command: str, exit_code: int, cwd: Path, stderr_path: Path, tail: str, side: str = "?"):
        self.side, self.command, self.exit_code, self.tail = side, command, exit_code, tail
        self.cwd, self.stderr_path = cwd, stderr_path
        super().__init__(f"{command} failed (exit {exit_code}) in {cwd}; stderr ({stderr_path}):\n{tail}")


@dataclass
class Side:
    """One command of a comparison. ``before``/``after`` run untimed (cleanup; reading its output)."""

    name: str
    command: list[str]
    cwd: Path
    output: Path | None = None  # the .beton whose content digest is taken right after the run (untimed)
    before: Callable[[], None] | None = None
    after: Callable[[dict, str, str], None] | None = None  # (record, stdout, stderr): adds fields to the record
    flush: bool = False  # also time a `sync` right after it: the cost of getting its output onto the disk


@dataclass
class Context:
    """What every benchmark needs: sizes, repetitions, where things are, how to run a process."""

    cache: Path
    tree: Path  # the betonbuild source measured (a snapshot of a commit, or the working tree)
    cores: int
    pairs: int
    quick: bool
    sizes: dict
    quiet_below: float = 0.0
    max_wait: float = 0.0
    log_dir: Path = field(default=None)  # type: ignore[assignment]

    def env(self) -> dict:
        """PATH starts with the venv (snakemake's jobs call python/betonbuild); the measured tree first."""
        return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(self.tree)}

    def betonbuild(self, *args: str) -> list[str]:
        return [str(BIN / "betonbuild"), *args]

    def snakemake(self, workdir: Path, *args: str) -> list[str]:
        return [
            str(BIN / "snakemake"),
            "-s",
            str(self.tree / "Snakefile"),
            "-d",
            str(workdir),
            "--configfile",
            str(workdir / "config.yaml"),
            *args,
        ]

    def show(self, command: list[str]) -> str:
        """A command as RESULTS.md prints it: $CACHE for the cache, $TREE for the measured source tree."""
        text = shlex.join(command)
        for path, name in ((self.cache, "$CACHE"), (self.tree, "$TREE"), (BIN, ".venv/bin"), (REPO, ".")):
            text = text.replace(str(path), name)
        return text

    def side_script(self, name: str, *args) -> list[str]:
        """A plain-ffcv (or plain-cv2) side: a script in bench/harness/sides/ that does not import betonbuild."""
        return [sys.executable, str(Path(__file__).parent / "sides" / f"{name}.py"), *map(str, args)]


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine spent busy (not idle, not waiting for I/O) since boot."""
    with open("/proc/stat") as fh:
        values = [int(v) for v in fh.readline().split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


def wait_until_quiet(below: float, max_wait: float) -> float:
    """Waits (at most ``max_wait`` s) until other processes use fewer than ``below`` cores; returns the wait."""
    if below <= 0:
        return 0.0
    started = time.monotonic()
    while time.monotonic() - started < max_wait:
        before = busy_cpu_seconds()
        time.sleep(1.0)
        if busy_cpu_seconds() - before < below:
            break
    return time.monotonic() - started


def measure(command: list[str], cwd: Path, env: dict, log: Path) -> tuple[dict, str, str]:
    """Runs one process tree under ``timer.py``; returns its record (wall, CPU, peak RSS, load), stdout, stderr."""
    subprocess.run(["sync"], check=True)
    load1 = os.getloadavg()[0]
    out, err = log.with_suffix(".out"), log.with_suffix(".err")
    busy_before, started_at = busy_cpu_seconds(), time.time()
    timer = [sys.executable, "-I", "-S", str(TIMER), str(out), str(err), str(cwd), *command]
    timed = json.loads(subprocess.run(timer, env=env, capture_output=True, text=True, check=True).stdout)
    busy = busy_cpu_seconds() - busy_before
    if timed["exit"] != 0:
        raise SideFailed(shlex.join(command), timed["exit"], cwd, err, err.read_text()[-4000:])
    seconds, cpu = timed["seconds"], timed["cpu_seconds"]
    record = {
        "seconds": round(seconds, 3),
        "cpu_seconds": round(cpu, 2),
        "max_rss_mib": round(timed["max_rss_kib"] / 1024),
        "load1": round(load1, 2),
        "other_cores": round(max(0.0, busy - cpu) / seconds, 2),
        "started_at": started_at,
    }
    return record, out.read_text(), err.read_text()


def run_side(ctx: Context, side: Side, tag: str) -> dict:
    if side.before:
        side.before()
    waited = wait_until_quiet(ctx.quiet_below, ctx.max_wait)
    try:
        record, stdout, stderr = measure(side.command, side.cwd, ctx.env(), ctx.log_dir / f"{tag}-{side.name}")
    except SideFailed as exc:
        exc.side, exc.command = side.name, ctx.show(side.command)
        raise
    if side.flush:
        started = time.monotonic()
        subprocess.run(["sync"], check=True)
        record["flush_seconds"] = round(time.monotonic() - started, 3)
        record["seconds_with_flush"] = round(record["seconds"] + record["flush_seconds"], 3)
    if waited >= 1:
        record["waited_for_quiet"] = round(waited)
    if side.output is not None:  # now: the next side's ``before`` may remove it (a clean project)
        record["digest"] = digest(side.output, min(ctx.cores, 4))
    if side.after:
        side.after(record, stdout, stderr)
    return record


def inner_seconds(record: dict, stdout: str, stderr: str) -> None:
    """An ``after`` hook: the in-process seconds the side printed as JSON; the rest is start-up, imports, exit."""
    text = stdout.strip()
    try:
        info = json.loads(text)
    except json.JSONDecodeError:
        info = json.loads(text.splitlines()[-1])
    record["in_process_seconds"] = info["seconds"]


def digest(path: Path, threads: int = 2) -> str:
    """The content digest (betonbuild.beton.digest): same samples, same fields => same digest, whatever the layout."""
    from betonbuild.beton.digest import content_digest
    from betonbuild.beton.format import BetonFile

    return content_digest(BetonFile(str(path)), threads=threads)


def same_digests(row: dict, sides: list[Side]) -> dict:
    """The content check of a round: every side's output has the same content digest."""
    found = {side.name: row[side.name]["digest"] for side in sides if side.output is not None}
    if len(set(found.values())) != 1:
        raise ContentMismatch(f"content digests differ: {found}")
    return {"digest": next(iter(found.values())), "sides": sorted(found)}


def alternate(
    ctx: Context,
    bench: str,
    sides: list[Side],
    check: Callable[[dict], dict] | None = None,
    pairs: int | None = None,
    warmup: bool = True,
) -> list[dict]:
    """Rounds of A B (C ...): an untimed warm-up round first, then ``pairs`` timed ones, each content-checked."""
    check = check or (lambda row: same_digests(row, sides))
    pairs = ctx.pairs if pairs is None else pairs
    rounds = []
    for k in range(-1 if warmup else 0, pairs):
        tag = f"{bench}-{'warmup' if k < 0 else k + 1}"
        row = {side.name: run_side(ctx, side, tag) for side in sides}
        row["content"] = check(row)
        line = "  ".join(f"{s.name} {row[s.name]['seconds']:.2f} s (load {row[s.name]['load1']:.1f})" for s in sides)
        print(f"  {'warm-up' if k < 0 else f'round {k + 1}'}: {line}", flush=True)
        if k >= 0:
            rounds.append(row)
    return rounds


def spread(values: list[float], digits: int = 3) -> dict:
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }


def side_stats(rounds: list[dict], name: str) -> dict:
    runs = [r[name] for r in rounds]
    return {
        "seconds": spread([r["seconds"] for r in runs]),
        "cpu_seconds": round(statistics.median(r["cpu_seconds"] for r in runs), 2),
        "max_rss_mib": round(statistics.median(r["max_rss_mib"] for r in runs)),
        "load1": spread([r["load1"] for r in runs], 2),
        "other_cores": spread([r["other_cores"] for r in runs], 2),
    }


def ratio(rounds: list[dict], numerator: str, denominator: str, key: str = "seconds", label: str = "") -> dict:
    """numerator / denominator time of each round (a pair run back to back): median and min-max."""
    per_pair = [r[numerator][key] / r[denominator][key] for r in rounds]
    quiet = [
        x for x, r in zip(per_pair, rounds) if max(r[numerator]["other_cores"], r[denominator]["other_cores"]) < QUIET
    ]
    return {
        "of": f"{numerator} / {denominator}{label}",
        **spread(per_pair),
        "per_pair": [round(x, 3) for x in per_pair],
        "quiet_pairs": len(quiet),
        "quiet_median": round(statistics.median(quiet), 3) if quiet else None,
    }


def target(text: str, of: str, op: str, value: float, measured: float | None) -> dict:
    """A benchmark's target (from the issue that asked for it) and whether the median met it."""
    met = None if measured is None else (measured <= value if op == "<=" else measured >= value)
    return {"text": text, "of": of, "op": op, "value": value, "measured": measured, "met": met}


def clean(*paths: Path) -> Callable[[], None]:
    """A ``before`` hook: removes the files and directories a side writes."""

    def remove() -> None:
        for path in paths:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)

    return remove


def summarise(ctx: Context, rounds: list[dict], sides: list[Side]) -> dict:
    """Per side: its command and the statistics of its runs."""
    return {side.name: {"command": ctx.show(side.command), **side_stats(rounds, side.name)} for side in sides}


def median_of(rounds: list[dict], side: str, key: str) -> float:
    """The median of a field the ``after`` hook added to each run of ``side``."""
    return round(statistics.median(r[side][key] for r in rounds), 3)
