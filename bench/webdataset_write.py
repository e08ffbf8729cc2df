"""Benchmark: plain ``DatasetWriter.from_webdataset`` vs ``betonbuild write`` on the same shards.

    .venv/bin/python bench/webdataset_write.py [--pairs 5] [--workers N] [--snakemake] [--phases 3]
        [--quiet-below 0.25] [--max-wait 900] [--retries 3] [--json FILE]

Data (prepared once, under bench/cache/, gitignored): 16 WebDataset shards holding 8000 random
256x256 crops (seeded) of the real colour photographs bundled with scikit-image / scikit-learn
(``betonbuild.demo.colour_photos``), stored as JPEG q90 (``jpg``) with the photo's index (``cls``).

Both sides write the same fields: ``image`` RGBImageField(write_mode='jpg', jpeg_quality=90) and
``label`` IntField, with N writer workers (default: the CPUs of this machine).

- A: a fresh ``python`` process that imports ffcv and runs
  ``DatasetWriter(path, fields, num_workers=N).from_webdataset(shards, pipeline)`` with
  ``pipeline = lambda ds: ds.decode('rgb8').to_tuple('jpg', 'cls')``;
- B: a fresh ``betonbuild write --config C --dataset D --output F --workers N`` process, which derives
  the shard list (tar headers + sha256 of every shard), the source manifest, and writes the file
  (ffcv imported without its numba JIT, betonbuild/_compat/ffcv_import.py; plain JPEGs decoded with cv2,
  betonbuild/sources/webdataset.py).
- (``--snakemake``) C: ``snakemake all`` on a fresh copy of the project: shard list, manifest, smoke
  write + its verification, full write, full verification. Reported separately, not in the ratio.

Whole-process wall time (fork to reaped) and the peak RSS of the largest process of the tree
(``ru_maxrss`` from ``os.wait4``, which covers the process and the descendants it waited for;
the writer workers are separate processes, their memory is not summed). Sides alternate A B A B...
Then a content check: both files decode to the same logical content (labels equal in order,
images equal within a small tolerance; payload identity is reported too).

The machine may be shared: before each run the script waits (up to --max-wait s) until other
processes use fewer than --quiet-below cores, and records the CPU the rest of the machine used
during each run (``other_load_cores``); ``--retries N`` runs a side again when that was not low;
``quiet_*`` medians keep only the pairs where it stayed low. ``--phases N`` times the phases of each
side in-process.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / "bench" / "cache" / "webdataset_write"
SHARDS = 16
SAMPLES = 8000
CROP = 256
SEED = 20241129
PATTERN = "shards/train-{0000..0015}.tar"
DATASET = "bench_wds"
BIN = Path(sys.executable).parent

SIDE_A = textwrap.dedent(
    """
    import sys, time
    t0 = time.monotonic()
    from braceexpand import braceexpand
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    out, pattern, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    shards = list(braceexpand(pattern))
    pipeline = lambda ds: ds.decode('rgb8').to_tuple('jpg', 'cls')
    fields = {'image': RGBImageField(write_mode='jpg', jpeg_quality=90), 'label': IntField()}
    t1 = time.monotonic()
    DatasetWriter(out, fields, num_workers=workers).from_webdataset(shards, pipeline)
    print(f'imports {t1 - t0:.2f} s, write {time.monotonic() - t1:.2f} s', file=sys.stderr)
    """
)

# --phases: where the time goes, in one process per side (the same work as A and B, with timestamps)
PHASES_A = textwrap.dedent(
    """
    import json, sys, time
    t0 = time.monotonic()
    marks = {}
    mark = lambda name: marks.__setitem__(name, time.monotonic() - t0)
    import torch; mark("import torch")
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter, count_samples_in_shard, worker_job_webdataset
    mark("import ffcv (numba JIT at import: A only)")
    import webdataset, numpy as np
    from functools import partial
    from braceexpand import braceexpand
    from tqdm.contrib.concurrent import thread_map
    mark("import webdataset")
    shards = list(braceexpand(sys.argv[2]))
    pipeline = lambda ds: ds.decode('rgb8').to_tuple('jpg', 'cls')
    # what from_webdataset does, in its two steps
    lengths = thread_map(partial(count_samples_in_shard, pipeline=pipeline), shards, max_workers=int(sys.argv[3]),
                         disable=True)
    mark("count pass (decodes every sample)")
    fields = {'image': RGBImageField(write_mode='jpg', jpeg_quality=90), 'label': IntField()}
    writer = DatasetWriter(sys.argv[1], fields, num_workers=int(sys.argv[3]))
    writer._write_common(sum(lengths), zip(shards, np.cumsum([0] + lengths)[:-1]), worker_job_webdataset, (pipeline,))
    mark("write pass")
    print(json.dumps(marks))
    """
)
PHASES_B = textwrap.dedent(
    """
    import json, os, sys, tempfile, time
    t0 = time.monotonic()
    marks = {}
    mark = lambda name: marks.__setitem__(name, time.monotonic() - t0)
    import betonbuild.cli, betonbuild.workflow.stages; mark("import betonbuild")
    import torch; mark("import torch")
    import webdataset; mark("import webdataset")
    import ffcv.fields, ffcv.writer; mark("import ffcv (numba JIT at import: A only)")
    from betonbuild.config.load import load_config_file
    from betonbuild.workflow.stages import build, make_shard_list, make_source_manifest
    spec = load_config_file("config.yaml").datasets[sys.argv[2]]
    with tempfile.TemporaryDirectory() as tmp:
        make_shard_list(spec, tmp + "/shards.json"); mark("shard list (tar headers + sha256)")
        make_source_manifest(spec, tmp + "/source.json"); mark("source manifest")
        build(spec, tmp + "/source.json", sys.argv[1], sys.argv[1] + ".write.json", threads=int(sys.argv[3]),
              log=open(os.devnull, "w"))
        mark("write (decode once + encode)")
    print(json.dumps(marks))
    """
)


def phases(project: Path, workers: int, runs: int, quiet_below: float, max_wait: float) -> dict:
    """Median time of each phase of each side (cumulative marks turned into durations), and the process exit."""
    out: dict[str, dict] = {}
    for side, script, arg in (("A", PHASES_A, PATTERN), ("B", PHASES_B, DATASET)):
        samples: list[dict] = []
        for _ in range(runs):
            wait_until_quiet(quiet_below, max_wait)
            started = time.monotonic()
            proc = subprocess.run(
                [
                    sys.executable,
                    "-W",
                    "ignore",
                    "-c",
                    script,
                    str(project / f"phases-{side}.beton"),
                    arg,
                    str(workers),
                ],
                cwd=project,
                capture_output=True,
                text=True,
            )
            total = time.monotonic() - started
            if proc.returncode != 0:
                raise SystemExit(proc.stderr[-3000:])
            marks = json.loads(proc.stdout.strip().splitlines()[-1])
            durations, last = {}, 0.0
            for name, at in marks.items():
                durations[name], last = at - last, at
            durations["interpreter start + exit"] = total - last
            durations["total"] = total
            samples.append(durations)
        out[side] = {name: round(statistics.median(s[name] for s in samples), 2) for name in samples[0]}
    return out


def prepare() -> Path:
    """Writes the shards and the betonbuild config once; returns the project directory."""
    done = CACHE / "READY"
    if done.exists():
        return CACHE
    import webdataset as wds
    from PIL import Image

    from betonbuild.demo import colour_photos

    shutil.rmtree(CACHE, ignore_errors=True)
    (CACHE / "shards").mkdir(parents=True)
    photos = sorted(colour_photos().items())
    rng = np.random.default_rng(SEED)
    per_shard = SAMPLES // SHARDS
    for s in range(SHARDS):
        with wds.TarWriter(str(CACHE / "shards" / f"train-{s:04d}.tar")) as sink:
            for k in range(per_shard):
                label = int(rng.integers(len(photos)))
                image = photos[label][1]
                top = int(rng.integers(image.shape[0] - CROP + 1))
                left = int(rng.integers(image.shape[1] - CROP + 1))
                crop = np.ascontiguousarray(image[top : top + CROP, left : left + CROP, :3])
                jpeg = io.BytesIO()
                Image.fromarray(crop).save(jpeg, format="JPEG", quality=90)
                sink.write({"__key__": f"s{s:04d}_{k:05d}", "jpg": jpeg.getvalue(), "cls": label})
    (CACHE / "config.yaml").write_text(
        textwrap.dedent(
            f"""
        datasets:
          {DATASET}:
            source:
              kind: webdataset
              shards: {PATTERN}
              keys: {{image: jpg, label: cls}}
              decode: rgb8
            fields:
              image: {{type: rgb_image, write_mode: jpg, jpeg_quality: 90}}
              label: {{type: int}}
        """
        ).lstrip()
    )
    done.write_text("ok\n")
    return CACHE


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has spent busy (not idle, not iowait) since boot."""
    with open("/proc/stat") as fh:
        values = [int(v) for v in fh.readline().split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


def wait_until_quiet(limit_cores: float, max_wait: float) -> float:
    """Waits (up to max_wait s) until other processes use less than limit_cores; returns the last load seen."""
    deadline = time.monotonic() + max_wait
    while True:
        before = busy_cpu_seconds()
        time.sleep(2.0)
        load = (busy_cpu_seconds() - before) / 2.0
        if load < limit_cores or time.monotonic() > deadline:
            return load
        print(f"  waiting: other processes use {load:.2f} cores", flush=True)


def timed(cmd: list[str], cwd: Path, log: Path) -> dict:
    """Wall time, CPU time and peak RSS (largest process) of one fresh process tree, and what else ran."""
    busy_before = busy_cpu_seconds()
    with open(log, "w") as fh:
        started = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.monotonic() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
    busy = busy_cpu_seconds() - busy_before
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}); see {log}:\n{log.read_text()[-3000:]}")
    cpu = usage.ru_utime + usage.ru_stime
    return {
        "seconds": seconds,
        "max_rss_mib": usage.ru_maxrss / 1024,
        "cpu_seconds": cpu,
        # CPU the rest of the machine used meanwhile, in cores: 0 on a quiet machine
        "other_load_cores": max(0.0, busy - cpu) / seconds,
    }


def quiet_run(run, args, discarded: list[dict]) -> dict:
    """One run on a quiet machine: waits for it, and runs again (up to --retries times) when other
    processes took CPU during the run; the runs thrown away are kept in ``discarded``."""
    for attempt in range(args.retries + 1):
        wait_until_quiet(args.quiet_below, args.max_wait)
        result = run()
        if result["other_load_cores"] < args.quiet_below or attempt == args.retries:
            return result
        print(
            f"  discarded a run of {result['seconds']:.2f} s: other processes used "
            f"{result['other_load_cores']:.2f} cores meanwhile",
            flush=True,
        )
        discarded.append(result)


def side_a(project: Path, out: Path, workers: int) -> dict:
    out.unlink(missing_ok=True)
    return timed([sys.executable, "-c", SIDE_A, str(out), PATTERN, str(workers)], project, out.with_suffix(".log"))


def side_b(project: Path, out: Path, workers: int) -> dict:
    out.unlink(missing_ok=True)
    cmd = [
        str(BIN / "betonbuild"),
        "write",
        "--config",
        "config.yaml",
        "--dataset",
        DATASET,
        "--output",
        str(out),
        "--workers",
        str(workers),
    ]
    return timed(cmd, project, out.with_suffix(".log"))


def side_c(project: Path, workers: int) -> dict:
    """``snakemake all`` from nothing (results, logs and .snakemake removed first)."""
    for name in ("results", "logs", "benchmarks", ".snakemake"):
        shutil.rmtree(project / name, ignore_errors=True)
    cmd = [
        str(BIN / "snakemake"),
        "-s",
        str(REPO / "Snakefile"),
        "-d",
        str(project),
        "--configfile",
        str(project / "config.yaml"),
        "--cores",
        str(workers),
        "all",
    ]
    result = timed(cmd, project, project / "snakemake.log")
    stages = {}
    for tsv in sorted((project / "benchmarks").glob(f"*/{DATASET}.tsv")):
        stages[tsv.parent.name] = float(tsv.read_text().splitlines()[1].split("\t")[0])
    result["stages"] = stages
    return result


def content_check(a: Path, b: Path) -> dict:
    """Same logical content: labels equal in order, images within a small tolerance."""
    from betonbuild.beton.format import BetonFile
    from betonbuild.beton.payloads import decode_image

    fa, fb = BetonFile(a), BetonFile(b)
    assert fa.num_samples == fb.num_samples == SAMPLES, (fa.num_samples, fb.num_samples)
    labels_equal = bool(np.array_equal(fa.metadata["label"], fb.metadata["label"]))
    identical_payloads, worst = 0, 0.0
    for row in range(fa.num_samples):
        pa, pb = fa.variable_payload("image", row), fb.variable_payload("image", row)
        if pa.size == pb.size and np.array_equal(pa, pb):
            identical_payloads += 1
            continue
        ia, ib = decode_image(fa, "image", row), decode_image(fb, "image", row)
        worst = max(worst, float(np.abs(ia.astype(np.int16) - ib.astype(np.int16)).mean()))
    return {
        "samples": int(fa.num_samples),
        "labels_equal": labels_equal,
        "identical_jpeg_payloads": identical_payloads,
        "worst_mean_abs_error_of_the_others": worst,
        "ok": labels_equal and worst <= 1.0,
    }


def machine() -> dict:
    import importlib.metadata as md

    mem = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal"))
    model = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?"
    )
    return {
        "cpus": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "ram_gib": round(mem / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        **{pkg: md.version(pkg) for pkg in ("ffcv", "webdataset", "numpy", "opencv-python", "pillow", "snakemake")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--snakemake", action="store_true", help="also time `snakemake all` (not in the ratio)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--quiet-below",
        type=float,
        default=0.2,
        help="before each run, wait until other processes use fewer cores than this",
    )
    parser.add_argument("--max-wait", type=float, default=300.0, help="seconds to wait for a quiet machine")
    parser.add_argument(
        "--retries",
        type=int,
        default=0,
        help="run a side again (up to N times) when other processes used the CPU during it",
    )
    parser.add_argument(
        "--phases", type=int, default=0, metavar="N", help="also time the phases of each side (N runs each, medians)"
    )
    args = parser.parse_args()

    project = prepare()
    shard_bytes = sum(p.stat().st_size for p in (project / "shards").glob("*.tar"))
    out_a, out_b = project / "a.beton", project / "b.beton"
    runs = []
    discarded: list[dict] = []
    for pair in range(args.pairs):
        a = quiet_run(lambda: side_a(project, out_a, args.workers), args, discarded)
        b = quiet_run(lambda: side_b(project, out_b, args.workers), args, discarded)
        runs.append({"a": a, "b": b, "ratio": a["seconds"] / b["seconds"]})
        print(
            f"pair {pair + 1}: A {a['seconds']:.2f} s ({a['max_rss_mib']:.0f} MiB, other load "
            f"{a['other_load_cores']:.2f})  B {b['seconds']:.2f} s ({b['max_rss_mib']:.0f} MiB, other load "
            f"{b['other_load_cores']:.2f})  A/B {runs[-1]['ratio']:.2f}",
            flush=True,
        )
    check = content_check(out_a, out_b)
    quiet = [r for r in runs if max(r["a"]["other_load_cores"], r["b"]["other_load_cores"]) < args.quiet_below]
    result = {
        "machine": machine(),
        "data": {"shards": SHARDS, "samples": SAMPLES, "bytes": shard_bytes, "crop": CROP, "seed": SEED},
        "workers": args.workers,
        "runs": runs,
        "median_a_seconds": statistics.median(r["a"]["seconds"] for r in runs),
        "median_b_seconds": statistics.median(r["b"]["seconds"] for r in runs),
        "median_pair_ratio": statistics.median(r["ratio"] for r in runs),
        "median_a_max_rss_mib": statistics.median(r["a"]["max_rss_mib"] for r in runs),
        "median_b_max_rss_mib": statistics.median(r["b"]["max_rss_mib"] for r in runs),
        "median_a_cpu_seconds": statistics.median(r["a"]["cpu_seconds"] for r in runs),
        "median_b_cpu_seconds": statistics.median(r["b"]["cpu_seconds"] for r in runs),
        "max_other_load_cores": max(max(r["a"]["other_load_cores"], r["b"]["other_load_cores"]) for r in runs),
        "quiet_pairs": len(quiet),
        "discarded_runs": discarded,
        "quiet_median_a_seconds": statistics.median(r["a"]["seconds"] for r in quiet) if quiet else None,
        "quiet_median_b_seconds": statistics.median(r["b"]["seconds"] for r in quiet) if quiet else None,
        "quiet_median_pair_ratio": statistics.median(r["ratio"] for r in quiet) if quiet else None,
        "content_check": check,
    }
    if args.snakemake:
        wait_until_quiet(args.quiet_below, args.max_wait)
        result["snakemake_all"] = side_c(project, args.workers)
    if args.phases:
        result["phases"] = phases(project, args.workers, args.phases, args.quiet_below, args.max_wait)
    print(json.dumps({k: v for k, v in result.items() if k not in ("runs", "discarded_runs")}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
