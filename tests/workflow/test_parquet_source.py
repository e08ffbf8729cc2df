"""The parquet and huggingface source kinds through real snakemake: both build and verify, and an
edited Parquet file rewrites exactly the part it is read into (a touched one, nothing)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import run_snakemake, write_config
from parquet_samples import IMAGE_FIELDS, NUMERIC_FIELDS, hf_image_dataset, write_numeric

from betonbuild.beton.format import BetonFile
from betonbuild.config.load import load_config
from betonbuild.config.spec import resolve_indices
from betonbuild.sources import open_source
from betonbuild.workflow.stages import smoke_rows

FILE_ROWS = 50  # three files of two 25-row row groups; a part per file


def datasets_config() -> dict:
    return {
        "nums": {
            "source": {"kind": "parquet", "path": "data/*.parquet"},
            "fields": NUMERIC_FIELDS,
            "samples_per_partition": FILE_ROWS,
            "smoke": {"samples": 2},
        },
        "photos": {
            "source": {"kind": "huggingface", "path": "hf/photos"},
            "fields": IMAGE_FIELDS,
            "smoke": {"samples": 2},
        },
    }


def jobs_run(result: subprocess.CompletedProcess) -> Counter:
    """(rule, dataset, part or None) of every job the run executed, from Snakemake's log."""
    jobs = Counter()
    for rule, body in re.findall(
        r"^(?:local)?(?:rule|checkpoint) (\w+):\n((?:    .*\n)+)", result.stdout + result.stderr, re.M
    ):
        ds = re.search(r"wildcards: ds=([\w-]+)", body)
        part = re.search(r"part=(\d+)", body)
        if ds:
            jobs[(rule, ds.group(1), int(part.group(1)) if part else None)] += 1
    return jobs


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    workdir = tmp_path_factory.mktemp("parquet_source")
    for i in range(3):
        write_numeric(workdir / f"data/part-{i}.parquet", FILE_ROWS, start=FILE_ROWS * i, row_group_size=25)
    hf_image_dataset(12).save_to_disk(str(workdir / "hf/photos"))
    write_config(workdir, datasets_config())
    return workdir, run_snakemake(workdir, "all", timeout=600)


@pytest.mark.parametrize("ds, samples", [("nums", 3 * FILE_ROWS), ("photos", 12)])
def test_both_kinds_build_and_verify(built, ds: str, samples: int):
    workdir, _ = built
    report = json.loads((workdir / f"results/{ds}/{ds}.verify.json").read_text())
    assert report["ok"], report
    assert BetonFile(str(workdir / f"results/{ds}/{ds}.beton")).num_samples == samples


def test_parts_are_the_files_row_groups(built):
    workdir, _ = built
    manifest = json.loads((workdir / "results/nums/source.json").read_text())
    assert [(p["start"], p["stop"]) for p in manifest["partitions"]] == [(0, 50), (50, 100), (100, 150)]


def smoke_touches(workdir: Path, first: int, stop: int) -> bool:
    """Whether the smoke stage reads a row in [first, stop)."""
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        spec = load_config({"datasets": datasets_config()}).datasets["nums"]
        source = open_source(spec)
        rows = np.concatenate(smoke_rows(spec, source, resolve_indices(spec.writer, len(source), "nums")))
    finally:
        os.chdir(cwd)
    return bool(((rows >= first) & (rows < stop)).any())


def test_an_edited_file_rewrites_its_part_and_a_touched_one_nothing(built):
    workdir, _ = built
    parts = workdir / "results/nums/parts"
    before = {i: (parts / f"{i}.beton").read_bytes() for i in range(3)}

    os.utime(workdir / "data/part-2.parquet")  # the same content (Snakemake's checksum of a small file)
    assert set(jobs_run(run_snakemake(workdir, "all"))) == set()

    write_numeric(workdir / "data/part-1.parquet", FILE_ROWS, start=1000, row_group_size=25)
    jobs = set(jobs_run(run_snakemake(workdir, "all")))
    expected = {
        ("source_manifest", "nums", None),
        ("write_part", "nums", 1),
        ("verify_part", "nums", 1),
        ("merge", "nums", None),
        ("verify", "nums", None),  # and the report's preview and summary
    }
    if smoke_touches(workdir, FILE_ROWS, 2 * FILE_ROWS):
        expected |= {("smoke", "nums", None)}  # the smoke write and its gate: one job
    assert jobs == expected
    after = {i: (parts / f"{i}.beton").read_bytes() for i in range(3)}
    assert [i for i in range(3) if before[i] != after[i]] == [1]
    assert json.loads((workdir / "results/nums/nums.verify.json").read_text())["ok"]
    beton = BetonFile(str(workdir / "results/nums/nums.beton"))
    assert beton.metadata["id"][FILE_ROWS : FILE_ROWS + 3].tolist() == [1000, 1001, 1002]
