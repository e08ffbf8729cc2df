"""Failure records saved by jobs that run side by side (the parts of one dataset share
``results/{ds}/failure/``): no job's save breaks another's, and the smallest index wins."""

from __future__ import annotations

import json
import multiprocessing
import time

from betonbuild.config.load import load_config
from betonbuild.errors import SampleError
from betonbuild.write.failure import FAILURE_FILE, save_failure

SPEC = load_config(
    {"datasets": {"ds": {"source": {"kind": "python", "factory": "m:f"}, "fields": {"x": {"type": "int"}}}}}
).datasets["ds"]


def save_many(directory: str, indices: list[int], started: float, errors) -> None:
    for index in indices:
        try:
            save_failure(directory, SPEC, {index: (index,)}, SampleError("ds", "x", index, "bad"), "part", started)
        except Exception as exc:  # noqa: BLE001 - reported to the test
            errors.put(f"{type(exc).__name__}: {exc}")


def test_parts_saving_failures_at_once_keep_the_smallest_index(tmp_path):
    directory = str(tmp_path / "failure")
    started = time.time()
    errors = multiprocessing.get_context("fork").Queue()
    jobs = [
        multiprocessing.get_context("fork").Process(target=save_many, args=(directory, list(r), started, errors))
        for r in (range(500, 560), range(40, 100))
    ]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join(60)
    assert [job.exitcode for job in jobs] == [0, 0]
    assert errors.empty(), errors.get()
    record = json.loads((tmp_path / "failure" / FAILURE_FILE).read_text())
    assert record["index"] == 40
    assert (tmp_path / "failure" / "sample.pkl").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".failure.lock", "failure"]  # no scratch left


def test_a_failure_from_an_earlier_run_is_replaced_even_with_a_smaller_index(tmp_path):
    directory = tmp_path / "failure"
    save_failure(directory, SPEC, {3: (3,)}, SampleError("ds", "x", 3, "old"), "full")
    time.sleep(0.05)
    save_failure(directory, SPEC, {900: (900,)}, SampleError("ds", "x", 900, "new"), "full", started=time.time())
    assert json.loads((directory / FAILURE_FILE).read_text())["index"] == 900
