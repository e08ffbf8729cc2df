"""`snakemake --report report.html` renders in a real browser: headless Chromium runs the report's
JavaScript (Snakemake's report is a single-page app whose content is data inside a script), and
the rendered page lists every dataset.

Chromium is the Debian package `chromium`. When it is missing, the test installs it with apt-get
when it runs as root on Debian (as tests/slurm_cluster.py installs slurm), and is skipped, with the
reason, otherwise.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_digits_npz, run_snakemake, write_config
from PIL import Image

PACKAGE = "chromium"
DATASETS = ("render_images", "render_numbers")  # names no other text of the report contains


def chromium_unavailable_reason() -> str | None:
    """Why Chromium can neither be found nor installed here, or None."""
    if shutil.which("chromium"):
        return None
    if not sys.platform.startswith("linux") or not Path("/etc/debian_version").exists():
        return "needs chromium (Debian's package `chromium`); this is not Debian, so it is not installed here"
    if shutil.which("apt-get") is None:
        return "needs chromium, and apt-get to install it"
    if os.geteuid() != 0:
        return "needs chromium: install it with `apt-get install chromium` (the test installs it only as root)"
    return None


def install_chromium() -> str:
    """apt-get install chromium, with an `apt-get update` first only when the package lists are stale."""
    path = shutil.which("chromium")
    if path:
        return path
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", PACKAGE]
    if subprocess.run(install, capture_output=True, env=env, timeout=900).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], check=True, capture_output=True, env=env, timeout=600)
        result = subprocess.run(install, capture_output=True, text=True, env=env, timeout=900)
        if result.returncode != 0:
            raise RuntimeError(f"apt-get install {PACKAGE} failed:\n{result.stdout}\n{result.stderr}")
    path = shutil.which("chromium")
    assert path, f"apt-get installed {PACKAGE}, but there is no `chromium` on PATH"
    return path


@pytest.fixture(scope="module")
def browser() -> str:
    reason = chromium_unavailable_reason()
    if reason:
        pytest.skip(reason)
    return install_chromium()


@pytest.fixture(scope="module")
def report_html(tmp_path_factory) -> Path:
    """A two-dataset project (2 images, 20 digits), built, and its report.html."""
    workdir = tmp_path_factory.mktemp("report_render")
    for name, rgb in (("a_red", (255, 0, 0)), ("b_blue", (0, 0, 255))):
        (workdir / "images" / name).mkdir(parents=True)
        Image.new("RGB", (24, 16), rgb).save(workdir / "images" / name / "0.png")
    make_digits_npz(workdir / "digits.npz", n=20)
    images, numbers = DATASETS
    write_config(
        workdir,
        {
            images: {
                "source": {"kind": "image_folder", "root": "images"},
                "fields": {"image": {"type": "rgb_image", "write_mode": "jpg"}, "label": {"type": "int"}},
                "smoke": {"samples": 1},
            },
            numbers: {
                "source": {"kind": "arrays", "path": "digits.npz", "columns": {"image": "images", "label": "target"}},
                "fields": {"image": {"type": "ndarray", "dtype": "uint8", "shape": [8, 8]}, "label": {"type": "int"}},
                "smoke": {"samples": 1},
            },
        },
    )
    run_snakemake(workdir, "all")
    run_snakemake(workdir, "--report", str(workdir / "report.html"))
    return workdir / "report.html"


def without_scripts(html: str) -> str:
    return re.sub(r"<(script|style)\b.*?</\1\s*>", "", html, flags=re.S | re.I)


def visible_words(html: str) -> set[str]:
    return set(re.sub(r"<[^>]+>", " ", without_scripts(html)).split())


def test_report_embeds_every_datasets_preview_and_summary(report_html):
    page = report_html.read_text()
    for ds in DATASETS:
        for name in ("preview.png", "summary.html"):
            content = (report_html.parent / "results" / ds / "report" / name).read_bytes()
            assert base64.b64encode(content).decode() in page, f"{ds}'s {name} is not embedded in report.html"


def test_rendered_report_lists_every_dataset(report_html, browser, tmp_path):
    static = visible_words(report_html.read_text())
    assert not static & set(DATASETS), "the names must come from the report's JavaScript, not its static HTML"
    result = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=10000",
            "--dump-dom",
            report_html.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, f"chromium failed ({result.returncode}):\n{result.stderr[-4000:]}"
    rendered = visible_words(result.stdout)
    assert "Results" in rendered, f"the report's app did not render:\n{without_scripts(result.stdout)[:2000]}"
    missing = [ds for ds in DATASETS if ds not in rendered]
    assert not missing, f"datasets {missing} are not in the rendered report"
