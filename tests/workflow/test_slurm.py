"""The workflow on a real SLURM: profiles/slurm and profiles/cluster-generic, unchanged.

A single-node cluster (tests/slurm_cluster.py) runs on this machine without accounting storage,
as many sites do: `sacct` fails, so these runs also prove that the profiles do not depend on it.
Skipped, with the reason, only where the cluster cannot exist at all (not Debian, not root, or the
machine runs its own SLURM); in CI (``BETONBUILD_REQUIRE_SLURM=1``, set by .ci/run) that fails.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from conftest import PROFILES, make_digits_npz, run_betonbuild, run_snakemake, write_config
from slurm_cluster import SlurmCluster, unavailable_reason

STATUS = PROFILES["cluster-generic"] / "status.py"
STAGES = ("source_manifest", "write", "verify")  # write: the smoke write and its gate, then the full write
# Status polling fast enough for a test; the profiles keep the plugins' defaults for real clusters.
FAST_POLLING = ("--seconds-between-status-checks", "1")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    reason = unavailable_reason()
    if not reason and Path("/etc/slurm/slurm.conf").exists():
        reason = "this machine has its own SLURM (/etc/slurm/slurm.conf), which srun inside jobs would use"
    if reason:
        # CI (.ci/run) must run these tests: there a skip is a failure
        skip_or_fail = pytest.fail if os.environ.get("BETONBUILD_REQUIRE_SLURM") else pytest.skip
        skip_or_fail(f"no SLURM cluster on this machine: {reason}")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    previous = os.environ.get("SLURM_CONF")
    try:
        cluster.start()
        os.environ["SLURM_CONF"] = str(cluster.conf)  # run_snakemake passes os.environ on
        yield cluster
    finally:
        cluster.stop()
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous


def digits_dataset(seed: int) -> dict:
    return {
        "source": {"kind": "arrays", "path": "digits.npz", "columns": {"image": "images", "label": "target"}},
        "fields": {"image": {"type": "ndarray", "dtype": "uint8", "shape": [8, 8]}, "label": {"type": "int"}},
        "writer": {"shuffle": True, "seed": seed},
        "smoke": {"samples": 4},
    }


def project(workdir: Path, names: list[str]) -> Path:
    make_digits_npz(workdir / "digits.npz", n=100)
    write_config(workdir, {name: digits_dataset(seed) for seed, name in enumerate(names)})
    return workdir


def assert_verified(workdir: Path, names: list[str]) -> None:
    for name in names:
        for report in ("smoke.verify.json", f"{name}.verify.json"):
            rep = json.loads((workdir / "results" / name / report).read_text())
            assert rep["ok"] is True, (name, report, rep["worst"])
        assert json.loads((workdir / "results" / name / f"{name}.verify.json").read_text())["num_samples"] == {
            "expected": 100,
            "found": 100,
        }


def completed_jobs(cluster: SlurmCluster, ids: list[str]) -> dict[str, dict]:
    """The jobcomp records of ``ids``, once SLURM has written them all."""
    deadline = time.monotonic() + 30
    while True:
        records = {job["JobId"]: job for job in cluster.jobcomp() if job["JobId"] in ids}
        if len(records) == len(ids) or time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def test_sacct_fails_on_this_cluster_as_on_sites_without_accounting(slurm):
    """With sacct failing, plugin 2.8.0 drops the job from its watch list and waits forever."""
    result = slurm.run("sacct", check=False)
    assert result.returncode != 0 and "accounting storage is disabled" in result.stderr
    profile = yaml.safe_load((PROFILES["slurm"] / "config.yaml").read_text())
    assert profile["slurm-status-command"] == "squeue"


def test_slurm_profile_runs_every_job_through_sbatch(slurm, tmp_path):
    """Through the entry point a project outside the repository uses: the packaged profile found by name."""
    workdir = project(tmp_path, ["digits"])
    result = run_betonbuild(
        workdir,
        "run",
        "--cores",
        "2",
        "--profile",
        "slurm",
        *FAST_POLLING,
        "--slurm-init-seconds-before-status-checks",
        "1",
        "all",
        timeout=240,
    )
    log = result.stdout + result.stderr
    submitted = re.findall(r"Job \d+ has been submitted with SLURM jobid (\d+) \(log: .*/rule_(\w+)/", log)
    assert sorted(rule for _, rule in submitted) == sorted(STAGES), log[-3000:]
    assert_verified(workdir, ["digits"])
    jobs = completed_jobs(slurm, [jobid for jobid, _ in submitted])
    assert {jobid: job["JobState"] for jobid, job in jobs.items()} == {jobid: "COMPLETED" for jobid, _ in submitted}
    assert {job["Partition"] for job in jobs.values()} == {"compute"}  # the profile's default-resources


def test_cluster_generic_profile_runs_every_job_through_sbatch(slurm, tmp_path):
    """Two datasets: their jobs share the node (memory per job, not the whole node)."""
    names = ["digits", "digits2"]
    workdir = project(tmp_path, names)
    result = run_snakemake(
        workdir,
        "--profile",
        str(PROFILES["cluster-generic"]),
        "--workflow-profile",
        "none",
        *FAST_POLLING,
        "all",
        timeout=240,
    )
    log = result.stdout + result.stderr
    ids = re.findall(r"Submitted job \d+ with external jobid '(\d+)'", log)
    assert len(ids) == len(STAGES) * len(names), log[-3000:]
    assert_verified(workdir, names)
    jobs = completed_jobs(slurm, ids)
    assert sorted(job["Name"] for job in jobs.values()) == sorted(
        f"smk-{stage}-ds={name}" for stage in STAGES for name in names
    )
    assert all(job["JobState"] == "COMPLETED" for job in jobs.values())
    for job in jobs.values():
        # write and the full verify run on writer.num_workers threads (-1: the run's --cores 2); the
        # smoke job on two: its write, and the gate's Loader process importing ffcv meanwhile
        cpus = 2 if job["Name"].startswith(("smk-write-", "smk-verify-", "smk-smoke-")) else 1
        assert job["ProcCnt"] == str(cpus), job
        mem = int(re.search(r"mem=(\d+)M", job["Tres"]).group(1))
        assert 700 < mem < 4000, job  # from rules/resources.smk, not the node's memory
    assert sorted(p.name for p in (workdir / "logs/slurm").iterdir()) == sorted(
        f"{job['Name'].split('-')[1]}-{jobid}.log" for jobid, job in jobs.items()
    )


def test_a_partitioned_dataset_writes_each_part_as_its_own_cluster_job(slurm, tmp_path):
    """Three parts, each written and verified by its own sbatch jobs (any node may take each), merged
    into one verified file."""
    make_digits_npz(tmp_path / "digits.npz", n=100)
    write_config(tmp_path, {"digits": {**digits_dataset(0), "partitions": 3}})
    result = run_snakemake(
        tmp_path,
        "--profile",
        str(PROFILES["cluster-generic"]),
        "--workflow-profile",
        "none",
        *FAST_POLLING,
        "all",
        timeout=240,
    )
    log = result.stdout + result.stderr
    ids = re.findall(r"Submitted job \d+ with external jobid '(\d+)'", log)
    jobs = completed_jobs(slurm, ids)
    rules = sorted(job["Name"].split("-")[1] for job in jobs.values())
    stages = ["source_manifest", "smoke", "merge", "verify"] + ["write_part", "verify_part"] * 3
    assert rules == sorted(stages), rules
    parts = [job for job in jobs.values() if job["Name"].startswith("smk-write_part-")]
    assert sorted(re.search(r"part=(\d+)", job["Name"]).group(1) for job in parts) == ["0", "1", "2"]
    assert all(job["JobState"] == "COMPLETED" and job["ProcCnt"] == "1" for job in parts)
    assert_verified(tmp_path, ["digits"])


def status(jobid: str) -> str:
    result = subprocess.run([str(STATUS), jobid], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def wait_for_status(jobid: str, wanted: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while (seen := status(jobid)) != wanted and time.monotonic() < deadline:
        time.sleep(0.5)
    return seen


def test_status_script_reports_running_success_and_failed(slurm, tmp_path):
    def submit(script: str) -> str:
        return slurm.run(
            "sbatch", "--parsable", "--mem=50", f"--output={tmp_path}/%j.out", "--wrap", script
        ).stdout.strip()

    ok, bad, sleeper = submit("true"), submit("exit 3"), submit("sleep 60")
    assert wait_for_status(ok, "success") == "success"
    assert wait_for_status(bad, "failed") == "failed"
    assert wait_for_status(sleeper, "running") == "running"
    slurm.run("scancel", sleeper)
    assert wait_for_status(sleeper, "failed") == "failed"


def test_status_script_reports_a_job_nobody_knows_as_failed(slurm):
    result = subprocess.run([str(STATUS), "999999"], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "failed"
    assert "unknown to slurmctld" in result.stderr
