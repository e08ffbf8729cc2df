"""``betonbuild run``: the Snakemake command line it builds (the runs themselves: tests/workflow/test_package.py)."""

from __future__ import annotations

import pytest

from betonbuild.errors import BetonbuildError
from betonbuild.project.run import snakemake_command, with_packaged_profiles
from betonbuild.workflow_files import profile, profile_names, snakefile


def test_the_packaged_files_are_there():
    assert snakefile().is_file()
    assert {"default", "slurm", "cluster-generic"} <= set(profile_names())
    assert profile("nope") is None


def test_configfile_comes_before_the_targets_and_options(tmp_path):
    (tmp_path / "config.yaml").write_text("datasets: {}\n")
    cmd = snakemake_command(tmp_path, ["all", "--cores", "2"])
    i = cmd.index("--configfile")
    assert cmd[i + 1] == str(tmp_path / "config.yaml") and cmd[i + 2] == "-s"
    assert cmd[-3:] == ["all", "--cores", "2"]
    assert cmd[cmd.index("-d") + 1] == str(tmp_path)


def test_a_packaged_profile_is_found_by_name_and_replaces_the_local_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert with_packaged_profiles(["--profile", "slurm", "-n"]) == [
        "--profile",
        str(profile("slurm")),
        "-n",
        "--workflow-profile",
        "none",
    ]
    assert with_packaged_profiles(["--profile=cluster-generic"])[0] == f"--profile={profile('cluster-generic')}"
    assert with_packaged_profiles(["--profile", "slurm", "--workflow-profile", "mine"])[-1] == "mine"
    (tmp_path / "slurm").mkdir()  # a directory of that name here is the user's own profile
    assert with_packaged_profiles(["--profile", "slurm"])[:2] == ["--profile", "slurm"]
    assert with_packaged_profiles(["--cores", "2"]) == ["--cores", "2"]


def test_a_directory_without_config_names_the_fix(tmp_path):
    with pytest.raises(BetonbuildError, match="no config.yaml .*betonbuild init"):
        snakemake_command(tmp_path, [])
