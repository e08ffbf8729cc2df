"""``betonbuild run`` / ``betonbuild status``: the packaged workflow on a project directory.

The project's ``config.yaml`` is the only config (the packaged Snakefile names none, so no demo
dataset is merged in), the project is the working directory, and every other argument goes to
Snakemake unchanged, except that a ``--profile`` naming one of the packaged profiles
(``slurm``, ``cluster-generic``) is given as its path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from betonbuild.errors import BetonbuildError
from betonbuild.workflow_files import profile, snakefile

CONFIG_NAMES = ("config.yaml", os.path.join("config", "config.yaml"))


def project_config(project: Path) -> Path:
    """The project's config: DIR/config.yaml (or DIR/config/config.yaml, this repository's layout)."""
    for name in CONFIG_NAMES:
        if (project / name).is_file():
            return project / name
    raise BetonbuildError(
        f"{project} has no config.yaml (looked for {' and '.join(str(project / n) for n in CONFIG_NAMES)}); "
        f"create a project with `betonbuild init {project}`, or pass -d DIR of one"
    )


def with_packaged_profiles(args: list[str]) -> list[str]:
    """``--profile NAME`` -> the packaged profile's path, when NAME is not a path that exists here.

    A cluster profile replaces the local one: ``--workflow-profile none`` is added (unless given),
    since Snakemake would otherwise apply the packaged ``profiles/default`` over it, key by key.
    """
    out, named_profile = [], False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--profile" and i + 1 < len(args):
            out += [arg, _profile_path(args[i + 1])]
            named_profile, i = True, i + 2
            continue
        if arg.startswith("--profile="):
            out.append("--profile=" + _profile_path(arg.split("=", 1)[1]))
            named_profile = True
        else:
            out.append(arg)
        i += 1
    if named_profile and not any(a == "--workflow-profile" or a.startswith("--workflow-profile=") for a in args):
        out += ["--workflow-profile", "none"]
    return out


def _profile_path(name: str) -> str:
    if os.path.exists(name):
        return name
    packaged = profile(name)
    if packaged is None:
        return name  # Snakemake looks for it in its own places and names them when it is not there
    return str(packaged)


def snakemake_command(project: Path, args: list[str]) -> list[str]:
    """The Snakemake command line. ``--configfile`` comes first and is followed by ``-s``: after it, a
    target would be read as a second config file."""
    return [
        sys.executable,
        "-m",
        "snakemake",
        "--configfile",
        str(project_config(project)),
        "-s",
        str(snakefile()),
        "-d",
        str(project),
        *with_packaged_profiles(args),
    ]


def run(project: Path, args: list[str]) -> int:
    """Snakemake's exit status; its own output goes straight to the console.

    The config is checked here first, in the project directory as the workflow would (adapters are
    imported from it): an error is one line naming the key, not Snakemake's report of a failed parse.
    """
    # why local: the config checks and ffcv's check load numpy, which `betonbuild --help` need not import
    from betonbuild.config.load import load_config_file
    from betonbuild.project.system import ffcv_problem

    command = snakemake_command(project, args)
    os.chdir(project)
    load_config_file(project_config(project))
    if not _is_dry_run(args):
        problem = ffcv_problem()
        if problem:
            raise BetonbuildError(problem)
    return subprocess.run(command, cwd=project).returncode


def _is_dry_run(args: list[str]) -> bool:
    return any(a in ("-n", "--dry-run", "--dryrun", "--lint", "--list-rules", "--dag", "--rulegraph") for a in args)
