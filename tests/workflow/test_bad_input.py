"""The bad-input matrix: every kind of bad sample and bad config, through the real entry points.

Each case asserts: a non-zero exit; a message naming the dataset, the field and the sample index
(when the sample as a whole is wrong - too few values, a missing dict key, ``__getitem__`` raised -
it names the configured fields or the key instead of one field); an end well within 60 s; no ``.beton``
(nor a temp file) at the target path; the failing sample
saved under ``results/{ds}/failure/`` and replayed by ``betonbuild repro`` with the same message.

How the cases run (the suite must stay fast on 2 cores, and importing ffcv costs ~4 s per process):

- the sample-contract matrix: one driver process imports ffcv once, then FORKS one child per case
  that runs ``betonbuild.cli.main(["write", ...])`` exactly as the ``betonbuild`` script does
  (2 writer workers, its own process group, stdout/stderr to files, atexit handlers run on exit),
  then ``main(["repro", ...])``. The driver kills a child that is not done in 60 s.
- the cases that need a process of their own (5000 samples with 2 workers, SIGTERM, a full disk,
  ``betonbuild repro``) run the real ``.venv/bin/betonbuild`` script as a subprocess;
- a ``--keep-going`` snakemake run with a good dataset beside several bad ones, and snakemake runs
  on bad configs (which must fail before any job runs, with the exact message).

The bad samples come from ``badsource.py``, an adapter module this file writes into each workdir
(``ADAPTER_SOURCE`` below): ``make(family=..., kind=..., n=..., at=...)`` returns a dataset whose
samples are good except at index ``at`` (or from ``at`` to ``until``), where it yields one kind of
bad sample.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path
from typing import Any

import pytest
from conftest import BIN, run_snakemake, write_config
from parquet_samples import NUMERIC_FIELDS, write_numeric

from betonbuild.config.spec import smoke_positions
from betonbuild.fields import FIELD_KINDS

BETONBUILD = str(BIN / "betonbuild")
PYTHON = str(BIN / "python")
HARNESS_LIMIT = 60.0  # a case that takes longer than this is a hang
MATRIX_PARALLEL = 3  # cases run side by side: most of a failing case is the writer's 1 s error grace
MATRIX_BUDGET = 500.0  # the whole forked matrix; below pytest-timeout's 600 s so a hang is reported, not killed

# ---------------------------------------------------------------------------------------------
# The adapter module written into each workdir.
# ---------------------------------------------------------------------------------------------

ADAPTER_SOURCE = textwrap.dedent(
    '''
    """Written by tests/workflow/test_bad_input.py: datasets that yield one kind of bad sample."""

    import time

    import numpy as np


    def good(family, i):
        if family in ("basic", "dict"):
            sample = (i, i / 2)
            return {"a": sample[0], "b": sample[1]} if family == "dict" else sample
        if family == "array":
            return np.full((2, 3), i, dtype=np.float32), i
        if family == "big":
            return np.full((100, 100), i % 7, dtype=np.float32), i
        if family == "tensor":
            import torch

            return torch.full((2, 3), float(i)), i
        if family == "image":
            return np.full((8, 8, 3), i % 256, dtype=np.uint8), i
        if family == "bytes":
            return np.frombuffer(f"sample {i}".encode(), dtype=np.uint8), i
        if family == "json":
            return {"i": i, "name": f"s{i}"}, i
        raise ValueError(f"unknown family {family!r}")


    def bad(kind, i):
        """One bad sample of each kind; the family's other fields stay good."""
        if kind == "getitem_raises":
            with open(f"raised_at_{i}.txt", "w") as fh:  # when the worker raised (the exit bound counts from it)
                fh.write(repr(time.time()))
            raise RuntimeError(f"corrupt record {i}")
        if kind.startswith("image_mode_"):
            from PIL import Image

            return Image.new(kind[len("image_mode_"):], (8, 8)), i
        if kind.startswith("tensor_") or kind == "image_tensor":
            import torch
        table = {
            # arity and sample shape
            "arity_short": lambda: (i,),
            "arity_long": lambda: (i, 1.0, 2),
            "not_a_tuple": lambda: "oops",
            "dict_missing_key": lambda: {"a": i},
            "dict_extra_key": lambda: {"a": i, "b": 1.0, "c": 3},
            # int
            "int_float": lambda: (3.9, 1.0),
            "int_str": lambda: ("7", 1.0),
            "int_bool": lambda: (True, 1.0),
            "int_none": lambda: (None, 1.0),
            "int_overflow": lambda: (2**64, 1.0),
            "int_uint64_overflow": lambda: (np.uint64(2**64 - 1), 1.0),
            # float
            "float_none": lambda: (i, None),
            "float_str": lambda: (i, "2.5"),
            "float_bool": lambda: (i, True),
            # ndarray
            "ndarray_float64": lambda: (np.zeros((2, 3), dtype=np.float64), i),
            "ndarray_int32": lambda: (np.zeros((2, 3), dtype=np.int32), i),
            "ndarray_shape": lambda: (np.zeros((3, 2), dtype=np.float32), i),
            "ndarray_bigendian": lambda: (np.zeros((2, 3), dtype=">f4"), i),
            "ndarray_list": lambda: ([[0.0] * 3] * 2, i),
            "ndarray_unseeded": lambda: (np.random.rand(2, 3).astype(np.float32), i),  # differs on every read
            # torch_tensor (no GPU here: the meta device stands in for cuda, it takes the same path)
            "tensor_dtype": lambda: (torch.zeros(2, 3, dtype=torch.float64), i),
            "tensor_shape": lambda: (torch.zeros(3, 2), i),
            "tensor_grad": lambda: (torch.zeros(2, 3, requires_grad=True), i),
            "tensor_device": lambda: (torch.zeros(2, 3, device="meta"), i),
            "tensor_numpy": lambda: (np.zeros((2, 3), dtype=np.float32), i),
            # rgb_image
            "image_chw": lambda: (np.zeros((3, 8, 8), dtype=np.uint8), i),
            "image_float": lambda: (np.zeros((8, 8, 3), dtype=np.float32), i),
            "image_gray_array": lambda: (np.zeros((8, 8), dtype=np.uint8), i),
            "image_tensor": lambda: (torch.zeros(3, 8, 8, dtype=torch.uint8), i),
            "image_empty": lambda: (np.zeros((0, 8, 3), dtype=np.uint8), i),
            # bytes
            "bytes_int64": lambda: (np.arange(5, dtype=np.int64), i),
            "bytes_float": lambda: (np.array([300.2]), i),
            "bytes_empty": lambda: (b"", i),
            "bytes_empty_array": lambda: (np.zeros(0, dtype=np.uint8), i),
            "bytes_str": lambda: ("text", i),
            "bytes_2d": lambda: (np.zeros((2, 2), dtype=np.uint8), i),
            # json
            "json_numpy_int": lambda: ({"i": np.int64(i)}, i),
            "json_numpy_in_list": lambda: ({"xs": [1.0, np.float32(2.0)]}, i),
            "json_ndarray": lambda: (np.arange(3), i),
            "json_nan": lambda: ({"score": float("nan")}, i),
            "json_inf": lambda: ({"score": float("inf")}, i),
            "json_set": lambda: ({"tags": {"a", "b"}}, i),
            "json_int_key": lambda: ({1: "one"}, i),
            # larger than a page (page_size 2MiB)
            "page_bytes": lambda: (np.ones(3 << 20, dtype=np.uint8), i),
            "page_image": lambda: (np.zeros((1200, 1000, 3), dtype=np.uint8), i),
        }
        return table[kind]()


    class BadDataset:
        def __init__(self, family, kind, n, at, until, sleep):
            self.family, self.kind, self.n, self.at, self.until, self.sleep = family, kind, n, at, until, sleep

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            if self.sleep:
                time.sleep(self.sleep)
            if self.kind is not None and self.at <= i < self.until:
                return bad(self.kind, i)
            return good(self.family, i)


    def make(family="basic", kind=None, n=200, at=150, until=None, sleep=0.0):
        if family == "explode":
            raise ValueError("cannot open /nowhere/index.csv")
        return BadDataset(family, kind, n, at, at + 1 if until is None else until, sleep)
    '''
).lstrip()

FAMILY_FIELDS: dict[str, dict[str, Any]] = {
    "basic": {"a": {"type": "int"}, "b": {"type": "float"}},
    "dict": {"a": {"type": "int"}, "b": {"type": "float"}},
    "array": {"arr": {"type": "ndarray", "dtype": "float32", "shape": [2, 3]}, "label": {"type": "int"}},
    "big": {"arr": {"type": "ndarray", "dtype": "float32", "shape": [100, 100]}, "label": {"type": "int"}},
    "tensor": {"t": {"type": "torch_tensor", "dtype": "float32", "shape": [2, 3]}, "label": {"type": "int"}},
    "image": {"image": {"type": "rgb_image"}, "label": {"type": "int"}},
    "bytes": {"data": {"type": "bytes"}, "label": {"type": "int"}},
    "json": {"meta": {"type": "json"}, "label": {"type": "int"}},
}


def python_dataset(
    family: str,
    kind: str | None = None,
    *,
    factory: str = "badsource:make",
    writer: dict | None = None,
    smoke: int | None = None,
    **args,
) -> dict:
    entry: dict[str, Any] = {
        "source": {"kind": "python", "factory": factory, "args": {"family": family, "kind": kind, **args}},
        "fields": FAMILY_FIELDS.get(family, FAMILY_FIELDS["basic"]),
    }
    if writer:
        entry["writer"] = writer
    if smoke:
        entry["smoke"] = {"samples": smoke}
    return entry


def workdir_with_adapter(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "badsource.py").write_text(ADAPTER_SOURCE)
    return path


def beton_leftovers(workdir: Path, name: str) -> list[str]:
    """The target .beton and any temp file of it: none may exist after a failed write."""
    folder = workdir / "results" / name
    found = [folder / f"{name}.beton"] + list(folder.glob(f".{name}.beton.tmp-*"))
    return [str(p) for p in found if p.exists()]


def assert_names(message: str, dataset: str, field: str | None, index: int | None) -> None:
    assert f"dataset '{dataset}'" in message, message
    if field is not None:
        assert f"field '{field}'" in message, message
    if index is not None:
        assert f"sample index {index}" in message, message


# ---------------------------------------------------------------------------------------------
# The sample-contract matrix (forked `betonbuild write` per case).
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    kind: str
    family: str
    field: str | None  # None: the sample as a whole is wrong, `why` then names the fields or key
    why: tuple[str, ...]  # substrings of the message that say what is wrong
    at: int = 150
    n: int = 200
    until: int | None = None
    writer: dict = dc_field(default_factory=dict)

    @property
    def dataset(self) -> str:
        return f"bad_{self.kind}"


PAGE_2MIB = {"page_size": "2MiB"}
NAMES = "fields are configured ['a', 'b']"

CASES = [
    # arity / sample shape: no single field is at fault, the message names the configured fields
    Case("arity_short", "basic", None, ("sample has 1 values but 2 " + NAMES,)),
    Case("arity_long", "basic", None, ("sample has 3 values but 2 " + NAMES,)),
    Case("not_a_tuple", "basic", None, ("sample is a str, not a tuple, list or dict",)),
    Case("dict_missing_key", "dict", None, ("dict sample has no key 'b'",)),
    Case("dict_extra_key", "dict", None, ("dict sample has unexpected key 'c'", "fields are ['a', 'b']")),
    # int
    Case("int_float", "basic", "a", ("int field got float 3.9",)),
    Case("int_str", "basic", "a", ("int field got str '7'",)),
    Case("int_bool", "basic", "a", ("int field got bool True",)),
    Case("int_none", "basic", "a", ("int field got NoneType None",)),
    Case("int_overflow", "basic", "a", ("int value 18446744073709551616 does not fit in int64",)),
    Case("int_uint64_overflow", "basic", "a", ("int value 18446744073709551615 does not fit in int64",)),
    # float
    Case("float_none", "basic", "b", ("float field got NoneType None",)),
    Case("float_str", "basic", "b", ("float field got str '2.5'",)),
    Case("float_bool", "basic", "b", ("float field got bool True",)),
    # ndarray: dtype, shape, byte order
    Case("ndarray_float64", "array", "arr", ("dtype float64 does not match the field's float32",)),
    Case("ndarray_int32", "array", "arr", ("dtype int32 does not match the field's float32",)),
    Case("ndarray_shape", "array", "arr", ("shape (3, 2) does not match the field's (2, 3)",)),
    Case("ndarray_bigendian", "array", "arr", ("array is >f4 (non-native byte order)",)),
    Case("ndarray_list", "array", "arr", ("ndarray field got list",)),
    # torch_tensor: dtype, shape, device, grad
    Case("tensor_dtype", "tensor", "t", ("dtype torch.float64 does not match the field's torch.float32",)),
    Case("tensor_shape", "tensor", "t", ("shape (3, 2) does not match the field's (2, 3)",)),
    Case("tensor_grad", "tensor", "t", ("tensor requires grad",)),
    Case("tensor_device", "tensor", "t", ("tensor is on meta",)),
    Case("tensor_numpy", "tensor", "t", ("torch_tensor field got numpy array",)),
    # rgb_image: PIL modes (YCbCr/LAB/HSV are accepted silently by ffcv), CHW, dtype, grey, empty
    *[
        Case(f"image_mode_{mode}", "image", "image", (f"PIL image has mode {mode}, not RGB",))
        for mode in ("L", "P", "RGBA", "YCbCr", "LAB", "HSV")
    ],
    Case("image_chw", "image", "image", ("looks channels-first (CHW)",)),
    Case("image_float", "image", "image", ("dtype=float32", "RGB images are uint8")),
    Case("image_gray_array", "image", "image", ("shape=(8, 8)", "expected HxWx3 RGB")),
    Case("image_tensor", "image", "image", ("image is a torch tensor",)),
    Case("image_empty", "image", "image", ("image is 8x0; each side must be 1..65535 pixels",)),
    # bytes: other dtypes (ffcv casts value by value), empty values, not bytes at all
    Case("bytes_int64", "bytes", "data", ("dtype=int64", "ffcv would cast every value to one byte")),
    Case("bytes_float", "bytes", "data", ("dtype=float64", "ffcv would cast every value to one byte")),
    Case("bytes_empty", "bytes", "data", ("value is empty",)),
    Case("bytes_empty_array", "bytes", "data", ("value is empty",)),
    Case("bytes_str", "bytes", "data", ("bytes field got str 'text'",)),
    Case("bytes_2d", "bytes", "data", ("shape=(2, 2)",)),
    # json: numpy values, NaN/inf, sets, non-str keys
    Case("json_numpy_int", "json", "meta", ("value['i'] is a int64", "JSON needs plain Python values")),
    Case("json_numpy_in_list", "json", "meta", ("value['xs'][1] is a float32",)),
    Case("json_ndarray", "json", "meta", ("value is a numpy array",)),
    Case("json_nan", "json", "meta", ("value['score'] is nan, which JSON cannot represent",)),
    Case("json_inf", "json", "meta", ("value['score'] is inf, which JSON cannot represent",)),
    Case("json_set", "json", "meta", ("not JSON-encodable", "set")),
    Case("json_int_key", "json", "meta", ("has key 1 of type int; JSON would turn it into a string",)),
    # larger than a page: the message names the size and the smallest page_size that fits
    Case(
        "page_bytes",
        "bytes",
        "data",
        ("sample needs 3145728 bytes", "one page holds 2097152", "set writer.page_size to at least 4MiB (4194304)"),
        writer=PAGE_2MIB,
    ),
    Case(
        "page_image",
        "image",
        "image",
        ("sample needs 3600000 bytes", "one page holds 2097152", "set writer.page_size to at least 4MiB (4194304)"),
        writer=PAGE_2MIB,
    ),
    # the user's __getitem__ raises
    Case("getitem_raises", "basic", None, ("the source's __getitem__ raised RuntimeError: corrupt record 150",)),
    # every sample from 100 on is bad, both workers fail: the smallest failing index is reported
    Case("ndarray_float64", "array", "arr", ("dtype float64 does not match",), at=100, n=400, until=400),
]
CASE_IDS = [c.dataset if c.until is None else f"{c.dataset}_from_{c.at}" for c in CASES]

# The same samples as the page cases, with the page_size their message asks for: must then succeed.
PAGE_FIXES = {"fixed_page_bytes": ("bytes", "page_bytes"), "fixed_page_image": ("image", "page_image")}

DRIVER_SOURCE = textwrap.dedent(
    """
    import atexit, json, os, signal, sys, time, traceback

    import numpy, PIL.Image, torch  # noqa: F401 - imported once here, not in every case
    import ffcv.fields, ffcv.writer  # noqa: F401
    from multiprocessing import resource_tracker, shared_memory

    import betonbuild.cli

    resource_tracker.ensure_running()  # shared by every case: it then cannot hide a leaked segment
    plan = json.load(open(sys.argv[1]))
    deadline = time.monotonic() + plan["budget"]


    def group_members(pgid):
        members = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as fh:
                        fields = fh.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(fields[2]) == pgid and fields[0] != "Z":
                    members.append(int(entry))
        return members


    def paths(tag):
        return [os.path.join(plan["out_dir"], f"{tag}.{s}") for s in ("out", "err", "shm")]


    def child(argv, tag):
        # `betonbuild <argv>` as the console script runs it, in its own process group
        out, err, shm_log = paths(tag)
        rc = 70
        try:
            os.setsid()
            os.chdir(plan["workdir"])
            for fd, path in ((1, out), (2, err)):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
            original_init = shared_memory.SharedMemory.__init__

            def init(self, name=None, create=False, size=0, *args, **kwargs):
                original_init(self, name, create, size, *args, **kwargs)
                if create:
                    with open(shm_log, "a") as fh:
                        fh.write(self._name + "\\n")

            shared_memory.SharedMemory.__init__ = init
            sys.argv = ["betonbuild", *argv]
            rc = betonbuild.cli.main(argv)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
            rc = 71
        finally:
            try:
                atexit._run_exitfuncs()
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(rc)


    def collect(pid, tag, started, status, timed_out):
        seconds = time.monotonic() - started
        leftover = group_members(pid)  # worker processes must be gone with their parent
        settle = time.monotonic() + 2.0
        while leftover and time.monotonic() < settle:
            time.sleep(0.05)
            leftover = group_members(pid)
        if leftover:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out, err, shm_log = paths(tag)
        created = open(shm_log).read().split() if os.path.exists(shm_log) else []
        return {
            "rc": None if timed_out else os.waitstatus_to_exitcode(status),
            "timed_out": timed_out,
            "seconds": round(seconds, 3),
            "stdout": open(out).read(),
            "stderr": open(err).read(),
            "leftover_processes": leftover,
            "shm_created": created,
            "leftover_shm": [name for name in created if os.path.exists("/dev/shm/" + name)],
        }


    results = {}
    todo = [(item["name"], "write", item["argv"]) for item in plan["runs"]]
    running = {}  # pid -> (name, step, started)
    while todo or running:
        while todo and len(running) < plan["parallel"] and time.monotonic() < deadline:
            name, step, argv = todo.pop(0)
            pid = os.fork()
            if pid == 0:
                child(argv, f"{name}.{step}")
            running[pid] = (name, step, time.monotonic())
        if not running:
            for name, step, _ in todo:
                results.setdefault(name, {})[step] = {"rc": None, "timed_out": True, "seconds": 0.0,
                                                      "stderr": "not run: the matrix budget ran out", "stdout": ""}
            break
        time.sleep(0.02)
        for pid, (name, step, started) in list(running.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            timed_out = not done and time.monotonic() - started > plan["limit"]
            if timed_out:
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            if done or timed_out:
                del running[pid]
                result = collect(pid, f"{name}.{step}", started, status, timed_out)
                results.setdefault(name, {})[step] = result
                failure = os.path.join(plan["workdir"], "results", name, "failure")
                if step == "write" and result["rc"] not in (0, None) and os.path.isdir(failure):
                    todo.insert(0, (name, "repro", ["repro", failure]))
    with open(plan["results"], "w") as fh:
        json.dump(results, fh)
    """
).lstrip()


@pytest.fixture(scope="module")
def matrix(tmp_path_factory) -> tuple[Path, dict]:
    """Runs every matrix case (and the page-size fixes) once; returns (workdir, results by dataset)."""
    workdir = workdir_with_adapter(tmp_path_factory.mktemp("matrix"))
    datasets: dict[str, dict] = {}
    for case in CASES:
        name = case.dataset if case.until is None else f"{case.dataset}_from_{case.at}"
        datasets[name] = python_dataset(
            case.family, case.kind, n=case.n, at=case.at, until=case.until, writer={"chunksize": 10, **case.writer}
        )
    for name, (family, kind) in PAGE_FIXES.items():
        datasets[name] = python_dataset(family, kind, n=40, at=25, writer={"chunksize": 10, "page_size": "4MiB"})
    write_config(workdir, datasets)
    out_dir = workdir / "driver"
    out_dir.mkdir()
    runs = [
        {
            "name": name,
            "argv": [
                "write",
                "--config",
                "config.yaml",
                "--dataset",
                name,
                "--output",
                f"results/{name}/{name}.beton",
                "--workers",
                "2",
            ],
        }
        for name in datasets
    ]
    plan = {
        "workdir": str(workdir),
        "out_dir": str(out_dir),
        "results": str(out_dir / "results.json"),
        "limit": HARNESS_LIMIT,
        "budget": MATRIX_BUDGET,
        "parallel": MATRIX_PARALLEL,
        "runs": runs,
    }
    (out_dir / "plan.json").write_text(json.dumps(plan))
    driver = subprocess.run(
        [PYTHON, "-c", DRIVER_SOURCE, str(out_dir / "plan.json")],
        capture_output=True,
        text=True,
        timeout=MATRIX_BUDGET + 60,
        cwd=workdir,
    )
    assert driver.returncode == 0, f"matrix driver failed:\n{driver.stdout[-3000:]}\n{driver.stderr[-6000:]}"
    return workdir, json.loads((out_dir / "results.json").read_text())


CASE_PARAMS = [pytest.param(case, id=case_id) for case, case_id in zip(CASES, CASE_IDS)]


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_bad_sample_fails_cleanly_and_names_dataset_field_and_index(matrix, case: Case):
    workdir, results = matrix
    name = case.dataset if case.until is None else f"{case.dataset}_from_{case.at}"
    write = results[name]["write"]
    stderr = write["stderr"]
    assert not write["timed_out"], f"{name}: no exit within {HARNESS_LIMIT} s (a hang):\n{stderr[-3000:]}"
    assert write["seconds"] < 30, f"{name} took {write['seconds']} s"
    assert write["rc"] == 1, f"{name}: exit code {write['rc']}\n{stderr[-3000:]}"
    assert "Traceback" not in stderr, f"{name}: an unexpected error instead of a clean message:\n{stderr[-3000:]}"
    error_line = next((line for line in stderr.splitlines() if line.startswith("betonbuild error: ")), "")
    assert error_line, stderr[-3000:]
    assert_names(error_line, name, case.field, case.at)
    for part in case.why:
        assert part in error_line, f"{part!r} not in {error_line!r}"
    assert f"replay it with: betonbuild repro results/{name}/failure" in stderr
    assert beton_leftovers(workdir, name) == []
    assert write["leftover_processes"] == [], f"{name}: writer processes outlived the write"
    assert write["shm_created"] and write["leftover_shm"] == [], f"{name}: shared memory left behind"

    # results/{ds}/failure/: the smallest failing index, the field mapping, the traceback, the sample
    failure_dir = workdir / "results" / name / "failure"
    record = json.loads((failure_dir / "failure.json").read_text())
    assert record["dataset"] == name
    assert record["index"] == case.at
    assert record["field"] == case.field
    assert record["stage"] == "full"
    assert list(record["spec"]["fields"]) == list(FAMILY_FIELDS[case.family])
    assert record["spec"]["source"]["args"]["kind"] == case.kind
    # the traceback of the failure as it happened in the worker (for a page overflow: ffcv's own error)
    assert record["traceback"].startswith("Traceback (most recent call last)")
    assert _last_line(record["traceback"]).startswith(
        ("betonbuild.errors.SampleError: ", "ValueError: Tried allocating")
    ), record["traceback"][-600:]
    assert error_line == f"betonbuild error: {record['message']}"
    if case.kind == "getitem_raises":
        assert record["sample_file"] is None and "corrupt record" in record["sample_unavailable"]
    else:
        assert record["sample_file"] == "sample.pkl" and (failure_dir / "sample.pkl").stat().st_size > 0

    # `betonbuild repro results/{ds}/failure` replays it: exit 1, the same message
    repro = results[name]["repro"]
    assert not repro["timed_out"] and repro["rc"] == 1, repro["stderr"][-3000:]
    assert f"reproduced: {record['message']}" in repro["stderr"]


def _last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


@pytest.mark.parametrize("name", sorted(PAGE_FIXES))
def test_the_page_size_the_message_names_is_enough(matrix, name: str):
    """The page cases say "at least 4MiB": the same samples written with page_size 4MiB succeed."""
    workdir, results = matrix
    write = results[name]["write"]
    assert write["rc"] == 0, write["stderr"][-3000:]
    assert (workdir / "results" / name / f"{name}.beton").is_file()
    assert json.loads(write["stdout"])["page_size"] == 4 << 20
    assert write["leftover_processes"] == [] and write["leftover_shm"] == []


# ---------------------------------------------------------------------------------------------
# Cases that need a process of their own: the real `betonbuild` script.
# ---------------------------------------------------------------------------------------------


def betonbuild(workdir: Path, *args: str, timeout: float = HARNESS_LIMIT, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([BETONBUILD, *args], cwd=workdir, capture_output=True, text=True, timeout=timeout, **kwargs)


def write_args(name: str, workers: int = 2) -> list[str]:
    return [
        "write",
        "--config",
        "config.yaml",
        "--dataset",
        name,
        "--output",
        f"results/{name}/{name}.beton",
        "--workers",
        str(workers),
    ]


def test_getitem_raising_at_1000_of_5000_with_2_workers_ends_fast_and_repro_replays_it(tmp_path):
    workdir = workdir_with_adapter(tmp_path / "w")
    write_config(workdir, {"big_source": python_dataset("basic", "getitem_raises", n=5000, at=1000)})
    started = time.monotonic()
    result = betonbuild(workdir, *write_args("big_source"))
    ended, seconds = time.time(), time.monotonic() - started
    assert result.returncode == 1, result.stderr[-3000:]
    assert seconds < 30, f"took {seconds:.1f} s"
    raised_at = float((workdir / "raised_at_1000.txt").read_text())
    assert ended - raised_at < 10, f"the write ended {ended - raised_at:.1f} s after the worker raised"
    assert (
        "betonbuild error: dataset 'big_source', sample index 1000: "
        "the source's __getitem__ raised RuntimeError: corrupt record 1000"
    ) in result.stderr
    assert beton_leftovers(workdir, "big_source") == []
    record = json.loads((workdir / "results/big_source/failure/failure.json").read_text())
    assert record["index"] == 1000 and record["field"] is None
    assert "RuntimeError: corrupt record 1000" in record["traceback"]

    repro = betonbuild(workdir, "repro", "results/big_source/failure")
    assert repro.returncode == 1, repro.stderr[-3000:]
    assert f"reproduced: {record['message']}" in repro.stderr


def _live(pids: list[int]) -> list[int]:
    import psutil

    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_mid_write_cleans_up_and_a_rerun_completes(tmp_path, signum):
    import psutil

    workdir = workdir_with_adapter(tmp_path / "w")
    # 3000 samples at 5 ms each over 2 workers: ~7.5 s of writing
    write_config(workdir, {"slow": python_dataset("array", None, n=3000, sleep=0.005, writer={"chunksize": 50})})
    results = workdir / "results" / "slow"
    proc = subprocess.Popen(
        [BETONBUILD, *write_args("slow")],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 40
        while not list(results.glob(".slow.beton.tmp-*")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(results.glob(".slow.beton.tmp-*")), "the write never started"
        time.sleep(2.0)
        assert proc.poll() is None, "the write ended before the SIGTERM"
        children = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        assert len(children) >= 2, children
        with open(f"/proc/{proc.pid}/maps") as fh:
            segments = {
                line.split(maxsplit=5)[5].strip() for line in fh if "/dev/shm/" in line and "(deleted)" not in line
            }
        assert segments, "expected the writer's shared-memory metadata segment"

        proc.send_signal(signum)
        started = time.monotonic()
        stdout, stderr = proc.communicate(timeout=10)
        assert time.monotonic() - started < 10
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0
    assert f"write interrupted by {signal.Signals(signum).name}" in stderr, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert beton_leftovers(workdir, "slow") == []
    psutil.wait_procs([psutil.Process(p) for p in _live(children)], timeout=3)
    assert _live(children) == [], "worker processes outlived the interrupted write"
    assert [s for s in segments if os.path.exists(s)] == [], "shared memory left in /dev/shm"
    assert "leaked shared_memory" not in stderr

    rerun = betonbuild(workdir, *write_args("slow"))
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    info = json.loads(betonbuild(workdir, "inspect", "--json", "results/slow/slow.beton").stdout)
    assert info["header"]["num_samples"] == 3000
    assert list(results.glob(".slow.beton.tmp-*")) == []


def _limit_file_size(nbytes: int):
    def apply():
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))

    return apply


def test_full_disk_during_the_write_is_a_clean_error_and_leaves_nothing(tmp_path):
    workdir = workdir_with_adapter(tmp_path / "w")
    # 1000 samples of 40 KB: ~40 MB of pages, against a 12 MiB limit on any file the write makes
    write_config(workdir, {"huge": python_dataset("big", None, n=1000, writer={"page_size": "2MiB", "chunksize": 50})})
    started = time.monotonic()
    result = betonbuild(workdir, *write_args("huge"), preexec_fn=_limit_file_size(12 << 20))
    assert time.monotonic() - started < 30
    assert result.returncode == 1, result.stderr[-3000:]
    assert "betonbuild error: dataset 'huge': the disk is full" in result.stderr, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert beton_leftovers(workdir, "huge") == []
    assert not (workdir / "results/huge/failure").exists(), "a full disk is not the sample's fault"


# ---------------------------------------------------------------------------------------------
# Through the real workflow.
# ---------------------------------------------------------------------------------------------

GOOD_DIGITS = {
    "source": {"kind": "arrays", "path": "digits.npz", "columns": {"image": "images", "label": "target"}},
    "fields": {"image": {"type": "ndarray", "dtype": "uint8", "shape": [8, 8]}, "label": {"type": "int"}},
    "writer": {"num_workers": 2, "page_size": "2MiB"},
    "smoke": {"samples": 4},
}


def save_digits(path: Path) -> Path:
    """The first 300 real sklearn digits, as conftest's digits_npz fixture stores them."""
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    np.savez(path, images=digits.images[:300].astype(np.uint8), target=digits.target[:300].astype(np.int64))
    return path


def _index_outside_smoke(n: int, smoke: int) -> int:
    positions = set(int(p) for p in smoke_positions(n, smoke, 0))
    return next(i for i in range(n - 50, n) if i not in positions)


FULL_AT = _index_outside_smoke(300, 4)
# dataset -> (field, index, what the message says, stage that fails)
KEEP_GOING_BAD = {
    # caught by the smoke stage's pre-flight inspection
    "bad_json": ("meta", 3, "value['i'] is a int64", "smoke"),
    "bad_page": ("data", 2, "set writer.page_size to at least 4MiB (4194304)", "smoke"),
    "bad_getitem": (None, 1, "the source's __getitem__ raised RuntimeError: corrupt record 1", "smoke"),
    # passes the smoke gate, fails in the full write (2 workers)
    "bad_full": ("arr", FULL_AT, "dtype float64 does not match the field's float32", "full"),
}


@pytest.fixture(scope="module")
def keep_going(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess, float]:
    """One `snakemake --keep-going` run: a good dataset beside seven bad ones."""
    workdir = workdir_with_adapter(tmp_path_factory.mktemp("keep_going"))
    save_digits(workdir / "digits.npz")
    write_parquet_bad_input(workdir / "parquet")
    write_config(
        workdir,
        {
            "good": GOOD_DIGITS,
            "bad_json": python_dataset("json", "json_numpy_int", n=300, at=3, smoke=4),
            "bad_page": python_dataset("bytes", "page_bytes", n=300, at=2, smoke=4, writer=PAGE_2MIB),
            "bad_getitem": python_dataset("basic", "getitem_raises", n=300, at=1, smoke=4),
            "bad_full": python_dataset(
                "array", "ndarray_float64", n=300, at=FULL_AT, smoke=4, writer={"num_workers": 2, "chunksize": 20}
            ),
            # returns different values for the same index: stopped by the smoke stage, never verified
            "bad_random": python_dataset("array", "ndarray_unseeded", n=300, at=0, until=300, smoke=4),
            # the source cannot even be opened
            "bad_import": python_dataset("basic", factory="no_such_module:make"),
            "bad_factory": python_dataset("explode"),
            # a Parquet file cut short, and one with a null where an int is due
            "bad_parquet": parquet_dataset("parquet/cut.parquet"),
            "bad_parquet_null": parquet_dataset("parquet/null.parquet"),
        },
    )
    started = time.monotonic()
    result = run_snakemake(workdir, "--keep-going", timeout=240, check=False)
    return workdir, result, time.monotonic() - started


def write_parquet_bad_input(folder: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    cut = write_numeric(folder / "cut.parquet", 100)
    cut.write_bytes(cut.read_bytes()[:-100])
    table = pq.read_table(write_numeric(folder / "null.parquet", 100))
    ids = table["id"].to_pylist()
    ids[37] = None
    pq.write_table(table.set_column(0, "id", pa.array(ids, pa.int64())), folder / "null.parquet", row_group_size=16)


def parquet_dataset(path: str) -> dict:
    return {"source": {"kind": "parquet", "path": path}, "fields": NUMERIC_FIELDS, "smoke": {"samples": 4}}


def test_keep_going_the_good_dataset_still_verifies(keep_going):
    workdir, result, seconds = keep_going
    assert result.returncode != 0
    report = json.loads((workdir / "results/good/good.verify.json").read_text())
    assert report["ok"] is True
    assert (workdir / "results/good/good.beton").is_file()


@pytest.mark.parametrize("name", KEEP_GOING_BAD)
def test_keep_going_a_bad_sample_is_named_and_saved(keep_going, name: str):
    workdir, result, seconds = keep_going
    field, index, why, stage = KEEP_GOING_BAD[name]
    output = result.stdout + result.stderr
    lines = [line for line in output.splitlines() if line.startswith(f"betonbuild error: dataset '{name}'")]
    assert lines, f"no error line for {name}; its log:\n" + _log_tail(workdir, "write", name)  # smoke too
    assert_names(lines[0], name, field, index)
    assert why in lines[0], lines[0]
    assert beton_leftovers(workdir, name) == []
    record = json.loads((workdir / f"results/{name}/failure/failure.json").read_text())
    assert (record["index"], record["field"], record["stage"]) == (index, field, stage)
    assert "Traceback (most recent call last)" in record["traceback"]


def test_keep_going_a_source_returning_random_values_is_stopped_by_the_smoke_stage(keep_going):
    workdir, result, seconds = keep_going
    output = result.stdout + result.stderr
    lines = [line for line in output.splitlines() if line.startswith("betonbuild error: dataset 'bad_random'")]
    assert lines, "no error line for bad_random; its log:\n" + _log_tail(workdir, "write", "bad_random")
    assert lines[0].startswith(
        "betonbuild error: dataset 'bad_random', field 'arr', sample index 0: the source returns different "
        "values for the same index (two reads of it differ). Fix: seed it or make it deterministic"
    ), lines[0]
    results = workdir / "results" / "bad_random"
    assert not (results / "smoke.beton").exists() and not (results / "smoke.verify.json").exists()
    assert not (results / "failure").exists(), "nothing to replay: each read passes the contract"
    assert beton_leftovers(workdir, "bad_random") == []


def _log_tail(workdir: Path, stage: str, name: str) -> str:
    log = workdir / "logs" / stage / f"{name}.log"
    return log.read_text()[-3000:] if log.exists() else f"({log} does not exist)"


@pytest.mark.parametrize(
    "name, message",
    [
        (
            "bad_import",
            "betonbuild error: dataset 'bad_import': cannot import module 'no_such_module' "
            "of factory no_such_module:make: ModuleNotFoundError",
        ),
        (
            "bad_factory",
            "betonbuild error: dataset 'bad_factory': factory badsource:make raised ValueError: "
            "cannot open /nowhere/index.csv",
        ),
        (
            "bad_parquet",
            "betonbuild error: dataset 'bad_parquet': parquet/cut.parquet is not a readable Parquet file "
            "(truncated, or not Parquet)",
        ),
        (
            "bad_parquet_null",
            "betonbuild error: dataset 'bad_parquet_null', field 'id', sample index 37 (file parquet/null.parquet, "
            "row group 2, row 37 of the file): column 'id' is null in this row. Fix: fill or drop the null rows",
        ),
    ],
)
def test_keep_going_a_source_that_cannot_open_is_named(keep_going, name: str, message: str):
    workdir, result, seconds = keep_going
    assert message in result.stdout + result.stderr, _log_tail(workdir, "source_manifest", name)
    assert beton_leftovers(workdir, name) == []
    assert not (workdir / f"results/{name}/source.json").exists()


CONFIG_ERRORS = {
    "long_field_name": (
        {"fields": {"a_very_long_field_name": {"type": "int"}}},
        "datasets.bad.fields: name 'a_very_long_field_name' is 22 bytes; ffcv stores at most 16",
    ),
    "long_names_that_collapse": (
        {"fields": {"embedding_vector_a": {"type": "int"}, "embedding_vector_b": {"type": "int"}}},
        "datasets.bad.fields: name 'embedding_vector_a' is 18 bytes; ffcv stores at most 16",
    ),
    "non_ascii_field_name": (
        {"fields": {"größe": {"type": "float"}}},
        "datasets.bad.fields: name 'größe' is not ASCII; ffcv stores field names as ASCII",
    ),
    "page_size_not_a_power_of_two": (
        {"writer": {"page_size": "3MiB"}},
        "datasets.bad.writer.page_size: '3MiB' (3145728 bytes) must be a power of two in [2MiB, 4GiB)",
    ),
    "page_size_too_small": (
        {"writer": {"page_size": 1048576}},
        "datasets.bad.writer.page_size: 1048576 (1048576 bytes) must be a power of two in [2MiB, 4GiB)",
    ),
    "page_size_unreadable": (
        {"writer": {"page_size": "8MB"}},
        "datasets.bad.writer.page_size: cannot read size '8MB'; write bytes or e.g. '8MiB', '1GiB'",
    ),
    "chunksize_zero": ({"writer": {"chunksize": 0}}, "datasets.bad.writer.chunksize: 0 is less than the minimum of 1"),
    "chunksize_negative": (
        {"writer": {"chunksize": -5}},
        "datasets.bad.writer.chunksize: -5 is less than the minimum of 1",
    ),
    "unknown_field_type": (
        {"fields": {"f": {"type": "string"}}},
        f"datasets.bad.fields.f.type: 'string' is not one of {list(FIELD_KINDS)}",
    ),
    "big_endian_dtype": (
        {"fields": {"f": {"type": "ndarray", "dtype": ">f4", "shape": [2]}}},
        "datasets.bad.fields.f.dtype: '>f4' is big-endian; use the native little-endian dtype",
    ),
}


@pytest.mark.parametrize("case", sorted(CONFIG_ERRORS))
def test_config_error_fails_before_any_job_with_the_exact_message(tmp_path, case: str):
    workdir = workdir_with_adapter(tmp_path)
    override, message = CONFIG_ERRORS[case]
    bad = {**python_dataset("basic"), **override}
    write_config(workdir, {"good": GOOD_DIGITS, "bad": bad})
    _assert_fails_before_any_job(workdir, message)


def test_duplicate_field_name_in_the_yaml_fails_before_any_job(tmp_path):
    workdir = workdir_with_adapter(tmp_path)
    (workdir / "config.yaml").write_text(
        textwrap.dedent(
            """\
        datasets:
          bad:
            source: {kind: python, factory: "badsource:make"}
            fields:
              a: {type: int}
              a: {type: float}
        """
        )
    )
    _assert_fails_before_any_job(
        workdir,
        "config.yaml:6: key 'a' appears twice in one mapping (first on line 5); "
        "YAML would silently keep only the last one",
    )


@pytest.mark.parametrize(
    "source",
    [
        {"kind": "arrays", "path": "missing.npz", "columns": {"a": "a", "b": "b"}},
        {"kind": "image_folder", "root": "no_photos"},
    ],
    ids=["arrays_path", "image_folder_root"],
)
def test_missing_source_path_fails_before_any_job_naming_dataset_and_path(tmp_path, digits_npz, source):
    workdir = workdir_with_adapter(tmp_path)
    fields = (
        FAMILY_FIELDS["basic"]
        if source["kind"] == "arrays"
        else {"image": {"type": "rgb_image"}, "label": {"type": "int"}}
    )
    write_config(workdir, {"good": GOOD_DIGITS, "bad": {"source": source, "fields": fields}})
    missing = source.get("path") or source["root"]
    result = _assert_fails_before_any_job(workdir, "Missing input files")
    assert "ds=bad" in result.stderr and missing in result.stderr, result.stderr[-3000:]


def _assert_fails_before_any_job(workdir: Path, message: str) -> subprocess.CompletedProcess:
    started = time.monotonic()
    result = run_snakemake(workdir, "--keep-going", timeout=HARNESS_LIMIT, check=False)
    assert time.monotonic() - started < HARNESS_LIMIT
    assert result.returncode != 0
    assert message in result.stderr, result.stderr[-3000:]
    assert not (workdir / "results").exists(), "a job ran despite the bad config"
    return result
