"""A source that returns different values for the same index is stopped in the smoke stage (issue 17,
item 14), naming the dataset, the field and the index, before the full write and its verification."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import numpy as np
import pytest

from betonbuild.config.load import load_config
from betonbuild.errors import SampleError
from betonbuild.workflow.stages import build, make_source_manifest
from betonbuild.write.determinism import REREAD_SAMPLES, SourceNotDeterministic, check_deterministic

ADAPTER = textwrap.dedent(
    """
    import numpy as np


    class Noisy:
        \"\"\"A label from the index; features drawn where the `where` argument says, seeded or not.\"\"\"

        def __init__(self, where, n=12):
            self.where, self.n = where, n
            self.table = np.random.default_rng().standard_normal((n, 3)).astype(np.float32)  # unseeded
            self.seeded = np.random.default_rng(0).standard_normal((n, 3)).astype(np.float32)

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            if self.where == "getitem":
                x = np.random.rand(3).astype(np.float32)  # numpy's global RNG, unseeded
            elif self.where == "init":
                x = self.table[i]
            else:
                x = np.random.default_rng(i).standard_normal(3).astype(np.float32) + self.seeded[i]
            return {"label": i % 3, "x": x}


    def make(where):
        return Noisy(where)
    """
)


@pytest.fixture
def project(tmp_path: Path, monkeypatch) -> Path:
    (tmp_path / "noisy_adapter.py").write_text(ADAPTER)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def spec_for(where: str):
    return load_config(
        {
            "datasets": {
                "noisy": {
                    "source": {"kind": "python", "factory": "noisy_adapter:make", "args": {"where": where}},
                    "fields": {"label": {"type": "int"}, "x": {"type": "ndarray", "dtype": "float32", "shape": [3]}},
                    "smoke": {"samples": 3},
                }
            }
        }
    ).datasets["noisy"]


def smoke_build(spec, root: Path) -> Path:
    results = root / "results" / spec.name
    results.mkdir(parents=True)
    make_source_manifest(spec, str(results / "source.json"))
    with open(os.devnull, "w") as log:
        build(
            spec,
            str(results / "source.json"),
            str(results / "smoke.beton"),
            str(results / "smoke.write.json"),
            smoke=True,
            survey_path=str(results / "inspect.json"),
            log=log,
        )
    return results


@pytest.mark.parametrize(
    "where,how",
    [
        ("getitem", "(two reads of it differ)"),
        ("init", "(it differs between two openings of the source: values drawn when the dataset is created"),
    ],
)
def test_a_source_drawing_unseeded_values_fails_the_smoke_stage_naming_dataset_field_and_index(project, where, how):
    with pytest.raises(SampleError) as info:
        smoke_build(spec_for(where), project)
    error = info.value
    assert isinstance(error, SourceNotDeterministic)
    message = str(error)
    assert message.startswith(
        "dataset 'noisy', field 'x', sample index 0: the source returns different values for the same index "
    )
    assert how in message
    assert "Fix: seed it or make it deterministic" in message and "np.random.default_rng(index)" in error.fix
    assert (error.dataset, error.field, error.index) == ("noisy", "x", 0)
    results = project / "results" / "noisy"
    assert not (results / "smoke.beton").exists() and not (results / "smoke.write.json").exists()
    assert not (results / "failure").exists(), "nothing to replay: each read passes the contract"
    assert "betonbuild repro" not in message


def test_the_fix_followed_a_seeded_source_passes_the_smoke_stage(project):
    results = smoke_build(spec_for("seeded"), project)
    assert (results / "smoke.beton").stat().st_size > 0 and (results / "inspect.json").exists()


class Reads:
    """A source whose sample ``changed`` differs from its second read on (a counter per index)."""

    def __init__(self, changed: int | None, n: int = 8):
        self.changed, self.n, self.reads = changed, n, {}

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.reads[i] = self.reads.get(i, 0) + 1
        bump = int(i == self.changed and self.reads[i] > 1)
        return (i * 10, np.full(3, i + bump, dtype=np.float32))


SPEC = spec_for("unused")


def test_only_the_field_that_differs_is_named():
    with pytest.raises(SourceNotDeterministic) as info:
        check_deterministic(SPEC, Reads(changed=2), [5, 2, 3])
    assert (info.value.field, info.value.index) == ("x", 2)


def test_a_deterministic_source_passes_and_only_a_few_samples_are_read_again():
    source = Reads(changed=None)
    check_deterministic(SPEC, source, list(range(8)), reopen=lambda: Reads(changed=None))
    assert source.reads == {i: 2 for i in range(REREAD_SAMPLES)}


def test_a_second_opening_that_differs_is_reported_as_such():
    class Shifted(Reads):
        def __getitem__(self, i):
            label, x = super().__getitem__(i)
            return (label, x + 0.5)

    check_deterministic(SPEC, Reads(changed=None), [0, 1])  # without reopen: not asked
    with pytest.raises(SourceNotDeterministic, match="differs between two openings") as info:
        check_deterministic(SPEC, Reads(changed=None), [0, 1], reopen=lambda: Shifted(changed=None))
    assert (info.value.field, info.value.index) == ("x", 0)


def test_nan_stored_bit_exact_is_no_difference():
    class NaNs(Reads):
        def __getitem__(self, i):
            return (i, np.full(3, np.nan, dtype=np.float32))

    check_deterministic(SPEC, NaNs(changed=None), [0, 1, 2])


def test_a_contract_error_is_the_contracts_not_a_determinism_error():
    class Bad(Reads):
        def __getitem__(self, i):
            return (i, np.zeros(3, dtype=np.float64))

    with pytest.raises(SampleError, match="dtype float64 does not match") as info:
        check_deterministic(SPEC, Bad(changed=None), [0])
    assert not isinstance(info.value, SourceNotDeterministic)
