"""Unit tests of betonbuild.workflow.rerun: which spec keys each rule's `spec` parameter holds, so
which config edits rerun which rule."""

from __future__ import annotations

import copy

import pytest

from betonbuild.config.load import load_config
from betonbuild.config.spec import DatasetSpec
from betonbuild.workflow import rerun

CONTENT = ["name", "source", "fields", "sample_keys", "writer"]
ENTRY = {
    "source": {"kind": "python", "factory": "adapters.tables:wine_table"},
    "fields": {"label": {"type": "int"}, "image": {"type": "rgb_image", "write_mode": "jpg"}},
}
PARAMS = {
    "write_spec": rerun.write_spec,
    "manifest_spec": rerun.manifest_spec,
    "smoke_spec": rerun.smoke_spec,
    "verify_spec": rerun.verify_spec,
    "smoke_verify_spec": rerun.smoke_verify_spec,
    "gate_and_write_spec": rerun.gate_and_write_spec,
    "part_verify_spec": rerun.part_verify_spec,
}


def spec_of(**changes) -> DatasetSpec:
    entry = copy.deepcopy(ENTRY)
    for dotted, value in changes.items():
        *path, last = dotted.split("__")
        node = entry
        for key in path:
            node = node.setdefault(key, {})
        node[last] = value
    return load_config({"datasets": {"d": entry}}).datasets["d"]


def rerun_by(**changes) -> set[str]:
    """The rules whose parameters differ after the change."""
    before, after = spec_of(), spec_of(**changes)
    return {name for name, params in PARAMS.items() if params(before) != params(after)}


def test_the_keys_each_rule_holds_in_order():
    spec = spec_of()
    assert list(rerun.write_spec(spec)) == CONTENT
    assert list(rerun.manifest_spec(spec)) == CONTENT + ["partitions", "samples_per_partition", "smoke"]
    assert list(rerun.smoke_spec(spec)) == CONTENT + ["smoke"]
    assert list(rerun.verify_spec(spec)) == CONTENT + ["verify"]
    assert list(rerun.smoke_verify_spec(spec)) == CONTENT + ["smoke", "verify"]
    assert list(rerun.gate_and_write_spec(spec)) == CONTENT + ["smoke", "verify"]
    assert list(rerun.part_verify_spec(spec)) == CONTENT + ["verify"]


def test_the_values_are_those_of_the_whole_spec():
    spec = spec_of(verify__samples=7, smoke__samples=3)
    full = spec.to_dict()
    for params in PARAMS.values():
        for key, value in params(spec).items():
            if key != "verify":
                assert value == full[key]
    assert rerun.verify_spec(spec)["verify"] == full["verify"]
    assert rerun.smoke_verify_spec(spec)["verify"] == {"jpeg_mean_abs_error": full["verify"]["jpeg_mean_abs_error"]}
    assert rerun.gate_and_write_spec(spec)["verify"] == rerun.smoke_verify_spec(spec)["verify"]
    assert rerun.part_verify_spec(spec)["verify"] == {
        "jpeg_mean_abs_error": full["verify"]["jpeg_mean_abs_error"],
        "loader_batch": full["verify"]["loader_batch"],
    }


def test_the_params_do_not_share_the_specs_dicts():
    spec = spec_of()
    rerun.smoke_verify_spec(spec)["verify"]["extra"] = 1
    assert "extra" not in rerun.verify_spec(spec)["verify"]


@pytest.mark.parametrize(
    ("change", "rules"),
    [
        ({"verify__samples": 5}, {"verify_spec"}),  # not the smoke gate, nor (through it) the write
        ({"verify__mode": "full"}, {"verify_spec"}),
        ({"verify__full_max_samples": 10}, {"verify_spec"}),
        ({"verify__loader_batch": 4}, {"verify_spec", "part_verify_spec"}),
        (
            {"verify__jpeg_mean_abs_error": 1.5},
            {"verify_spec", "smoke_verify_spec", "gate_and_write_spec", "part_verify_spec"},
        ),
        ({"smoke__samples": 4}, {"manifest_spec", "smoke_spec", "smoke_verify_spec", "gate_and_write_spec"}),
        ({"partitions": 3}, {"manifest_spec"}),
        ({"samples_per_partition": 10}, {"manifest_spec"}),
        ({"keep_parts": False}, set()),  # temp() or not: the parts' content is the same
        ({"writer__seed": 1}, set(PARAMS)),
        ({"writer__page_size": "4MiB"}, set(PARAMS)),
        ({"source__args": {"scale": 2.0}}, set(PARAMS)),
        ({"fields__label__type": "float"}, set(PARAMS)),
    ],
)
def test_which_rules_a_config_edit_reruns(change, rules):
    assert rerun_by(**change) == rules
