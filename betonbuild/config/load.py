"""Configuration -> typed dataset specs (``betonbuild.config.spec``).

Every rule of the FFCV writer contract that can be checked before any data is read is checked
here, and every error names the dataset and the key (``datasets.photos.fields: ...``).
"""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from betonbuild.config.spec import (
    MAX_FIELD_NAME_BYTES,
    MAX_PAGE_SIZE,
    MIN_PAGE_SIZE,
    RANGE_PATTERN,
    BadSamplesSpec,
    Config,
    DatasetSpec,
    FieldSpec,
    PartitionSpec,
    WriterSpec,
)
from betonbuild.errors import ConfigError
from betonbuild.fields import FIELD_KINDS, field_kind
from betonbuild.sources import SOURCE_KINDS

SCHEMA_PATH = Path(__file__).parent / "schema" / "config.schema.yaml"
_SIZE_UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def load_config(config: dict[str, Any]) -> Config:
    """Validate a raw config (as Snakemake loaded it) and return typed specs; defaults filled."""
    filled = copy.deepcopy(config)
    _validate_schema(filled)
    datasets = {name: _dataset_spec(name, entry) for name, entry in filled["datasets"].items()}
    return Config(results=filled["results"], datasets=datasets)


def spec_from_dict(data: dict[str, Any]) -> DatasetSpec:
    """Rebuild a spec from ``DatasetSpec.to_dict`` output, or a part of it (rule params, a saved failure...).

    Parts left out (a rule that does not verify gets no ``verify``) take the schema's defaults.
    """
    entry = {k: v for k, v in data.items() if k != "name"}
    return load_config({"datasets": {data["name"]: entry}}).datasets[data["name"]]


def load_config_file(path: str | Path) -> Config:
    check_no_duplicate_keys(path)
    with open(path) as fh:
        return load_config(yaml.safe_load(fh) or {})


def schema() -> dict[str, Any]:
    """The whole config schema: config.schema.yaml (the dataset-level keys) with every source kind's
    and field kind's own entry (``Source.config_schema``, ``FieldKind.options_schema``) added."""
    return copy.deepcopy(_schema())


@functools.cache
def _schema() -> dict[str, Any]:
    with open(SCHEMA_PATH) as fh:
        root = yaml.safe_load(fh)
    for name, key, kinds in (
        ("source", "kind", {kind: cls.config_schema for kind, cls in SOURCE_KINDS.items()}),
        ("field", "type", {kind: k.options_schema for kind, k in FIELD_KINDS.items()}),
    ):
        definition = root["$defs"][name]
        definition["properties"][key] = {"enum": list(kinds)}
        definition["allOf"] = [
            {"if": {"properties": {key: {"const": kind}}}, "then": copy.deepcopy(entry)}
            for kind, entry in kinds.items()
        ]
    return root


def parse_size(value: int | float | str, where: str) -> int:
    """``8388608`` or ``"8MiB"`` -> bytes."""
    if isinstance(value, (int, float)):
        return int(value)  # the schema admits only integral numbers (JSON Schema counts 4.0 as one)
    match = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", value)
    if not match or match.group(2) not in _SIZE_UNITS:
        raise ConfigError(where, f"cannot read size {value!r}; write bytes or e.g. '8MiB', '1GiB'")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2)]


def check_no_duplicate_keys(path: str | Path) -> None:
    """YAML keeps the last of two equal keys silently; for `fields` that would drop a field."""

    class StrictLoader(yaml.SafeLoader):
        pass

    def construct_mapping(loader, node, deep=False):
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor` merges are YAML's own, deliberate override mechanism
            key = loader.construct_object(key_node, deep=deep)
            if key in seen:
                raise ConfigError(
                    f"{path}:{key_node.start_mark.line + 1}",
                    f"key {key!r} appears twice in one mapping (first on line {seen[key] + 1}); "
                    "YAML would silently keep only the last one",
                )
            seen[key] = key_node.start_mark.line
        return loader.construct_mapping(node, deep=deep)

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    with open(path) as fh:
        try:
            yaml.load(fh, Loader=StrictLoader)
        except yaml.YAMLError as exc:
            raise ConfigError(str(path), f"is not valid YAML: {exc}") from None


def _validate_schema(config: dict[str, Any]) -> None:
    validator_class = _with_defaults(jsonschema.validators.validator_for(_schema()))
    validator = validator_class(_schema())
    errors = sorted(validator.iter_errors(config), key=lambda e: (list(e.absolute_path), e.message))
    if errors:
        error = jsonschema.exceptions.best_match(errors)
        where = ".".join(str(p) for p in error.absolute_path) or "config"
        raise ConfigError(where, error.message)


def _with_defaults(validator_class):
    """A validator that fills schema defaults in while validating (as snakemake.utils.validate does)."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, subschema in properties.items():
                if isinstance(subschema, dict) and "default" in subschema:
                    instance.setdefault(name, copy.deepcopy(subschema["default"]))
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


def _dataset_spec(name: str, entry: dict[str, Any]) -> DatasetSpec:
    where = f"datasets.{name}"
    fields = tuple(_field_spec(f"{where}.fields", fname, fentry) for fname, fentry in entry["fields"].items())
    _check_field_names(f"{where}.fields", [f.name for f in fields])
    sample_keys = entry.get("sample_keys")
    if sample_keys is not None and len(sample_keys) != len(fields):
        raise ConfigError(
            f"{where}.sample_keys",
            f"has {len(sample_keys)} keys but there are {len(fields)} fields; give one key per field, in field order",
        )
    _check_source(f"{where}.source", entry["source"], fields, entry["writer"])
    if entry["partitions"] is not None and entry["samples_per_partition"] is not None:
        raise ConfigError(where, "give `partitions` or `samples_per_partition`, not both")
    spec = DatasetSpec(
        name=name,
        source=entry["source"],
        fields=fields,
        sample_keys=tuple(sample_keys) if sample_keys is not None else None,
        writer=_writer_spec(f"{where}.writer", entry["writer"]),
        smoke_samples=int(entry["smoke"]["samples"]),
        verify={
            **entry["verify"],
            "samples": int(entry["verify"]["samples"]),
            "loader_batch": int(entry["verify"]["loader_batch"]),
            "full_max_samples": int(entry["verify"]["full_max_samples"]),
        },
        partitions=PartitionSpec(entry["partitions"], entry["samples_per_partition"], bool(entry["keep_parts"])),
        bad_samples=_bad_samples_spec(f"{where}.bad_samples", entry["bad_samples"]),
    )
    SOURCE_KINDS[spec.source["kind"]].check_spec(spec)
    return spec


def _bad_samples_spec(where: str, entry: dict[str, Any]) -> BadSamplesSpec:
    limit = entry["max"]
    if limit >= 1 and limit != int(limit):
        raise ConfigError(
            f"{where}.max",
            f"{limit!r} is neither a count (a whole number) nor a fraction (below 1); e.g. 12 or 0.001",
        )
    return BadSamplesSpec(policy=entry["policy"], max=int(limit) if limit >= 1 else float(limit))


def _check_field_names(where: str, names: list[str]) -> None:
    for name in names:
        try:
            encoded = name.encode("ascii")
        except UnicodeEncodeError:
            raise ConfigError(where, f"name {name!r} is not ASCII; ffcv stores field names as ASCII") from None
        if not encoded or b"\0" in encoded:
            raise ConfigError(where, f"name {name!r} must be non-empty and contain no NUL byte")
        if len(encoded) > MAX_FIELD_NAME_BYTES:
            raise ConfigError(
                where, f"name {name!r} is {len(encoded)} bytes; ffcv stores at most {MAX_FIELD_NAME_BYTES}"
            )
    if len(set(names)) != len(names):
        duplicate = next(n for n in names if names.count(n) > 1)
        raise ConfigError(where, f"name {duplicate!r} is used twice")


def _field_spec(where: str, name: str, entry: dict[str, Any]) -> FieldSpec:
    """The field's options checked and normalised by its kind (``FieldKind.normalise``)."""
    options = {k: v for k, v in entry.items() if k != "type"}
    return FieldSpec(
        name=name, type=entry["type"], options=field_kind(entry["type"]).normalise(f"{where}.{name}", options)
    )


def _check_source(where: str, source: dict[str, Any], fields: tuple[FieldSpec, ...], writer: dict[str, Any]) -> None:
    """What the schema cannot say about the source, and what its kind requires of the writer."""
    SOURCE_KINDS[source["kind"]].check_config(where, source, fields, writer)


def _writer_spec(where: str, entry: dict[str, Any]) -> WriterSpec:
    page_size = parse_size(entry["page_size"], f"{where}.page_size")
    if page_size & (page_size - 1) or not MIN_PAGE_SIZE <= page_size < MAX_PAGE_SIZE:
        raise ConfigError(
            f"{where}.page_size",
            f"{entry['page_size']!r} ({page_size} bytes) must be a power of two in [2MiB, 4GiB)",
        )
    if entry["num_workers"] == 0:
        raise ConfigError(f"{where}.num_workers", "0 is not a worker count; use -1 (all CPUs) or a positive number")
    indices = entry["indices"]
    if isinstance(indices, str):
        match = RANGE_PATTERN.match(indices)
        if not match:
            raise ConfigError(f"{where}.indices", f"{indices!r} is not a range 'start:stop[:step]'")
        if match.group(3) is not None and int(match.group(3)) == 0:
            raise ConfigError(f"{where}.indices", f"{indices!r} has step 0; the step must be at least 1")
    return WriterSpec(
        num_workers=int(entry["num_workers"]),
        page_size=page_size,
        chunksize=int(entry["chunksize"]),
        indices=[int(i) for i in indices] if isinstance(indices, list) else indices,
        shuffle=entry["shuffle"],
        seed=int(entry["seed"]),
    )
