"""The config schema is assembled from the kinds: config.schema.yaml holds the dataset-level keys,
each source kind (``Source.config_schema``) and field kind (``FieldKind.options_schema``) its own."""

from __future__ import annotations

import json

import jsonschema
import pytest

from betonbuild.cli import main
from betonbuild.config.load import load_config, schema
from betonbuild.errors import ConfigError
from betonbuild.fields import FIELD_KINDS
from betonbuild.fields.kind import FieldKind
from betonbuild.sources import SOURCE_KINDS


def test_the_assembled_schema_is_a_valid_json_schema_with_one_entry_per_kind():
    root = schema()
    jsonschema.Draft202012Validator.check_schema(root)
    for definition, key, kinds in (("source", "kind", SOURCE_KINDS), ("field", "type", FIELD_KINDS)):
        entries = root["$defs"][definition]["allOf"]
        assert root["$defs"][definition]["properties"][key] == {"enum": list(kinds)}
        assert [e["if"]["properties"][key]["const"] for e in entries] == list(kinds)
        for entry, (name, kind) in zip(entries, kinds.items()):
            own = kind.config_schema if definition == "source" else kind.options_schema
            assert entry["then"] == own, name


def test_schema_returns_a_copy_that_callers_may_change():
    schema()["$defs"]["field"]["properties"]["type"]["enum"].append("mine")
    assert "mine" not in schema()["$defs"]["field"]["properties"]["type"]["enum"]


def test_a_new_field_kind_is_validated_by_its_own_schema_fragment(monkeypatch):
    """What adding a kind takes: its module's KIND in FIELD_KINDS; the schema follows."""

    class Shouting(FieldKind):
        name = "shouting"
        options_schema = {
            "additionalProperties": False,
            "properties": {"type": {}, "volume": {"type": "integer", "minimum": 1, "default": 11}},
        }

    from betonbuild.config import load

    monkeypatch.setitem(FIELD_KINDS, "shouting", Shouting())
    load._schema.cache_clear()
    try:
        source = {"kind": "python", "factory": "m:f"}
        spec = load_config({"datasets": {"d": {"source": source, "fields": {"x": {"type": "shouting"}}}}})
        assert spec.datasets["d"].fields[0].options == {"volume": 11}  # the kind's default filled in
        bad = {"datasets": {"d": {"source": source, "fields": {"x": {"type": "shouting", "volume": 0}}}}}
        with pytest.raises(ConfigError, match=r"datasets\.d\.fields\.x\.volume: 0 is less than the minimum of 1"):
            load_config(bad)
    finally:
        monkeypatch.undo()
        load._schema.cache_clear()
    assert "shouting" not in schema()["$defs"]["field"]["properties"]["type"]["enum"]


def test_betonbuild_schema_prints_the_whole_schema(capsys):
    assert main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out) == schema()
