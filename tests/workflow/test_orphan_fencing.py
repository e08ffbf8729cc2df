"""A killed orchestrator's orphaned job must neither block the next run silently nor overwrite its
verified file (issue 17, item 1). Real snakemake in its own process group, a real kill -9 of its main
process only, real orphaned write processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from conftest import BIN, SNAKEFILE, run_snakemake, write_config

from betonbuild.beton.format import BetonFile

# The full write blocks while the file `hold` exists (the smoke stage, which writes .smoke.beton,
# and the manifest are not held): the test decides when the orphan may finish.
GATED_ADAPTER = """
import glob
import os
import time

import numpy as np

WORKDIR = {workdir!r}


class Gated:
    def __init__(self, n, gate):
        self.n, self.gate = n, gate

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.gate and glob.glob(os.path.join(WORKDIR, "results/gated/.gated.beton.tmp-*")):
            while os.path.exists(os.path.join(WORKDIR, "hold")):
                time.sleep(0.1)
        return (np.full(8, int(i) % 251, dtype=np.uint8), int(i))


def make(n, gate):
    return Gated(n, gate)
"""


def config(n: int, gate: bool) -> dict:
    return {
        "gated": {
            "source": {"kind": "python", "factory": "gated:make", "args": {"n": n, "gate": gate}},
            "fields": {"x": {"type": "ndarray", "dtype": "uint8", "shape": [8]}, "y": {"type": "int"}},
            "smoke": {"samples": 4},
        }
    }


def processes_under(workdir: Path) -> set[int]:
    """Live processes whose command line names the working directory (the jobs' scripts live in it)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(workdir).encode() in cmdline and state != "Z":
            found.add(int(entry.name))
    return found


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_an_orphaned_write_of_a_killed_run_neither_unlocks_nor_overwrites_the_next_runs_file(tmp_path):
    (tmp_path / "gated.py").write_text(GATED_ADAPTER.format(workdir=str(tmp_path)))
    (tmp_path / "hold").touch()
    write_config(tmp_path, config(n=2000, gate=True))
    results = tmp_path / "results/gated"
    cmd = [str(BIN / "snakemake"), "-s", str(SNAKEFILE), "-d", str(tmp_path)]
    cmd += ["--configfile", str(tmp_path / "config.yaml"), "--cores", "2", "all"]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    with open(tmp_path / "first-run.out", "w") as out:
        first = subprocess.Popen(
            cmd, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    orphans: set[int] = set()
    try:
        wait_for(
            lambda: results.is_dir() and any(p.name.startswith(".gated.beton.tmp-") for p in results.iterdir()),
            timeout=240,
            what="the full write to start",
        )
        first_token = json.loads((tmp_path / ".snakemake/betonbuild-lock-owner.json").read_text()).get("token")
        os.kill(first.pid, signal.SIGKILL)  # the main process only, not its process group
        first.wait(timeout=30)
        orphans = processes_under(tmp_path)
        assert orphans, "the write job should outlive its killed orchestrator"

        write_config(tmp_path, config(n=300, gate=False))  # the user edits the config and runs again
        attempt = run_snakemake(tmp_path, "all", check=False)
        run_snakemake(tmp_path, "--unlock")  # what the refusal offers, to start over at once
        run_snakemake(tmp_path, "all")
        report = json.loads((results / "gated.verify.json").read_text())
        assert report["ok"] is True and report["num_samples"] == {"expected": 300, "found": 300}
        published = (results / "gated.beton").stat()

        (tmp_path / "hold").unlink()  # the orphan may now finish its 2,000-sample file
        wait_for(lambda: not (orphans & processes_under(tmp_path)), timeout=120, what="the orphan to end")

        assert BetonFile(results / "gated.beton").num_samples == report["num_samples"]["found"]
        assert (results / "gated.beton").stat().st_ino == published.st_ino, "the orphan replaced the file"
        assert not [p.name for p in results.iterdir() if ".tmp-" in p.name]
        # The orphan says why: on the killed run's console, and in the record beside the owner file
        # (its own log was removed when the newer run reran the job).
        second_token = json.loads((tmp_path / ".snakemake/betonbuild-lock-owner.json").read_text())["token"]
        refusal = (
            f"this job belongs to run {first_token}, superseded by run {second_token}; "
            "not publishing results/gated/gated.beton"
        )
        assert refusal in (tmp_path / "first-run.out").read_text()
        assert refusal in (tmp_path / ".snakemake/betonbuild-fenced.log").read_text()

        # The first attempt after the kill saw the orphan and kept the lock, naming its processes.
        said = attempt.stdout + attempt.stderr
        assert attempt.returncode != 0, said[-3000:]
        assert "still run" in said and any(str(pid) in said for pid in orphans), said[-3000:]
    finally:
        for pid in orphans | processes_under(tmp_path):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
