"""Benchmark: ``merge_betons`` vs ``cp`` of the same bytes on the same disk.

    .venv/bin/python bench/merge_speed.py [--runs 5] [--parts 4] [--samples-per-part 256] [--keep]

Data (written once per invocation under bench/cache/merge_speed/, gitignored): ``--parts`` part files
written by plain ffcv ``DatasetWriter`` (1 worker, default 8 MiB pages), each ``--samples-per-part``
samples of ``label`` IntField + ``data`` NDArrayField(uint8, 1 MiB) of seeded random bytes: by default
4 x 256 MiB = 1 GiB of payload. A reference merge of them is made once (the source for ``cp``).

Timed, each a fresh process, whole-process wall time (spawn to exit, interpreter start and imports
included), the commands in a rotating order per run, each output deleted and ``sync`` run before
every command (neither timed):
- merge: ``python -c "merge_betons(parts, out)"``, method "auto" (copy_file_range);
- merge_buffered: the same with ``method="buffered"`` (the fallback pread/pwrite loop, for context);
- cp_merged: ``cp reference.beton out.beton`` - the same bytes as the merge output, as one file;
- cp_parts: ``cp part0 part1 ... outdir/`` - the same bytes as the merge input.
GNU cp 9.1 (strace) tries FICLONE, then copies a dense file with copy_file_range and a sparse one
(the merge output leaves its page padding as holes) with SEEK_DATA + 128 KiB read/write: cp_parts
and cp_merged therefore exercise both of cp's engines.
The ratio is cp time / merge time (= merge throughput / cp throughput); the target is >= 0.8 against
the faster cp. Medians and minima are both reported: on this VM the same command's time is bimodal
(occasional 2-4x slower runs, whichever the command), so the minimum shows the undisturbed cost.
Caches cannot be dropped here (no root), so every side reads its input from the page
cache (all inputs are read once before the first run) and writes into the page cache; the dirty pages
of the previous command are flushed by the untimed ``sync``. At the end the merge output is checked
to be byte-identical to the reference merge (sha256). The cache directory is deleted at the end
when it holds more than 2 GB, unless ``--keep``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / "bench" / "cache" / "merge_speed"
SAMPLE_BYTES = 1 << 20
SEED = 20241129
KEEP_LIMIT = 2 * 10**9

class Rows:
    def __init__(self, part: int, n: int):
        self.part, self.n = part, n

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        rng = np.random.default_rng([SEED, self.part, int(index)])
        return int(self.part * self.n + index), rng.integers(0, 256, SAMPLE_BYTES, dtype=np.uint8)


def write_parts(parts: int, per_part: int) -> list[Path]:
    from ffcv.fields import IntField, NDArrayField
    from ffcv.writer import DatasetWriter

    CACHE.mkdir(parents=True, exist_ok=True)
    spec = CACHE / "parts.json"
    paths = [CACHE / f"part{k}.beton" for k in range(parts)]
    wanted = {"parts": parts, "per_part": per_part, "sample_bytes": SAMPLE_BYTES, "seed": SEED}
    if spec.exists() and json.loads(spec.read_text()) == wanted and all(p.exists() for p in paths):
        print(f"reusing {parts} parts in {CACHE}")
        return paths
    spec.unlink(missing_ok=True)
    for k, path in enumerate(paths):
        t = time.perf_counter()
        fields = {"label": IntField(), "data": NDArrayField(np.dtype("u1"), (SAMPLE_BYTES,))}
        DatasetWriter(str(path), fields, num_workers=1).from_indexed_dataset(Rows(k, per_part))
        print(f"wrote {path.name}: {path.stat().st_size / 2**20:.0f} MiB in {time.perf_counter() - t:.1f} s",
              file=sys.stderr)
    spec.write_text(json.dumps(wanted))
    return paths


def timed(cmd: list[str]) -> tuple[float, str]:
    subprocess.run(["sync"], check=True)
    start = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    seconds = time.perf_counter() - start
    if result.returncode:
        raise SystemExit(f"{cmd[0]} failed: {result.stderr[-2000:]}")
    return seconds, result.stdout


def merge_command(method: str, out: Path, parts: list[Path]) -> list[str]:
    code = (
        "import json, sys\n"
        "from betonbuild.merge import merge_betons\n"
        f"r = merge_betons(sys.argv[2:], sys.argv[1], method={method!r})\n"
        "print(json.dumps({k: r[k] for k in ('seconds', 'method', 'bytes_copied', 'size')}))\n"
    )
    return [sys.executable, "-c", code, str(out), *map(str, parts)]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(16 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def warm(paths: list[Path]) -> None:
    for path in paths:
        with open(path, "rb") as fh:
            while fh.read(16 << 20):
                pass


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--parts", type=int, default=4)
    parser.add_argument("--samples-per-part", type=int, default=256)
    parser.add_argument("--keep", action="store_true", help="keep bench/cache/merge_speed whatever its size")
    parser.add_argument("--json", type=Path, help="also write the full result here")
    args = parser.parse_args()

    sys.path.insert(0, str(REPO))
    from betonbuild.merge import merge_betons

    parts = write_parts(args.parts, args.samples_per_part)
    reference = CACHE / "reference.beton"
    record = merge_betons(parts, reference)
    payload = args.parts * args.samples_per_part * SAMPLE_BYTES
    out_merge, out_cp = CACHE / "out_merge.beton", CACHE / "out_cp.beton"
    out_dir = CACHE / "out_parts"
    warm([*parts, reference])
    load_before = os.getloadavg()
    startup = statistics.median(timed([sys.executable, "-c", "import betonbuild.merge"])[0] for _ in range(5))

    commands = {
        "merge": lambda: merge_command("auto", out_merge, parts),
        "merge_buffered": lambda: merge_command("buffered", out_merge, parts),
        "cp_merged": lambda: ["cp", str(reference), str(out_cp)],
        "cp_parts": lambda: ["cp", *map(str, parts), str(out_dir) + "/"],
    }
    names = list(commands)
    times: dict[str, list[float]] = {name: [] for name in names}
    inner: dict[str, list[float]] = {"merge": [], "merge_buffered": []}
    methods = {}
    for run in range(args.runs):
        order = names[run % len(names):] + names[: run % len(names)]
        line = []
        for name in order:
            out_merge.unlink(missing_ok=True)
            out_cp.unlink(missing_ok=True)
            shutil.rmtree(out_dir, ignore_errors=True)
            out_dir.mkdir()
            seconds, stdout = timed(commands[name]())
            times[name].append(seconds)
            if name in inner:
                info = json.loads(stdout.strip().splitlines()[-1])
                inner[name].append(info["seconds"])
                methods[name] = info["method"]
            line.append(f"{name} {seconds:.2f} s")
        print(f"run {run + 1}: " + ", ".join(line))

    # The last command may not have been a merge: make one more and check its bytes.
    out_merge.unlink(missing_ok=True)
    subprocess.run(merge_command("auto", out_merge, parts), check=True, capture_output=True, cwd=REPO)
    identical = sha256(out_merge) == sha256(reference)

    med = {name: statistics.median(values) for name, values in times.items()}
    best = {name: min(values) for name, values in times.items()}
    fastest_cp = min(med["cp_merged"], med["cp_parts"])
    result = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release(),
                    "filesystem": subprocess.run(["df", "-T", str(CACHE)], capture_output=True, text=True)
                    .stdout.splitlines()[-1].split()[1],
                    "cp": subprocess.run(["cp", "--version"], capture_output=True, text=True).stdout.splitlines()[0]},
        "parts": args.parts, "samples_per_part": args.samples_per_part, "payload_bytes": payload,
        "merged_file_bytes": record["size"], "bytes_copied": record["bytes_copied"], "runs": args.runs,
        "median_seconds": {k: round(v, 3) for k, v in med.items()},
        "min_seconds": {k: round(v, 3) for k, v in best.items()},
        "median_in_process_merge_seconds": {k: round(statistics.median(v), 3) for k, v in inner.items()},
        "python_startup_and_import_seconds": round(startup, 3),
        "throughput_MBps": {k: round(record["size"] / v / 1e6) for k, v in med.items()},
        "ratio_cp_over_merge": {"cp_merged": round(med["cp_merged"] / med["merge"], 3),
                                "cp_parts": round(med["cp_parts"] / med["merge"], 3),
                                "fastest_cp": round(fastest_cp / med["merge"], 3),
                                "fastest_cp_min_times":
                                    round(min(best["cp_merged"], best["cp_parts"]) / best["merge"], 3),
                                "fastest_cp_vs_merge_buffered": round(fastest_cp / med["merge_buffered"], 3)},
        "load_average_1min": {"before": round(load_before[0], 2), "after": round(os.getloadavg()[0], 2)},
        "methods": methods,
        "merge_filesystem": record["filesystem"],
        "merge_output_identical_to_reference": identical,
        "all_seconds": times,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "all_seconds"}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))

    for path in (out_merge, out_cp):
        path.unlink(missing_ok=True)
    shutil.rmtree(out_dir, ignore_errors=True)
    size = dir_size(CACHE)
    if size > KEEP_LIMIT and not args.keep:
        shutil.rmtree(CACHE)
        print(f"deleted {CACHE} ({size / 1e9:.1f} GB > 2 GB)")
    if not identical:
        raise SystemExit("the merge output differs from the reference merge of the same parts")


if __name__ == "__main__":
    main()
