"""``kind: iterable`` (betonbuild.sources.iterable, write.onepass, workflow.onepass): a generator or
IterableDataset of unknown length written in one pass into parts and merged, the count checked
against ``length:``, a raise midway resumed from the finished parts, the verification by a second
iteration. Every write is a real ffcv write, run through the stages the rules run."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from betonbuild.beton.format import BetonFile
from betonbuild.config.load import load_config
from betonbuild.errors import ConfigError, SampleError, SourceError, VerificationError
from betonbuild.fields import field_kind
from betonbuild.sources import open_source
from betonbuild.workflow.stages import build, make_source_manifest, verify_dataset
from betonbuild.write.determinism import SourceNotDeterministic

# numba's dispatcher finalizer raises KeyError when ffcv.Loader objects are collected (ffcv 1.0.2, harmless).

FIELDS = {"x": {"type": "ndarray", "dtype": "float32", "shape": [4]}, "y": {"type": "int"}}

# A generator of unknown length; FAIL_AT (a file in the working directory) makes it raise at that
# position, CHANGED makes it yield other values; every call of the factory is logged to calls.txt.
STREAM = """
import os
import numpy as np


def value(i):
    return np.full(4, i + (0.5 if os.path.exists("CHANGED") else 0.0), dtype=np.float32)


def samples(n=25):
    with open("calls.txt", "a") as fh:
        fh.write("samples\\n")
    fail_at = int(open("FAIL_AT").read()) if os.path.exists("FAIL_AT") else -1
    for i in range(n):
        if i == fail_at:
            raise RuntimeError("connection reset")
        yield value(i), i


def from_start(n=25, start=0):
    with open("calls.txt", "a") as fh:
        fh.write(f"start={start}\\n")
    for i in range(start, n):
        yield value(i), i


def bad_at_15(n=25):
    for i in range(n):
        yield (value(i).astype(np.float64) if i == 15 else value(i)), i


def unseeded(n=25):
    rng = np.random.default_rng()
    for i in range(n):
        yield rng.random(4, dtype=np.float32), i


def closing(n=25):
    try:
        for i in range(n):
            yield value(i), i
    finally:
        with open("calls.txt", "a") as fh:
            fh.write("closed\\n")


def big(n=6):
    for i in range(n):
        yield np.full((512, 512), i, dtype=np.float32), i  # 1 MiB a sample


def reused_buffer(n=12):
    buffer = np.zeros(4, dtype=np.float32)
    for i in range(n):
        buffer[:] = i  # the same array every time: each sample must still be written as it was
        yield {"x": buffer, "y": i}
"""

TORCH_DATASET = """
import numpy as np
import torch


class Squares(torch.utils.data.IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            yield torch.full((4,), float(i * i)), i


def make(n=17):
    return Squares(n)
"""


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch):
    """tmp_path as the working directory with the adapter modules; the modules are forgotten after."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "it_stream.py").write_text(STREAM)
    (tmp_path / "it_torch.py").write_text(TORCH_DATASET)
    yield tmp_path
    for name in ("it_stream", "it_torch"):
        sys.modules.pop(name, None)


def make_spec(factory: str = "it_stream:samples", name: str = "it", spp: int | None = 10, fields=FIELDS, **source):
    entry = {
        "source": {"kind": "iterable", "factory": factory, **source},
        "fields": fields,
        "smoke": {"samples": 4},
        "samples_per_partition": spp,
    }
    return load_config({"datasets": {name: entry}}).datasets[name]


def run_stages(spec, results: Path, verify: bool = True) -> dict:
    """The rules' stages in order: manifest, smoke write and gate, one-pass write, verification."""
    d = results / spec.name
    d.mkdir(parents=True, exist_ok=True)
    manifest = str(d / "source.json")
    make_source_manifest(spec, manifest, smoke_path=str(d / "smoke.json"))
    build(
        spec,
        manifest,
        str(d / "smoke.beton"),
        str(d / "smoke.write.json"),
        smoke=True,
        survey_path=str(d / "inspect.json"),
    )
    verify_dataset(
        spec,
        manifest,
        str(d / "smoke.beton"),
        str(d / "smoke.write.json"),
        str(d / "smoke.verify.json"),
        str(d / "failed.json"),
        smoke=True,
    )
    build(spec, manifest, str(d / f"{spec.name}.beton"), str(d / f"{spec.name}.write.json"), threads=2)
    if not verify:
        return {}
    return verify_dataset(
        spec,
        manifest,
        str(d / f"{spec.name}.beton"),
        str(d / f"{spec.name}.write.json"),
        str(d / f"{spec.name}.verify.json"),
        str(d / "failed.json"),
        threads=2,
    )


def full_write(spec, results: Path) -> dict:
    d = results / spec.name
    build(spec, str(d / "source.json"), str(d / f"{spec.name}.beton"), str(d / f"{spec.name}.write.json"), threads=2)
    return json.loads((d / f"{spec.name}.write.json").read_text())


def stored(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The file's x and y columns, read without ffcv."""
    spec = make_spec()
    beton = BetonFile(str(path))
    positions = np.arange(beton.num_samples)
    return tuple(np.asarray(field_kind(f).stored_column(beton, f, positions)) for f in spec.fields)


def test_generator_of_unknown_length_is_written_in_parts_merged_and_verified(workdir: Path):
    spec = make_spec()
    report = run_stages(spec, workdir / "results")
    d = workdir / "results" / "it"
    manifest = json.loads((d / "source.json").read_text())
    assert manifest["length"] is None and manifest["partitions"] == [] and manifest["stream"]["first_samples"] == 4
    record = json.loads((d / "it.write.json").read_text())
    assert record["num_samples"] == 25
    assert [p["num_samples"] for p in record["partitions"]] == [10, 10, 5]
    assert record["stream"] == {"count": 25, "parts": 3, "resumed_parts": 0}
    assert report["ok"], report["worst"]
    assert report["source"]["length"] == 25 and report["num_samples"] == {"expected": 25, "found": 25}
    assert {c["name"]: c["ok"] for c in report["checks"]}["stream_length"]
    beton = BetonFile(str(d / "it.beton"))
    assert beton.num_samples == 25
    # the generator was iterated: for the manifest, the smoke file, its determinism check (a second
    # opening), the smoke gate, the full write and the verification; only the last two to the end
    assert (workdir / "calls.txt").read_text().count("samples") == 6


def test_torch_iterable_dataset_is_written_and_verified(workdir: Path):
    pytest.importorskip("torch")
    fields = {"x": {"type": "torch_tensor", "dtype": "float32", "shape": [4]}, "y": {"type": "int"}}
    spec = make_spec("it_torch:make", spp=5, fields=fields)
    report = run_stages(spec, workdir / "results")
    assert report["ok"], report["worst"]
    assert report["num_samples"]["found"] == 17
    assert json.loads((workdir / "results/it/it.write.json").read_text())["stream"]["parts"] == 4


def test_a_reused_yield_buffer_is_written_as_each_sample_was(workdir: Path):
    spec = make_spec("it_stream:reused_buffer", spp=5)
    report = run_stages(spec, workdir / "results")
    assert report["ok"], report["worst"]
    x, y = stored(workdir / "results/it/it.beton")
    assert y.tolist() == list(range(12)) and x[:, 0].tolist() == list(range(12))


@pytest.mark.parametrize(("length", "said"), [(30, "yielded 25 samples but"), (20, "yields more than the 20")])
def test_length_mismatch_is_a_clear_error(workdir: Path, length: int, said: str):
    spec = make_spec(length=length)
    with pytest.raises(SourceError) as info:
        run_stages(spec, workdir / "results", verify=False)
    message = str(info.value)
    assert said in message and "datasets.it.source.length" in message and message.startswith("dataset 'it': ")
    assert not (workdir / "results/it/it.beton").exists()


def test_a_stream_that_differs_between_iterations_is_stopped_by_the_smoke_stage(workdir: Path):
    with pytest.raises(SourceNotDeterministic, match="differs between two openings of the source"):
        run_stages(make_spec("it_stream:unseeded"), workdir / "results", verify=False)
    assert not (workdir / "results/it/parts").exists()


def test_a_generator_left_after_its_first_samples_is_closed(workdir: Path):
    assert len(open_source(make_spec("it_stream:closing"))) == 4
    assert (workdir / "calls.txt").read_text().split() == ["closed"]


def test_length_given_and_right_passes(workdir: Path):
    report = run_stages(make_spec(length=25), workdir / "results")
    assert report["ok"] and report["source"]["length"] == 25


def part_stats(d: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in sorted((d / "parts").iterdir())}


def test_raise_midway_keeps_finished_parts_names_position_and_resumes(workdir: Path):
    spec = make_spec()
    (workdir / "FAIL_AT").write_text("23")
    with pytest.raises(SampleError) as info:
        run_stages(spec, workdir / "results", verify=False)
    assert info.value.index == 23 and "producing sample 23" in str(info.value)
    assert "connection reset" in str(info.value)
    d = workdir / "results" / "it"
    assert not (d / "it.beton").exists()
    before = part_stats(d)
    # the two full parts, and the 3 samples read before the raise as a short part
    assert sorted(before) == [f"{i}.{ext}" for i in range(3) for ext in ("beton", "write.json")]
    assert [json.loads((d / f"parts/{i}.write.json").read_text())["num_samples"] for i in range(3)] == [10, 10, 3]
    (workdir / "FAIL_AT").unlink()
    (workdir / "calls.txt").write_text("")
    record = full_write(spec, workdir / "results")
    assert record["stream"] == {"count": 25, "parts": 4, "resumed_parts": 3}
    assert [p["num_samples"] for p in record["partitions"]] == [10, 10, 3, 2]
    after = part_stats(d)
    assert {k: after[k] for k in before} == before  # the finished parts were not rewritten
    assert "3.beton" in after
    x, y = stored(d / "it.beton")
    assert y.tolist() == list(range(25))
    report = verify_dataset(
        spec,
        str(d / "source.json"),
        str(d / "it.beton"),
        str(d / "it.write.json"),
        str(d / "it.verify.json"),
        str(d / "failed.json"),
    )
    assert report["ok"], report["worst"]


def test_a_sample_the_contract_refuses_midway_is_saved_for_repro_and_the_earlier_parts_stay(workdir: Path):
    spec = make_spec("it_stream:bad_at_15")
    with pytest.raises(SampleError) as info:
        run_stages(spec, workdir / "results", verify=False)
    assert info.value.index == 15 and info.value.field == "x" and "betonbuild repro" in str(info.value)
    d = workdir / "results" / "it"
    failure = json.loads((d / "failure" / "failure.json").read_text())
    assert failure["index"] == 15 and failure["sample_file"] == "sample.pkl"
    assert sorted(p.name for p in (d / "parts").iterdir()) == ["0.beton", "0.write.json"]


def test_resume_asks_a_factory_with_start_to_start_after_the_finished_parts(workdir: Path):
    spec = make_spec("it_stream:from_start")
    run_stages(spec, workdir / "results", verify=False)
    d = workdir / "results" / "it"
    (d / "it.beton").unlink()
    (d / "parts/2.beton").unlink()  # as if the write had been killed while writing part 2
    (workdir / "calls.txt").write_text("")
    record = full_write(spec, workdir / "results")
    assert record["stream"]["resumed_parts"] == 2
    assert (workdir / "calls.txt").read_text().split() == ["start=20"]
    assert stored(d / "it.beton")[1].tolist() == list(range(25))


def test_a_source_changed_since_its_finished_parts_is_refused_and_they_are_removed(workdir: Path):
    spec = make_spec()
    (workdir / "FAIL_AT").write_text("23")
    with pytest.raises(SampleError):
        run_stages(spec, workdir / "results", verify=False)
    (workdir / "FAIL_AT").unlink()
    (workdir / "CHANGED").write_text("")
    with pytest.raises(SourceError) as info:
        full_write(spec, workdir / "results")
    assert "samples 0..9 of the iterable differ from those part 0 was written from" in str(info.value)
    assert not list((workdir / "results/it/parts").glob("*.beton"))
    record = full_write(spec, workdir / "results")  # the next run rewrites them
    assert record["stream"] == {"count": 25, "parts": 3, "resumed_parts": 0}


def test_a_raise_right_after_a_full_part_keeps_that_part(workdir: Path):
    spec = make_spec()
    (workdir / "FAIL_AT").write_text("20")
    with pytest.raises(SampleError, match="producing sample 20"):
        run_stages(spec, workdir / "results", verify=False)
    parts = workdir / "results/it/parts"
    assert sorted(p.name for p in parts.glob("*.beton")) == ["0.beton", "1.beton"]
    assert not json.loads((parts / "1.write.json").read_text())["final"]


def test_a_wrong_length_is_caught_when_every_part_was_finished_before(workdir: Path):
    run_stages(make_spec(), workdir / "results", verify=False)
    (workdir / "results/it/it.beton").unlink()
    with pytest.raises(SourceError, match="yielded 25 samples but `datasets.it.source.length` says 24"):
        full_write(make_spec(length=24), workdir / "results")


def test_every_part_finished_is_merged_without_reading_the_stream(workdir: Path):
    spec = make_spec()
    run_stages(spec, workdir / "results", verify=False)
    (workdir / "results/it/it.beton").unlink()
    (workdir / "calls.txt").write_text("")
    record = full_write(spec, workdir / "results")
    assert record["stream"]["resumed_parts"] == 3 and (workdir / "calls.txt").read_text() == ""


def test_verification_fails_when_the_second_iteration_differs(workdir: Path):
    spec = make_spec()
    run_stages(spec, workdir / "results", verify=False)
    (workdir / "CHANGED").write_text("")
    d = workdir / "results" / "it"
    with pytest.raises(VerificationError, match="field .x.: 25 of 25 samples differ from the source"):
        verify_dataset(
            spec,
            str(d / "source.json"),
            str(d / "it.beton"),
            str(d / "it.write.json"),
            str(d / "it.verify.json"),
            str(d / "failed.json"),
        )
    assert not (d / "it.verify.json").exists()


def test_verification_fails_when_the_second_iteration_is_longer(workdir: Path):
    spec = make_spec(args={"n": 25})
    run_stages(spec, workdir / "results", verify=False)
    d = workdir / "results" / "it"
    longer = make_spec(args={"n": 26})
    with pytest.raises(VerificationError, match="stream_length: the second iteration yielded more"):
        verify_dataset(
            longer,
            str(d / "source.json"),
            str(d / "it.beton"),
            str(d / "it.write.json"),
            str(d / "it.verify.json"),
            str(d / "failed.json"),
        )


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        ({"writer": {"shuffle": True}}, "datasets.it.writer.shuffle"),
        ({"writer": {"indices": "0:10"}}, "datasets.it.writer.indices"),
        ({"partitions": 3, "samples_per_partition": None}, "datasets.it.partitions"),
    ],
)
def test_writer_controls_that_cannot_apply_are_refused_naming_the_key(extra: dict, where: str):
    entry = {"source": {"kind": "iterable", "factory": "m:f"}, "fields": FIELDS, "samples_per_partition": 10, **extra}
    with pytest.raises(ConfigError) as info:
        load_config({"datasets": {"it": entry}})
    assert info.value.where == where


def test_the_factory_module_is_adapter_code(workdir: Path):
    from betonbuild.sources import adapter_files, input_files

    spec = make_spec()
    assert adapter_files(spec) == ["it_stream.py"] and input_files(spec) == ["it_stream.py"]
    # an edit of the adapter code changes the write plan: every finished part is rewritten
    from betonbuild.write.onepass import write_plan

    assert write_plan(spec, "a") != write_plan(spec, "b")
    assert write_plan(spec, "a") == write_plan(make_spec(length=25), "a")  # `length` is a check, not content


def test_an_iterables_write_declares_the_memory_of_one_part_of_its_samples(workdir: Path):
    import tracemalloc

    from betonbuild.sources.iterable import _copied
    from betonbuild.workflow import resources

    fields = {"x": {"type": "ndarray", "dtype": "float32", "shape": [512, 512]}, "y": {"type": "int"}}
    spec = make_spec("it_stream:big", fields=fields, spp=50)
    make_source_manifest(spec, str(workdir / "source.json"), smoke_path=str(workdir / "smoke.json"))
    manifest = json.loads((workdir / "source.json").read_text())
    held = manifest["stream"]["sample_bytes"]
    module = importlib.import_module("it_stream")
    tracemalloc.start()
    kept = [_copied(sample) for sample in module.big(6)]  # as the write holds a part's samples
    measured = tracemalloc.get_traced_memory()[0] / len(kept)
    tracemalloc.stop()
    assert measured <= held <= 1.1 * measured
    smaller_parts = make_spec("it_stream:big", fields=fields, spp=10)
    grown = resources.write_mem_mb(spec, manifest, 2) - resources.write_mem_mb(smaller_parts, manifest, 2)
    assert grown >= int(40 * held / resources.MB)  # 40 samples more in each part
