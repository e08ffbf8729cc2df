"""The user documentation must not drift from the code.

docs/configuration.md documents every config key as a table row whose first cell is the key's
dotted path (`datasets.NAME.writer.page_size`), then its type, its default and its constraints.
These tests walk the JSON schema and require, for every key, a row that names its types, shows
its default in backticks (or says "required" / "(none)"), and lists every enum value, bound and
pattern; and every documented key must still exist in the schema. The YAML examples in the docs
must pass the real config validation.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from betonbuild.spec import MAX_FIELD_NAME_BYTES, SCHEMA_PATH, TORCH_DTYPES, load_config, schema

REPO = Path(__file__).resolve().parents[1]
CONFIG_DOC = REPO / "docs" / "configuration.md"
README = REPO / "README.md"

# additionalProperties of these keys are documented under a placeholder name.
PLACEHOLDERS = {"datasets": "NAME", "fields": "FIELD"}


def render(value) -> str:
    """How a schema value is written in the doc, inside backticks."""
    return value if isinstance(value, str) else json.dumps(value)


def resolve(node: dict, root: dict) -> dict:
    if "$ref" not in node:
        return node
    target = root
    for part in node["$ref"].removeprefix("#/").split("/"):
        target = target[part]
    siblings = {k: v for k, v in node.items() if k != "$ref"}
    return {**resolve(target, root), **siblings}


def documented_keys(node: dict, path: str, root: dict, required: bool = False, name_pattern: str | None = None):
    """Yields (dotted path, schema, required, pattern of the name) for every key under ``node``."""
    node = resolve(node, root)
    if path:
        yield path, node, required, name_pattern
    branches = [node] + [b[k] for b in node.get("allOf", []) for k in ("then", "else") if k in b]
    for branch in branches:
        needed = set(branch.get("required", []))
        for name, sub in branch.get("properties", {}).items():
            child = f"{path}.{name}" if path else name
            if sub == {} and branch is not node:
                continue  # `kind: {}` / `type: {}` inside a branch: documented with the base schema
            yield from documented_keys(sub, child, root, name in needed)
    extra = node.get("additionalProperties")
    last = path.rsplit(".", 1)[-1]
    if isinstance(extra, dict) and last in PLACEHOLDERS:
        pattern = node.get("propertyNames", {}).get("pattern")
        yield from documented_keys(extra, f"{path}.{PLACEHOLDERS[last]}", root, False, pattern)


def schema_keys() -> list[tuple[str, dict, bool, str | None]]:
    root = schema()
    return list(documented_keys(root, "", root))


def doc_rows() -> dict[str, list[str]]:
    """Key -> cells of its table row (key, type, default, constraints)."""
    rows: dict[str, list[str]] = {}
    for line in CONFIG_DOC.read_text().splitlines():
        match = re.match(r"^\| `([^`]+)` \|", line)
        if not match:
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 4, f"docs/configuration.md row for {match.group(1)} needs 4 cells: {line}"
        assert match.group(1) not in rows, f"{match.group(1)} is documented twice"
        rows[match.group(1)] = cells
    return rows


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block, in order."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.M | re.S)


def test_schema_walk_finds_the_keys_we_know():
    paths = {path for path, *_ in schema_keys()}
    assert {"results", "datasets.NAME.writer.page_size", "datasets.NAME.fields.FIELD.write_mode",
            "datasets.NAME.source.factory", "datasets.NAME.verify.loader_batch"} <= paths


@pytest.mark.parametrize("path, node, required, name_pattern", [pytest.param(*key, id=key[0]) for key in schema_keys()])
def test_every_schema_key_is_documented_with_type_default_and_constraints(path, node, required, name_pattern):
    rows = doc_rows()
    assert path in rows, f"docs/configuration.md has no row for `{path}`"
    key, types_cell, default_cell, _ = cells = rows[path]
    row = " | ".join(cells)
    types = node.get("type", [])
    for json_type in [types] if isinstance(types, str) else types:
        assert json_type in types_cell, f"`{path}`: type {json_type!r} missing from {types_cell!r}"
    if "default" in node:
        assert f"`{render(node['default'])}`" in default_cell, (
            f"`{path}`: default `{render(node['default'])}` missing from the default cell {default_cell!r}"
        )
    if required:
        assert "required" in (default_cell if "default" not in node else row), f"`{path}` must say it is required"
    if "default" not in node and not required:
        assert default_cell == "(none)", f"`{path}` has no default: its default cell must be (none)"
    for value in node.get("enum", []):
        assert f"`{render(value)}`" in row, f"`{path}`: enum value `{render(value)}` is not documented"
    for source in (node, node.get("items") or {}):
        if "minimum" in source:
            assert f"`>= {source['minimum']}`" in row, f"`{path}`: bound `>= {source['minimum']}` missing"
        if "maximum" in source:
            assert f"`<= {source['maximum']}`" in row, f"`{path}`: bound `<= {source['maximum']}` missing"
        if "pattern" in source:
            assert f"`{source['pattern']}`" in row, f"`{path}`: pattern `{source['pattern']}` missing"
    if name_pattern:
        assert f"`{name_pattern}`" in row, f"`{path}`: name pattern `{name_pattern}` missing"


def test_every_documented_key_exists_in_the_schema():
    known = {path for path, *_ in schema_keys()}
    stale = sorted(set(doc_rows()) - known)
    assert not stale, f"docs/configuration.md documents keys the schema does not have: {stale}"


def test_semantic_limits_of_spec_are_documented():
    rows = doc_rows()
    dtype_row = " ".join(rows["datasets.NAME.fields.FIELD.dtype"])
    for dtype in TORCH_DTYPES:
        assert f"`{dtype}`" in dtype_row, f"torch dtype {dtype} missing from the dtype row"
    assert f"at most {MAX_FIELD_NAME_BYTES} bytes" in " ".join(rows["datasets.NAME.fields.FIELD"])
    assert "power of two in [2 MiB, 4 GiB)" in " ".join(rows["datasets.NAME.writer.page_size"])
    assert "`0` is rejected" in " ".join(rows["datasets.NAME.writer.num_workers"])
    assert "`write_mode: smart` requires it" in " ".join(rows["datasets.NAME.fields.FIELD.smart_threshold"])


def test_config_doc_points_at_the_schema_file():
    assert str(SCHEMA_PATH.relative_to(REPO)) in CONFIG_DOC.read_text()


@pytest.mark.parametrize("doc", [README, CONFIG_DOC], ids=lambda p: p.name)
def test_yaml_examples_in_the_docs_pass_config_validation(doc):
    examples = [yaml.safe_load(body) for lang, body in fenced_blocks(doc.read_text()) if lang == "yaml"]
    examples = [e for e in examples if isinstance(e, dict) and "datasets" in e]
    assert examples, f"{doc.name} has no YAML config example"
    for example in examples:
        assert load_config(example).datasets


def test_demo_config_validates_and_its_field_types_are_documented_in_readme():
    demo = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config = load_config(demo)
    readme = README.read_text()
    for name, spec in config.datasets.items():
        assert f"`{name}`" in readme, f"demo dataset {name} is not described in README.md"
        for field in spec.fields:
            assert f"`{field.name}` {field.type}" in readme, f"README: demo {name} field {field.name} ({field.type})"


def test_readme_starts_with_make_run_and_make_test():
    text = README.read_text()
    blocks = fenced_blocks(text)
    assert blocks, "README.md has no code block"
    first = [line.split("#")[0].strip() for line in blocks[0][1].splitlines()]
    assert [line for line in first if line] == ["make run", "make test"], (
        "README.md's first code block must be exactly `make run` and `make test`"
    )
    assert "source .venv/bin/activate && snakemake --cores 32 all" in blocks[1][1]
    assert "docs/configuration.md" in text
