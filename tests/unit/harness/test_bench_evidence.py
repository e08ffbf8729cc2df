"""The benchmark evidence cannot hide a failure or go stale: bench/harness/report.py and __main__.py
with small fixture results (no benchmark is measured here).

- a side that fails shows FAILED in RESULTS.md and README (side, command, error tail, commit, date);
  the old figures appear only labelled as the last successful measurement;
- ``--quick`` leaves results.json, RESULTS.md and README.md alone;
- README's BENCH section and RESULTS.md's harness section are what ``--render`` makes of the
  committed bench/results.json, and every figure line names a commit.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench.harness import __main__ as harness
from bench.harness import report

REPO = Path(__file__).resolve().parents[3]
COMMIT = re.compile(r"`[0-9a-f]{7,40}`")


def measured_entry(ident: int = 2, name: str = "raw_write", median: float = 0.86, tree: str = "d05cfb93a3 (old)"):
    """A measured entry shaped as a benchmark's run() returns it, after __main__ adds its fields."""
    side = {
        "command": "cp a b",
        "seconds": {"median": 2.0, "min": 1.9, "max": 2.1},
        "cpu_seconds": 2.0,
        "max_rss_mib": 8,
        "load1": {"median": 1.0, "min": 1.0, "max": 1.0},
        "other_cores": {"median": 0.0, "min": 0.0, "max": 0.0},
    }
    return {
        "id": ident,
        "name": name,
        "title": f"benchmark {name}",
        "data": "fixture data",
        "sides": {"plain_ffcv": side, "cp": side},
        "ratios": [
            {
                "of": "plain_ffcv / cp",
                "median": median,
                "min": median,
                "max": median,
                "per_pair": [median],
                "quiet_pairs": 1,
                "quiet_median": median,
            }
        ],
        "targets": [],
        "content": "content digests equal",
        "notes": [f"throughput (median, whole process): cp {median * 7:.2f} GiB/s"],
        "rounds": [{"plain_ffcv": {"load1": 1.0}, "cp": {"load1": 1.0}}],
        "status": "measured",
        "measured_at": "2026-11-29 22:10 UTC",
        "command": "python -m bench.harness --only 2",
        "tree": tree,
        "pairs": 1,
        "duration_s": 10,
        "load1": {"min": 1.0, "max": 1.0},
    }


class FakeModule:
    ID, NAME, TITLE = 2, "raw_write", "benchmark raw_write"


def failed_results() -> dict:
    """A run of benchmark 2 whose `cp` side exited 1, recorded over a good earlier measurement."""
    results = {"benchmarks": {"raw_write": measured_entry()}, "last_run": {"machine": {"cores": 2}}}
    error = harness.SideFailed("cp a b", 1, Path("/w"), Path("/w/err"), "cp: cannot stat 'a': No such file\n")
    error.side, error.command = "cp", "cp $CACHE/raw_write/plain.beton $CACHE/raw_write/copy.beton"
    entry = harness.failure_entry(FakeModule, error)
    entry.update(
        measured_at="2026-12-02 09:00 UTC", command="python -m bench.harness --only 2", tree="abc1234def (new)"
    )
    previous = results["benchmarks"]["raw_write"]
    if report.failed(entry):
        entry["last_success"] = previous
    results["benchmarks"]["raw_write"] = entry
    return results


def test_a_failed_side_shows_failed_with_side_command_error_commit_and_date():
    text = report.render(failed_results())
    row = next(line for line in text.splitlines() if line.startswith("| 2 |") and "FAILED" in line)
    assert "side `cp` exited 1" in row and "`abc1234def` 2026-12-02 09:00 UTC" in row
    section = text.split("### 2. benchmark raw_write", 1)[1]
    assert section.lstrip().startswith("**FAILED** 2026-12-02 09:00 UTC at commit `abc1234def`")
    assert "The failing command: `cp $CACHE/raw_write/plain.beton $CACHE/raw_write/copy.beton`." in section
    assert "cp: cannot stat 'a': No such file" in section


def test_the_old_figures_are_shown_only_as_the_last_successful_measurement():
    results = failed_results()
    for text in (report.render(results), report.render_readme(results)):
        lines = text.splitlines()
        old = [i for i, line in enumerate(lines) if "**0.86**" in line or "6.02 GiB/s" in line]
        assert old, "the last good figures are kept"
        for i in old:
            labelled = "last successful measurement" in lines[i] and "`d05cfb93a3`" in lines[i]
            under_heading = any(
                line.startswith("#### Last successful measurement, at commit `d05cfb93a3`") for line in lines[:i]
            )
            assert labelled or under_heading, lines[i]
        assert "not current" in text


def test_a_failure_without_an_earlier_measurement_says_so():
    results = failed_results()
    del results["benchmarks"]["raw_write"]["last_success"]
    text = report.render(results)
    assert "**FAILED**" in text and "No successful measurement of this benchmark is recorded." in text
    assert "**0.86**" not in text


def test_a_content_mismatch_and_an_unexpected_error_are_failures_too():
    mismatch = harness.failure_entry(FakeModule, harness.ContentMismatch("content digests differ: {a, b}"))
    crash = harness.failure_entry(FakeModule, KeyError("sides"))
    assert report.failed(mismatch) and report.failed(crash)
    assert "KeyError" in crash["failure"]["error_tail"]
    for entry in (mismatch, crash):
        entry.update(measured_at="2026-12-02 09:00 UTC", command="python -m bench.harness", tree="abc1234def (new)")
        text = report.render({"benchmarks": {"raw_write": entry}})
        assert "**FAILED**" in text and "`abc1234def`" in text


FAKE_RUN = textwrap.dedent(
    """
    import json, sys, types
    from pathlib import Path
    from bench.harness import __main__ as harness

    mode, files = sys.argv[1], json.loads(sys.argv[2])
    harness.MAIN_JSON, harness.MAIN_MARKDOWN = Path(files["json"]), Path(files["markdown"])
    harness.measured_tree = lambda choice, cache: (Path(files["tree"]), "fedcba9876 (fixture commit)")
    entry = json.loads(files["entry"])

    def run(ctx):
        if mode == "fail":
            error = harness.SideFailed("false", 1, Path("."), Path("err"), "the side broke\\n")
            error.side, error.command = "cp", "false"
            raise error
        return dict(entry)

    module = types.ModuleType("bench.harness.fixture_bench")
    module.ID, module.NAME, module.TITLE, module.run = 2, "raw_write", "benchmark raw_write", run
    sys.modules[module.__name__] = module
    harness.MODULES = {2: "fixture_bench"}
    args = ["--only", "2", "--cache", files["cache"], "--readme", files["readme"], "--quiet-below", "0"]
    sys.exit(harness.main(args + (["--quick"] if mode == "quick" else [])))
    """
)


@pytest.fixture
def project(tmp_path: Path) -> dict:
    """Copies of the committed results.json, RESULTS.md and README.md, which a fixture run may rewrite."""
    files = {"json": "results.json", "markdown": "RESULTS.md", "readme": "README.md"}
    paths = {key: tmp_path / name for key, name in files.items()}
    paths["json"].write_text((REPO / "bench/results.json").read_text())
    paths["markdown"].write_text((REPO / "bench/RESULTS.md").read_text())
    paths["readme"].write_text((REPO / "README.md").read_text())
    (tmp_path / "tree").mkdir()
    return {**{k: str(v) for k, v in paths.items()}, "cache": str(tmp_path / "cache"), "tree": str(tmp_path / "tree")}


def fixture_run(project: dict, mode: str) -> subprocess.CompletedProcess:
    entry = measured_entry(median=0.5)
    for key in ("status", "measured_at", "command", "tree", "pairs", "duration_s", "load1"):
        del entry[key]  # __main__ adds these
    files = {**project, "entry": json.dumps(entry)}
    return subprocess.run(
        [sys.executable, "-c", FAKE_RUN, mode, json.dumps(files)], capture_output=True, text=True, timeout=120
    )


def snapshot(project: dict) -> dict:
    return {key: Path(project[key]).read_bytes() for key in ("json", "markdown", "readme")}


def test_quick_does_not_touch_results_json_results_md_or_readme(project):
    before = snapshot(project)
    done = fixture_run(project, "quick")
    assert done.returncode == 0, done.stderr
    assert snapshot(project) == before
    quick = Path(project["cache"])
    assert (
        json.loads((quick / "results-quick.json").read_text())["benchmarks"]["raw_write"]["ratios"][0]["median"] == 0.5
    )
    assert "**QUICK RUN**" in (quick / "RESULTS-quick.md").read_text()


def test_quick_refuses_to_record_into_the_main_results():
    with pytest.raises(SystemExit):
        harness.parse_args(["--quick", "--json", str(harness.MAIN_JSON)])
    with pytest.raises(SystemExit):
        harness.parse_args(["--quick", "--markdown", str(harness.MAIN_MARKDOWN)])


def test_a_real_run_whose_side_fails_records_failed_and_keeps_the_old_figures_labelled(project):
    committed = json.loads(Path(project["json"]).read_text())["benchmarks"]["raw_write"]  # the last real figures
    old_tree, old_figure = committed["tree"][:10], f"**{committed['ratios'][1]['median']:.2f}**"
    done = fixture_run(project, "fail")
    assert done.returncode == 1
    entry = json.loads(Path(project["json"]).read_text())["benchmarks"]["raw_write"]
    assert entry["status"] == "error" and entry["failure"]["side"] == "cp"
    assert entry["tree"].startswith("fedcba9876") and entry["last_success"]["tree"].startswith(old_tree)
    for key in ("markdown", "readme"):
        text = Path(project[key]).read_text()
        row = next(line for line in text.splitlines() if line.startswith("| 2 |") and "FAILED" in line)
        assert "side `cp` exited 1" in row and "`fedcba9876`" in row, key
        old = [line for line in text.splitlines() if line.startswith("| 2 |") and old_figure in line]
        assert old and all(f"last successful measurement (at `{old_tree}`, not current)" in line for line in old)
    assert "the side broke" in Path(project["markdown"]).read_text()


def test_render_rewrites_both_sections_from_results_json_alone(project):
    results = json.loads(Path(project["json"]).read_text())
    results["benchmarks"]["webdataset"]["ratios"][0]["median"] = 9.87
    Path(project["json"]).write_text(json.dumps(results))
    args = ["--render", "--json", project["json"], "--markdown", project["markdown"], "--readme", project["readme"]]
    assert harness.main(args) == 0
    for key in ("markdown", "readme"):
        text = Path(project[key]).read_text()
        assert "**9.87**" in text, key
    readme = Path(project["readme"]).read_text()
    assert readme.startswith((REPO / "README.md").read_text().split(report.README_BEGIN)[0])
    assert readme.endswith((REPO / "README.md").read_text().split(report.README_END)[1])


def committed_region(path: Path, begin: str, end: str) -> str:
    text = path.read_text()
    assert begin in text and end in text, f"{path} has no generated section"
    return begin + text.split(begin, 1)[1].split(end, 1)[0] + end


def committed_results() -> dict:
    return report.load_json(REPO / "bench/results.json")


def test_readme_measured_section_is_what_the_generator_renders_from_results_json():
    region = committed_region(REPO / "README.md", report.README_BEGIN, report.README_END)
    assert region == report.render_readme(committed_results()), "run: python -m bench.harness --render"


def test_results_md_harness_section_is_what_the_generator_renders_from_results_json():
    region = committed_region(REPO / "bench/RESULTS.md", report.BEGIN, report.END)
    assert region == report.render(committed_results()), "run: python -m bench.harness --render"


def figure_lines(text: str) -> list[str]:
    """Table rows with a figure (a bold number, FAILED) and the README's lines of throughputs."""
    return [
        line
        for line in text.splitlines()
        if (line.startswith("| ") and ("**" in line)) or (line.startswith("- ") and "/s" in line)
    ]


@pytest.mark.parametrize(
    "path, begin, end",
    [("README.md", report.README_BEGIN, report.README_END), ("bench/RESULTS.md", report.BEGIN, report.END)],
)
def test_every_figure_line_names_a_commit(path: str, begin: str, end: str):
    region = committed_region(REPO / path, begin, end)
    summary = region.split("\n### ", 1)[0]  # RESULTS.md: the table; each section below names its own
    lines = figure_lines(summary)
    assert len(lines) >= len(committed_results()["benchmarks"])
    for line in lines:
        assert COMMIT.search(line), line
    for section in region.split("\n### ")[1:]:
        assert re.search(r"at commit `[0-9a-f]{7,40}`", section), section[:200]


def test_readme_holds_no_hand_written_throughput():
    """Outside the generated section, no GiB/s figure: the one there was benchmark 5's, quoted as benchmark 2's."""
    text = (REPO / "README.md").read_text()
    outside = text.split(report.README_BEGIN)[0] + text.split(report.README_END)[1]
    assert not re.search(r"\d\s*GiB/s", outside)
