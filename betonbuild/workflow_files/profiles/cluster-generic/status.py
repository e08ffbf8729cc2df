#!/usr/bin/env python3
"""Snakemake's cluster-generic status command: prints running, success or failed for a SLURM job.

Called as ``status.py JOBID`` (``JOBID`` as ``sbatch --parsable`` printed it, ``id`` or
``id;cluster``). Asks slurmctld first (``scontrol show job``), which works with or without
accounting storage and knows a job until MinJobAge seconds after it ended; then ``sacct``, which
knows finished jobs for longer where the site keeps accounting. A job neither knows is reported
failed (with the reason on stderr): Snakemake then retries it instead of waiting forever.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

RUNNING = {
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "RESIZING",
    "SIGNALING",
    "STAGE_OUT",
    "STOPPED",
    "RESV_DEL_HOLD",
}
SUCCESS = {"COMPLETED"}
# Everything else has ended badly: FAILED, CANCELLED, TIMEOUT, OUT_OF_MEMORY, NODE_FAIL,
# BOOT_FAIL, DEADLINE, PREEMPTED, SPECIAL_EXIT, REVOKED.
ATTEMPTS = 3  # slurmctld can be briefly too busy to answer


def verdict(state: str) -> str:
    if state in SUCCESS:
        return "success"
    if state in RUNNING:
        return "running"
    return "failed"


def query(cmd: list[str]) -> tuple[int, str, str]:
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 1, "", str(exc)
    return result.returncode, result.stdout, result.stderr


def scontrol_state(jobid: str, cluster: list[str]) -> str | None:
    """The JobState slurmctld reports, or None once it has forgotten the job (or never knew it)."""
    for attempt in range(ATTEMPTS):
        code, out, err = query(["scontrol", *cluster, "-o", "show", "job", jobid])
        if code == 0:
            match = re.search(r"\bJobState=(\S+)", out)
            if match:
                return match.group(1)
        if "Invalid job id" in err:
            return None
        time.sleep(1 + attempt)
    return None


def sacct_state(jobid: str, cluster: list[str]) -> str | None:
    """The state in the accounting database; None without accounting storage or record."""
    code, out, _ = query(["sacct", *cluster, "-n", "-X", "-P", "-j", jobid, "-o", "State"])
    lines = out.split()
    return lines[0] if code == 0 and lines else None  # "CANCELLED by 0" -> "CANCELLED"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: status.py JOBID", file=sys.stderr)
        return 2
    jobid, _, cluster_name = argv[1].strip().partition(";")
    cluster = ["-M", cluster_name] if cluster_name else []
    state = scontrol_state(jobid, cluster) or sacct_state(jobid, cluster)
    if state is None:
        print(
            f"status.py: SLURM job {jobid} is unknown to slurmctld (it ended more than MinJobAge "
            "ago) and to sacct (no accounting storage?); reporting it as failed",
            file=sys.stderr,
        )
        print("failed")
        return 0
    print(verdict(state))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
