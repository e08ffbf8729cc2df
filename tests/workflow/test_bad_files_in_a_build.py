"""Bad files through the real workflow (issue 17 items 2-4): one `snakemake --keep-going` run over
a 16-bit PNG, a decompression bomb, an .npz of objects, a truncated .npy and an implausible
__len__, beside a good dataset. Each is one `betonbuild error:` line naming the dataset and the
file; none is an `unexpected error` with a traceback; nothing is left at a target path."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from bad_files import HUGE_ADAPTER, write_16_bit_png, write_bomb_png
from conftest import make_photo_folder, run_snakemake, write_config

FOLDER_FIELDS = {"image": {"type": "rgb_image", "image_mode": "convert"}, "label": {"type": "int"}}
DIGIT_FIELDS = {"image": {"type": "ndarray", "dtype": "uint8", "shape": [8, 8]}, "label": {"type": "int"}}
SMALL = {"smoke": {"samples": 2}, "writer": {"num_workers": 1}}


def folder(root: str) -> dict:
    return {"source": {"kind": "image_folder", "root": root}, "fields": FOLDER_FIELDS, **SMALL}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    workdir = tmp_path_factory.mktemp("bad_files")
    make_photo_folder(workdir / "photos", per_class=2)
    make_photo_folder(workdir / "scans", classes=("astronaut",), per_class=1)
    write_16_bit_png(workdir / "scans/astronaut/1.png")
    make_photo_folder(workdir / "bombs", classes=("coffee",), per_class=1)
    write_bomb_png(workdir / "bombs/coffee/1.png")
    np.savez(workdir / "objects.npz", image=np.zeros((3, 8, 8), np.uint8), label=np.array([1, "2", None], object))
    np.save(workdir / "image.npy", np.zeros((100, 8, 8), np.uint8))
    np.save(workdir / "label.npy", np.arange(100))
    with open(workdir / "image.npy", "r+b") as fh:
        fh.truncate(128 + 50 * 64)
    (workdir / "bb_huge_adapter.py").write_text(HUGE_ADAPTER)
    write_config(
        workdir,
        {
            "good": folder("photos"),
            "scans": folder("scans"),
            "bombs": folder("bombs"),
            "objects": {
                "source": {"kind": "arrays", "path": "objects.npz", "columns": {"image": "image", "label": "label"}},
                "fields": DIGIT_FIELDS,
            },
            "truncated": {
                "source": {"kind": "arrays", "columns": {"image": "image.npy", "label": "label.npy"}},
                "fields": DIGIT_FIELDS,
            },
            "huge": {
                "source": {"kind": "python", "factory": "bb_huge_adapter:huge"},
                "fields": {"x": {"type": "float"}, "y": {"type": "int"}},
            },
        },
    )
    return workdir, run_snakemake(workdir, "--keep-going", timeout=300, check=False)


EXPECTED = {
    "scans": "PIL image (file scans/astronaut/1.png) has mode I;16 (16-bit integer values, largest 4095)",
    "bombs": "image file bombs/coffee/1.png is 900,000,000 pixels, above PIL's decompression-bomb limit",
    "objects": "array 'label' of objects.npz holds Python objects (dtype object)",
    "truncated": "image.npy is truncated: its header claims 100 rows of uint8 [8, 8] (6,528 bytes with the "
    "128-byte header) but the file holds 3,328 bytes (50 whole rows)",
    "huge": "the dataset's __len__ is 1,000,000,000,000",
}


def test_the_good_dataset_still_verifies(run):
    workdir, result = run
    assert result.returncode != 0
    assert json.loads((workdir / "results/good/good.verify.json").read_text())["ok"] is True


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_bad_file_is_one_clear_message_naming_the_dataset_and_the_file(run, name):
    workdir, result = run
    output = result.stdout + result.stderr
    lines = [line for line in output.splitlines() if line.startswith(f"betonbuild error: dataset '{name}'")]
    assert lines, output[-6000:]
    assert EXPECTED[name] in lines[0], lines[0]
    assert "unexpected error" not in output, output[-6000:]
    assert not (workdir / f"results/{name}/{name}.beton").exists()
