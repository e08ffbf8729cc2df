"""A job's error reaches the console of a real `snakemake` run exactly once, with the log's path,
and without a Python traceback (tracebacks stay under logs/).

Two bad datasets in one `--keep-going` run with the default workflow profile (as `snakemake all`
runs): one stopped by the smoke stage, one that passes the smoke gate and fails in the full write
inside a writer worker (the case whose worker traceback was printed between two copies of the
message)."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import PROFILES, run_snakemake, write_config

ADAPTER = textwrap.dedent(
    """
    import numpy as np


    class Late:
        '''Good float32 samples, except float64 from index `at` on.'''

        def __init__(self, n, at):
            self.n, self.at = n, at

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            dtype = np.float64 if i >= self.at else np.float32
            return np.full((2, 3), i, dtype=dtype), int(i)


    def make(n, at):
        return Late(n, at)
    """
)

SMOKE_MESSAGE = (
    "betonbuild error: dataset 'bad_smoke', field 'image', sample index 0: dtype float64 does not match "
    "the field's uint8 (shape (8, 8))"
)
FULL_MESSAGE = "betonbuild error: dataset 'bad_full', field 'arr', sample index 280: dtype float64 does not match"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    workdir = tmp_path_factory.mktemp("printed_once")
    (workdir / "late.py").write_text(ADAPTER)
    np.savez(workdir / "floats.npz", images=np.zeros((50, 8, 8)), target=np.arange(50))
    write_config(
        workdir,
        {
            "bad_smoke": {
                "source": {"kind": "arrays", "path": "floats.npz", "columns": {"image": "images", "label": "target"}},
                "fields": {"image": {"type": "ndarray", "dtype": "uint8", "shape": [8, 8]}, "label": {"type": "int"}},
                "smoke": {"samples": 4},
            },
            "bad_full": {
                "source": {"kind": "python", "factory": "late:make", "args": {"n": 300, "at": 280}},
                "fields": {"arr": {"type": "ndarray", "dtype": "float32", "shape": [2, 3]}, "label": {"type": "int"}},
                # the smoke samples: 0 and 1 (no seeded-random pick reaches index 280 with 2 of 300)
                "smoke": {"samples": 2},
                "writer": {"num_workers": 2, "chunksize": 20},
            },
        },
    )
    return workdir, run_snakemake(workdir, "--keep-going", timeout=240, check=False)


@pytest.mark.parametrize(
    "message, log",
    # the smoke stage is the first of a write job
    [(SMOKE_MESSAGE, "logs/write/bad_smoke.log"), (FULL_MESSAGE, "logs/write/bad_full.log")],
    ids=["smoke", "full_write_in_a_worker"],
)
def test_the_error_is_printed_once_and_names_its_log(run, message: str, log: str):
    workdir, result = run
    assert result.returncode != 0
    console = result.stdout + result.stderr
    assert console.count(message) == 1, console[-6000:]
    assert log in console, console[-6000:]
    assert message in (workdir / log).read_text(), "the log holds the message too"


def test_no_traceback_reaches_the_console(run):
    workdir, result = run
    console = result.stdout + result.stderr
    assert FULL_MESSAGE in console, console[-6000:]
    assert "Traceback (most recent call last)" not in console, console[-6000:]
    assert "  File " not in console, console[-6000:]


def test_the_worker_traceback_is_kept_under_logs(run):
    workdir, _ = run
    kept = (workdir / "logs/write/bad_full.traceback").read_text()
    assert "Traceback (most recent call last)" in kept and "SampleError" in kept
    assert "Traceback" not in (workdir / "logs/write/bad_full.log").read_text()


@pytest.mark.parametrize("profile", ["default", "slurm", "cluster-generic"])
def test_every_profile_shows_the_failed_log_which_is_where_the_message_is(profile: str):
    """The job writes its error to its log only: without show-failed-logs it would not reach the console."""
    settings = yaml.safe_load((PROFILES[profile] / "config.yaml").read_text())
    assert settings["show-failed-logs"] is True
