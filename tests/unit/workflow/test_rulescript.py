"""Unit tests of betonbuild.workflow.rulescript: a rule script's output goes to its log, an error is
one clear line in it (Snakemake prints the log), a traceback goes beside it, a finished job exits at
once, and the stage comes from params.stage."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from betonbuild.workflow.rulescript import STAGES, stage_args

SCRIPT = """
import atexit, os, sys
from types import SimpleNamespace
from betonbuild.errors import BetonbuildError
from betonbuild.workflow.rulescript import run

log, case = sys.argv[1], sys.argv[2]
snakemake = SimpleNamespace(log=[log] if log else [], rule="write")
atexit.register(lambda: print("atexit handler ran", flush=True))


def stage():
    print("to stdout")
    print("to stderr", file=sys.stderr)
    os.system("echo from a child process")
    if case == "betonbuild":
        error = BetonbuildError("dataset 'd': the thing is wrong; fix it")
        if len(sys.argv) > 3:
            error.worker_traceback = "Traceback (worker): ..."
        raise error
    if case == "unexpected":
        raise ValueError("a bug")


run(snakemake, stage)
print("not reached: the job exits in run", flush=True)
"""


def run_script(tmp_path: Path, case: str, *extra: str, log: bool = True) -> tuple[subprocess.CompletedProcess, str]:
    log_path = tmp_path / "job.log"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(log_path) if log else "", case, *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done, log_path.read_text() if log else ""


def test_a_finished_job_logs_everything_runs_atexit_and_exits_zero_at_once(tmp_path):
    done, log = run_script(tmp_path, "ok")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == "", "the console stays quiet"
    assert log.splitlines() == ["to stdout", "to stderr", "from a child process", "atexit handler ran"]


def test_a_betonbuild_error_is_one_line_in_the_log_and_none_on_the_console(tmp_path):
    """Snakemake prints a failed job's log (show-failed-logs): a console copy would print it twice."""
    done, log = run_script(tmp_path, "betonbuild")
    line = "betonbuild error: dataset 'd': the thing is wrong; fix it"
    assert done.returncode == 1
    assert done.stderr == "" and done.stdout == ""
    assert log.splitlines()[-2:] == [line, "atexit handler ran"] and "Traceback" not in log
    assert log.count("betonbuild error:") == 1
    assert not (tmp_path / "job.traceback").exists()


def test_a_worker_traceback_goes_beside_the_log_not_into_it(tmp_path):
    done, log = run_script(tmp_path, "betonbuild", "with worker traceback")
    assert done.stderr == "" and done.returncode == 1
    assert log.splitlines()[-2:] == ["betonbuild error: dataset 'd': the thing is wrong; fix it", "atexit handler ran"]
    assert "Traceback" not in log
    assert (tmp_path / "job.traceback").read_text() == "Traceback (worker): ...\n"


def test_an_unexpected_error_is_one_line_in_the_log_naming_the_traceback_file(tmp_path):
    done, log = run_script(tmp_path, "unexpected")
    assert done.returncode == 1 and done.stderr == ""
    kept = tmp_path / "job.traceback"
    assert log.splitlines()[-2:] == [f"unexpected error: ValueError: a bug; traceback in {kept}", "atexit handler ran"]
    assert "Traceback" not in log
    assert "Traceback (most recent call last)" in kept.read_text() and "ValueError: a bug" in kept.read_text()
    assert "not reached" not in log


def test_a_traceback_file_of_an_earlier_run_is_removed(tmp_path):
    (tmp_path / "job.traceback").write_text("Traceback of an earlier run")
    done, _ = run_script(tmp_path, "ok")
    assert done.returncode == 0
    assert not (tmp_path / "job.traceback").exists()


def test_without_a_log_the_error_is_printed_once(tmp_path):
    done, _ = run_script(tmp_path, "betonbuild", log=False)
    assert done.returncode == 1
    assert done.stderr.count("betonbuild error:") == 1
    assert "to stderr" in done.stderr and "to stdout" in done.stdout


def test_without_a_log_an_unexpected_error_prints_its_traceback_to_stderr(tmp_path):
    done, _ = run_script(tmp_path, "unexpected", log=False)
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr
    assert done.stderr.count("unexpected error: ValueError: a bug; traceback in the output above") == 1


EXIT = """
import multiprocessing, sys, time
from betonbuild._compat.fast_exit import exit_without_teardown

child = multiprocessing.Process(target=time.sleep, args=(0.5,))
child.start()
exit_without_teardown()
print("returned: a child is still running", flush=True)
child.join()
exit_without_teardown()
print("not reached")
"""


def test_a_job_with_a_live_child_process_exits_normally_so_the_child_is_joined():
    done = subprocess.run([sys.executable, "-c", EXIT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "returned: a child is still running\n"


def job(stage, part=None) -> SimpleNamespace:
    return SimpleNamespace(rule="any_name", params=SimpleNamespace(stage=stage), wildcards=SimpleNamespace(part=part))


def test_the_stage_comes_from_params_not_from_the_rule_name():
    assert STAGES == ("smoke", "full", "part")
    assert stage_args(job("smoke")) == {"smoke": True, "part": None}
    assert stage_args(job("full")) == {"smoke": False, "part": None}
    assert stage_args(job("part", part="3")) == {"smoke": False, "part": 3}


def test_an_unknown_stage_is_refused():
    with pytest.raises(ValueError, match=r"rule any_name: params.stage is 'verify_smoke', expected one of"):
        stage_args(job("verify_smoke"))
