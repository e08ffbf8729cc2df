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
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from betonbuild.config.load import SCHEMA_PATH, load_config, schema
from betonbuild.config.spec import MAX_FIELD_NAME_BYTES
from betonbuild.fields.torch_tensor import TORCH_DTYPES

REPO = Path(__file__).resolve().parents[2]
CONFIG_DOC = REPO / "docs" / "configuration.md"
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
# The long sections of the README live on these pages, each whole.
DEMO_DOC = REPO / "docs" / "demo.md"
DATASETS_DOC = REPO / "docs" / "datasets.md"
DEVELOPMENT_DOC = REPO / "docs" / "development.md"
TROUBLESHOOTING_DOC = REPO / "docs" / "troubleshooting.md"

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
    assert {
        "results",
        "datasets.NAME.writer.page_size",
        "datasets.NAME.fields.FIELD.write_mode",
        "datasets.NAME.source.factory",
        "datasets.NAME.verify.loader_batch",
    } <= paths


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


@pytest.mark.parametrize("doc", [README, *DOCS], ids=lambda p: p.name)
def test_yaml_examples_in_the_docs_pass_config_validation(doc, request):
    if doc.name == "verification.md":  # its examples name the custom field class of its example module
        request.getfixturevalue("example_module_dir")
    examples = [yaml.safe_load(body) for lang, body in fenced_blocks(doc.read_text()) if lang == "yaml"]
    examples = [e for e in examples if isinstance(e, dict) and "datasets" in e]
    if doc in (CONFIG_DOC, DATASETS_DOC):
        assert examples, f"{doc.name} has no YAML config example"
    for example in examples:
        assert load_config(example).datasets


def anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("doc", [README, *DOCS], ids=lambda p: p.name)
def test_every_relative_link_of_the_docs_reaches_a_file_and_heading(doc):
    """The README's sections moved to docs/: a link to the old place would now lead nowhere."""
    text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.M | re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, fragment = target.partition("#")
        linked = (doc.parent / path).resolve() if path else doc
        assert linked.exists(), f"{doc.name} links to {target}, which does not exist"
        if fragment and linked.suffix == ".md":
            headings = re.findall(r"^#+ (.*)$", re.sub(r"^```.*?^```", "", linked.read_text(), flags=re.M | re.S), re.M)
            assert fragment in {anchor(h) for h in headings}, f"{doc.name} links to {target}: no such heading"


def test_readme_tables_name_every_source_kind_and_field_kind():
    from betonbuild.fields import FIELD_KINDS
    from betonbuild.sources import SOURCE_KINDS

    text = README.read_text()
    sources = set(re.findall(r"^\| `(\w+)` \| (?!stores)", section(text, "## Source kinds and field kinds"), re.M))
    fields = {
        name
        for row in re.findall(r"^\| (`\w+`(?:, `\w+`)*) \|", section(text, "## Source kinds and field kinds"), re.M)
        for name in re.findall(r"`(\w+)`", row)
    }
    assert set(SOURCE_KINDS) <= sources, f"README's table of source kinds lacks {set(SOURCE_KINDS) - sources}"
    assert set(FIELD_KINDS) <= fields, f"README's table of field kinds lacks {set(FIELD_KINDS) - fields}"
    assert fields - set(FIELD_KINDS) - set(SOURCE_KINDS) == set(), "README names a kind betonbuild does not have"


def test_readme_picture_shows_the_workflow_s_rules():
    from betonbuild.workflow_files import workflow_dir

    rules = set(
        re.findall(
            r"^(?:rule|checkpoint) (\w+):",
            "".join(p.read_text() for p in (workflow_dir() / "rules").glob("*.smk")),
            re.M,
        )
    )
    (graph,) = [body for lang, body in fenced_blocks(README.read_text()) if lang == "mermaid"]
    nodes = set(re.findall(r"\b([a-z_]+)(?:\[|\s*-->|\s*&|\s*$)", graph, re.M)) - {"config", "flowchart"}
    assert nodes <= rules, f"the README's picture shows rules the workflow does not have: {nodes - rules}"
    assert rules - nodes == {"demo_data"}, f"the README's picture lacks rules: {rules - nodes - {'demo_data'}}"


def test_demo_config_validates_and_its_field_types_are_documented_in_demo_md():
    demo = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config = load_config(demo)
    readme = DEMO_DOC.read_text()
    for name, spec in config.datasets.items():
        assert f"`{name}`" in readme, f"demo dataset {name} is not described in docs/demo.md"
        for field in spec.fields:
            assert f"`{field.name}` {field.type}" in readme, f"demo.md: demo {name} field {field.name} ({field.type})"


def test_readme_starts_with_make_run_and_make_test():
    text = README.read_text()
    blocks = [b for b in fenced_blocks(text) if b[0] != "mermaid"]  # the picture comes first
    assert blocks, "README.md has no code block"
    first = [line.split("#")[0].strip() for line in blocks[0][1].splitlines()]
    assert [line for line in first if line] == ["make run", "make test"], (
        "README.md's first code block must be exactly `make run` and `make test`"
    )
    own_data = [line.split("#")[0].split()[:2] for line in blocks[1][1].splitlines() if line.strip()]
    assert own_data == [["pip", "install"], ["betonbuild", "init"], ["cd", "myproject"]], own_data
    assert "betonbuild run" in blocks[1][1]
    assert "docs/configuration.md" in text
    development = [body for _, body in fenced_blocks(DEVELOPMENT_DOC.read_text())]
    assert "source .venv/bin/activate && snakemake --cores 32 all" in development[1]


# --- configuration.md: the complete entry and the dataset keys --------------------------------------


def dataset_level_keys() -> set[str]:
    """Every key of a dataset outside `source` and `fields` (dotted, below datasets.NAME)."""
    prefix = "datasets.NAME."
    return {
        path.removeprefix(prefix)
        for path, *_ in schema_keys()
        if path.startswith(prefix) and path.split(".")[2] not in ("source", "fields")
    }


def section(text: str, heading: str) -> str:
    """The text of a markdown section, from its heading to the next heading of the same or a higher level."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = text[text.index(heading + "\n") + len(heading) + 1 :].splitlines(keepends=True)
    fenced = False
    for i, line in enumerate(lines):
        fenced ^= line.startswith("```")
        if not fenced and re.match(rf"#{{1,{level}}} ", line):
            return "".join(lines[:i])
    return "".join(lines)


def test_complete_entry_holds_every_dataset_level_key():
    blocks = [
        body for lang, body in fenced_blocks(section(CONFIG_DOC.read_text(), "## A complete entry")) if lang == "yaml"
    ]
    assert len(blocks) == 1, "docs/configuration.md: `A complete entry` must hold one YAML block"
    (entry,) = yaml.safe_load(blocks[0])["datasets"].values()
    missing = []
    for key in sorted(dataset_level_keys()):
        node = entry
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                missing.append(key)
                break
            node = node[part]
    assert not missing, f"docs/configuration.md says its complete entry shows every key, but it lacks {missing}"
    source_keys = {path.rsplit(".", 1)[1] for path, *_ in schema_keys() if path.startswith("datasets.NAME.source.")}
    assert set(entry["source"]) == {"kind", "path", "columns"} <= source_keys  # every key of kind: arrays
    load_config({"datasets": {"example": entry}})


def test_dataset_row_lists_every_key_a_dataset_allows():
    row = " ".join(doc_rows()["datasets.NAME"])
    allowed = set(re.findall(r"`([a-z_]+)`", row.split("Keys allowed:", 1)[1]))
    top = {key.split(".")[0] for key in dataset_level_keys()} | {"source", "fields"}
    assert allowed == top, f"the `datasets.NAME` row's `Keys allowed:` differs from the schema: {sorted(allowed ^ top)}"


# --- examples that are built for real -----------------------------------------------------------------

VERIFICATION_DOC = REPO / "docs" / "verification.md"
BIN = Path(sys.executable).parent


def run(cmd: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, (
        f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    )
    return result


def custom_example() -> dict[str, list[str]]:
    """The blocks of verification.md's complete custom-field example, by language, in order."""
    blocks: dict[str, list[str]] = {}
    for lang, body in fenced_blocks(
        section(VERIFICATION_DOC.read_text(), "### A complete example: your own field class")
    ):
        blocks.setdefault(lang, []).append(body)
    return blocks


def write_named_files(blocks: list[str], directory: Path) -> list[str]:
    """Writes each block to the file its first line names (`# mytexts.py, in the working directory`)."""
    names = []
    for body in blocks:
        match = re.match(r"# ([\w.]+\.(?:py|yaml)),", body)
        assert match, f"an example block must start with `# FILE, in the working directory`: {body[:80]!r}"
        (directory / match.group(1)).write_text(body)
        names.append(match.group(1))
    return names


def test_custom_field_example_builds_verifies_and_loads(tmp_path):
    blocks = custom_example()
    module, loader_snippet = blocks["python"]
    assert write_named_files([module], tmp_path) == ["mytexts.py"]
    assert write_named_files(blocks["yaml"], tmp_path) == ["config.yaml"]

    commands = [line for line in blocks["bash"][0].splitlines() if line.strip()]
    outputs = {}
    for line in commands:
        cmd = shlex.split(line)
        if cmd[0] == "snakemake":  # a dry run: the DAG and every job's resources (mem_mb from the class)
            cmd = [c.replace("PATH/TO/betonbuild/Snakefile", str(REPO / "Snakefile")) for c in cmd] + ["-n", "-p"]
            cmd[0] = str(BIN / "snakemake")
        outputs[cmd[1] if cmd[0] == "betonbuild" else "snakemake"] = run(cmd, tmp_path).stdout
    assert set(outputs) == {"write", "verify", "inspect", "snakemake"}

    report = json.loads(outputs["verify"])
    assert report["ok"] is True, report["worst"]
    checks = {c["name"]: c for c in report["checks"]}
    text = checks["custom_fields"]["fields"]["text"]
    assert text["class"] == "mytexts:UTF8TextField"
    assert text["reencoded_equal"] == text["decoded_equal"] == 64
    assert checks["loader_batch"]["ok"] and "no decode/from_loader" not in checks["loader_batch"]["detail"]
    assert [f["type_id"] for f in report["fields"]] == [255, 255, 1]
    assert "'beton'" in outputs["inspect"] and "'text 1'" in outputs["inspect"]
    assert "rule verify:" in outputs["snakemake"] and "mem_mb=" in outputs["snakemake"]

    # The Loader snippet, on the file `betonbuild write` made; its last batch holds samples 48-63.
    snippet = loader_snippet.replace("results/texts/texts.beton", "texts.beton") + (
        "\nfrom mytexts import texts as make\n"
        "assert texts == [make()[i]['text'] for i in range(48, 64)], texts\n"
        "assert titles == [f'text {i}' for i in range(48, 64)], titles\n"
        "assert label.numpy().ravel().tolist() == [i % 3 for i in range(48, 64)]\n"
        "print('loader ok')\n"
    )
    (tmp_path / "load.py").write_text("import betonbuild  # ffcv without its numba start-up cost\n" + snippet)
    assert "loader ok" in run([sys.executable, "load.py"], tmp_path).stdout


def test_datasets_md_python_dataset_example_builds_and_verifies(tmp_path):
    readme = DATASETS_DOC.read_text()
    (module,) = [body for lang, body in fenced_blocks(readme) if lang == "python" and "def captions(" in body]
    (tmp_path / "mydatasets.py").write_text(module)
    (example,) = [
        yaml.safe_load(body) for lang, body in fenced_blocks(readme) if lang == "yaml" and "mydatasets:captions" in body
    ]
    write_config_file = tmp_path / "config.yaml"
    write_config_file.write_text(
        yaml.safe_dump({"datasets": {"captions": example["datasets"]["captions"]}}, sort_keys=False)
    )
    run(
        ["betonbuild", "write", "--config", "config.yaml", "--dataset", "captions", "--output", "captions.beton"],
        tmp_path,
    )
    report = json.loads(
        run(
            ["betonbuild", "verify", "captions.beton", "--config", "config.yaml", "--dataset", "captions"], tmp_path
        ).stdout
    )
    assert report["ok"] is True, report["worst"]
    assert report["num_samples"]["found"] == example["datasets"]["captions"]["source"]["args"]["n"]


# --- quoted messages are the code's ---------------------------------------------------------------------


def flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


@pytest.fixture
def example_module_dir(tmp_path, monkeypatch):
    """tmp_path holding the custom-field example's module, as the working directory of this process."""
    (tmp_path / "mytexts.py").write_text(custom_example()["python"][0])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # load_class puts the working directory first
    yield tmp_path
    sys.modules.pop("mytexts", None)


def test_troubleshooting_quotes_the_real_messages(example_module_dir):
    from betonbuild.errors import ConfigError, SampleError
    from betonbuild.fields.custom import load_class
    from betonbuild.provenance import installed_ffcv_build
    from betonbuild.verify.report import Report, check_build
    from betonbuild.write.contract import check_sample

    readme = flat(TROUBLESHOOTING_DOC.read_text())

    captions = load_config(
        {
            "datasets": {
                "captions": {"source": {"kind": "python", "factory": "m:f"}, "fields": {"caption": {"type": "bytes"}}}
            }
        }
    ).datasets["captions"]
    with pytest.raises(SampleError) as empty:
        check_sample(captions, (b"",), 7)
    assert f"betonbuild error: {empty.value}" in readme
    wine = load_config(
        {
            "datasets": {
                "wine": {
                    "source": {"kind": "python", "factory": "m:f"},
                    "fields": {"features": {"type": "ndarray", "dtype": "float32", "shape": [13]}},
                }
            }
        }
    ).datasets["wine"]
    with pytest.raises(SampleError) as float64:
        check_sample(wine, (np.zeros(13),), 12)
    assert f"betonbuild error: {float64.value}" in readme

    reader = installed_ffcv_build()
    report = Report()
    digits = load_config(
        {
            "datasets": {
                "digits": {
                    "source": {"kind": "arrays", "path": "d.npz", "columns": {"x": "x"}},
                    "fields": {"x": {"type": "int"}},
                }
            }
        }
    ).datasets["digits"]
    check_build(digits, {**reader, "numpy": "2.3.1"}, {**reader, "numpy": "2.4.6"}, report)
    assert f"verification of results/digits/digits.beton failed: {report.worst()} (full report kept at " in readme

    for path in ("mytext:UTF8TextField", "mytexts:UTF8Text", "mytexts:texts", "mytexts:Texts"):
        with pytest.raises(ConfigError) as bad:
            load_class(path, "datasets.texts.fields.text.class")
        why = bad.value.why if path != "mytext:UTF8TextField" else str(bad.value)
        assert flat(why) in readme, f"README does not quote the error for {path}: {why}"
    assert "Must specify a custom_field entry for custom field text" in readme  # ffcv/reader.py's text
