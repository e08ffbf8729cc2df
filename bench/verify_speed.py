"""Full verification vs the write it verifies, side by side on the same machine and cores.

Data: N (default 20,000) 256x256 crops of the real colour photographs bundled with scikit-image and
scikit-learn, at seeded random positions (and mirrored half of the time), saved as JPEG (quality 95)
in an image folder, one class per photograph. The dataset stores them as JPEG (quality 90).

Measured, each in a fresh process so that neither warms the other's imports (the page cache is
warmed for both: the source is read once before the first timing), alternately (write first, then
verify first, ...), REPEATS times, each after waiting for the machine's other jobs to be quiet;
wall and CPU seconds (user + system, child processes included) are printed for each run:
  write   betonbuild.write.write_beton: CPUS ffcv writer processes (what `rule write` runs)
  verify  betonbuild.verify.verify_beton in mode full on CPUS threads: every sample decoded and
          compared with its source, structural checks, content digest, sha256 of the file and one
          ffcv.Loader batch (what `rule verify` runs)
Both also as whole CLI commands (`betonbuild write` / `betonbuild verify`), imports included.

    .venv/bin/python bench/verify_speed.py [--samples 20000] [--dir /tmp/betonbuild-bench] [--cpus 2]
        [--repeats 3] [--quiet-below 0.25] [--max-wait 600]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
QUIET_CPU_SECONDS = 0.5  # a run is "quiet" if other processes used less CPU than this meanwhile


def make_source(root: Path, n: int, size: int = 256, seed: int = 0) -> None:
    """N JPEG crops of real photos under root/<photo>/<k>.jpg (skipped if already complete)."""
    from PIL import Image

    sys.path.insert(0, str(REPO))
    from betonbuild.demo import colour_photos

    marker = root / f".complete-{n}"
    if marker.exists():
        return
    photos = {name: img for name, img in sorted(colour_photos().items()) if min(img.shape[:2]) >= size}
    rng = np.random.default_rng(seed)
    names = sorted(photos)
    for k in range(n):
        name = names[k % len(names)]
        photo = photos[name]
        top = int(rng.integers(0, photo.shape[0] - size + 1))
        left = int(rng.integers(0, photo.shape[1] - size + 1))
        crop = photo[top : top + size, left : left + size, :3]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.ascontiguousarray(crop)).save(folder / f"{k:06d}.jpg", quality=95)
    marker.touch()


def config(root: Path, cpus: int) -> dict:
    return {"datasets": {"crops": {
        "source": {"kind": "image_folder", "root": str(root)},
        "fields": {"image": {"type": "rgb_image", "write_mode": "jpg", "jpeg_quality": 90}, "label": {"type": "int"}},
        "writer": {"num_workers": cpus, "chunksize": 100},
        "verify": {"mode": "full", "samples": 256},
    }}}


STAGE = r"""
import json, sys, time, os, resource
import numpy as np
sys.path.insert(0, {repo!r})
os.chdir({workdir!r})
import ffcv.fields, ffcv.writer, ffcv.loader  # imports outside the timing
from betonbuild.spec import load_config
from betonbuild.sources import open_source
spec = load_config(json.load(open('config.json'))).datasets['crops']
source = open_source(spec)
rows = np.arange(len(source))
def cpu():
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
cpu_before = cpu()
if {stage!r} == 'write':
    from betonbuild.write import write_beton
    started = time.perf_counter()
    write_beton(spec, source, rows, 'crops.beton', {cpus}, log=open(os.devnull, 'w'))
    seconds = time.perf_counter() - started
    extra = {{}}
else:
    from betonbuild.provenance import ffcv_build
    from betonbuild.verify import verify_beton
    started = time.perf_counter()
    report = verify_beton(spec, source, rows, 'crops.beton', ffcv_build(), threads={cpus})
    seconds = time.perf_counter() - started
    assert report['ok'], report['worst']
    image = next(c for c in report['checks'] if c['name'] == 'variable_fields')['fields']['image']
    extra = {{'mode': report['mode'], 'compared': image['compared'], 'jpeg_mean_abs_error_mean': image['jpeg_mean_abs_error_mean'],
             'jpeg_mean_abs_error_max': image['jpeg_mean_abs_error_max'], 'digest': report['content_digest']}}
print(json.dumps({{'seconds': seconds, 'cpu_seconds': cpu() - cpu_before, **extra}}))
"""


def busy_seconds() -> float:
    """CPU seconds every process on the machine has used (from /proc/stat)."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def wait_for_quiet(below: float, max_wait: float) -> float:
    """Waits until the machine's other jobs use fewer than ``below`` cores (over 2 s), at most ``max_wait`` s."""
    started = time.perf_counter()
    while True:
        before = busy_seconds()
        time.sleep(2)
        if (busy_seconds() - before) / 2 < below or time.perf_counter() - started > max_wait:
            return time.perf_counter() - started - 2


def run_stage(stage: str, workdir: Path, cpus: int) -> dict:
    """Runs one stage in a fresh process; ``other_cpu_seconds`` is what the whole machine used meanwhile."""
    code = STAGE.format(repo=str(REPO), workdir=str(workdir), stage=stage, cpus=cpus)
    before = busy_seconds()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["other_cpu_seconds"] = busy_seconds() - before  # the caller subtracts the stage's own CPU
    return result


def run_cli(args: list[str], workdir: Path) -> float:
    started = time.perf_counter()
    subprocess.run([str(Path(sys.executable).parent / "betonbuild"), *args], cwd=workdir, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--dir", default="/tmp/betonbuild-bench")
    parser.add_argument("--cpus", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quiet-below", type=float, default=0.25,
                        help="before each run, wait until other jobs use fewer cores than this (default 0.25)")
    parser.add_argument("--max-wait", type=float, default=600, help="but wait at most this long (seconds)")
    args = parser.parse_args()
    workdir = Path(args.dir)
    root = workdir / f"crops-{args.samples}"
    workdir.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    make_source(root, args.samples)
    print(f"source: {args.samples} JPEG crops in {root} ({time.perf_counter() - t:.1f} s to prepare)")
    (workdir / "config.json").write_text(json.dumps(config(root, args.cpus)))
    import yaml

    (workdir / "config.yaml").write_text(yaml.safe_dump(config(root, args.cpus)))
    subprocess.run(["cat", *map(str, root.rglob("*.jpg"))], stdout=subprocess.DEVNULL, check=True)  # page cache
    rows, clean = [], []
    for repeat in range(args.repeats):
        stages = {}
        for stage in ("write", "verify") if repeat % 2 == 0 else ("verify", "write"):  # alternate the order
            waited = wait_for_quiet(args.quiet_below, args.max_wait)
            if waited > 1:
                print(f"(waited {waited:.0f} s for other jobs to use under {args.quiet_below} cores)", flush=True)
            used_before = resource.getrusage(resource.RUSAGE_CHILDREN)
            stages[stage] = result = run_stage(stage, workdir, args.cpus)
            used_after = resource.getrusage(resource.RUSAGE_CHILDREN)
            mine = (used_after.ru_utime + used_after.ru_stime) - (used_before.ru_utime + used_before.ru_stime)
            result["other_cpu_seconds"] = max(0.0, result["other_cpu_seconds"] - mine)
        write, verify = stages["write"], stages["verify"]
        rows.append((write["seconds"], verify["seconds"], write["cpu_seconds"], verify["cpu_seconds"]))
        for stage in ("write", "verify"):
            if stages[stage]["other_cpu_seconds"] < QUIET_CPU_SECONDS:
                clean.append((stage, stages[stage]["seconds"]))
        quiet = all(stages[s]["other_cpu_seconds"] < QUIET_CPU_SECONDS for s in stages)
        print(f"run {repeat + 1}: write {write['seconds']:.2f} s ({write['cpu_seconds']:.1f} CPU s), "
              f"full verify {verify['seconds']:.2f} s ({verify['cpu_seconds']:.1f} CPU s; {verify['compared']} "
              f"samples, JPEG mean abs error {verify['jpeg_mean_abs_error_mean']} avg / "
              f"{verify['jpeg_mean_abs_error_max']} max); other processes used {write['other_cpu_seconds']:.1f} / "
              f"{verify['other_cpu_seconds']:.1f} CPU s meanwhile{'' if quiet else ' (not quiet)'}", flush=True)
    size = (workdir / "crops.beton").stat().st_size
    cli_write = run_cli(["write", "--config", "config.yaml", "--dataset", "crops", "--output", "crops.beton",
                         "--workers", str(args.cpus)], workdir)
    cli_verify = run_cli(["verify", "--config", "config.yaml", "--dataset", "crops", "crops.beton",
                          "--threads", str(args.cpus), "--output", "crops.verify.json"], workdir)
    quiet_write = [t for stage, t in clean if stage == "write"]
    quiet_verify = [t for stage, t in clean if stage == "verify"]
    if quiet_write and quiet_verify:
        print(f"quiet stage runs (other processes used under {QUIET_CPU_SECONDS} CPU s meanwhile): write "
              f"{len(quiet_write)} of {len(rows)}, median {np.median(quiet_write):.2f} s; full verify "
              f"{len(quiet_verify)} of {len(rows)}, median {np.median(quiet_verify):.2f} s "
              f"(ratio {np.median(quiet_verify) / np.median(quiet_write):.2f})")
    writes, verifies, write_cpu, verify_cpu = (np.array(x) for x in zip(*rows))
    print(f"\nfile: {size / 2**20:.0f} MiB; cpus: {args.cpus}")
    print(f"in-process, median of {args.repeats}: write {np.median(writes):.2f} s, full verify {np.median(verifies):.2f} s "
          f"(ratio {np.median(verifies) / np.median(writes):.2f}); best: write {writes.min():.2f} s, "
          f"full verify {verifies.min():.2f} s; CPU seconds (median): write {np.median(write_cpu):.1f}, "
          f"verify {np.median(verify_cpu):.1f}")
    print(f"whole CLI commands (imports, source manifest): betonbuild write {cli_write:.2f} s, "
          f"betonbuild verify {cli_verify:.2f} s")


if __name__ == "__main__":
    main()
