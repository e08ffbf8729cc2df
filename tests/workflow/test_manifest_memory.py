"""The source_manifest job stays within the memory it declares, whatever length a python source claims.

The job is the first to learn a python source's length, after Snakemake scheduled it with a
declared mem_mb (on SLURM, the job's memory limit). A length beyond what it was declared for is
refused before the order is built, with the figure that makes it run; following that fix works.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from conftest import run_snakemake, write_config

ADAPTER = textwrap.dedent(
    """
    class Long:
        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            return (float(i), int(i))


    def make(n):
        return Long(n)
    """
)


def long_dataset(workdir: Path, n: int) -> None:
    (workdir / "bb_long_adapter.py").write_text(ADAPTER)
    source = {"kind": "python", "factory": "bb_long_adapter:make", "args": {"n": n}}
    write_config(workdir, {"long": {"source": source, "fields": {"x": {"type": "float"}, "y": {"type": "int"}}}})


def test_a_source_longer_than_the_manifest_job_declared_is_refused_before_allocating(tmp_path: Path):
    long_dataset(tmp_path, 2 * 10**9)  # 16 GB of sample order: fits this machine, not the job
    result = run_snakemake(tmp_path, "results/long/source.json", check=False, timeout=120)
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "dataset 'long': the source has 2,000,000,000 samples: the source_manifest job needs about" in out
    assert "--set-resources source_manifest:mem_mb=" in out
    assert "MemoryError" not in out and "Unable to allocate" not in out
    assert not (tmp_path / "results" / "long" / "source.json").exists()


def test_following_the_message_lets_the_manifest_job_run(tmp_path: Path):
    long_dataset(tmp_path, 40_000_000)  # just beyond the 32M samples the job asks room for
    refused = run_snakemake(tmp_path, "results/long/source.json", check=False, timeout=120)
    fix = re.search(r"--set-resources source_manifest:mem_mb=(\d+)", refused.stdout + refused.stderr)
    assert refused.returncode != 0 and fix, refused.stderr[-3000:]
    run_snakemake(tmp_path, "results/long/source.json", "--set-resources", f"source_manifest:mem_mb={fix.group(1)}")
    assert '"length": 40000000' in (tmp_path / "results" / "long" / "source.json").read_text()
