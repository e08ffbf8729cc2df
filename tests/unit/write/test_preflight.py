"""The smoke stage's pre-flight inspection (results/{ds}/inspect.json): the smoke samples plus the
largest samples found cheaply, so a sample too big for a page fails in seconds, before the full
build, even when no smoke sample is that big."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import make_photo_folder
from PIL import Image

from betonbuild.config.load import load_config
from betonbuild.config.spec import smoke_positions
from betonbuild.errors import SampleError
from betonbuild.workflow.stages import build, make_source_manifest

SMOKE = 2


def folder_spec(root: Path, page_size: str = "2MiB"):
    return load_config(
        {
            "datasets": {
                "pics": {
                    "source": {"kind": "image_folder", "root": str(root)},
                    "fields": {"image": {"type": "rgb_image", "write_mode": "raw"}, "label": {"type": "int"}},
                    "writer": {"page_size": page_size},
                    "smoke": {"samples": SMOKE},
                }
            }
        }
    ).datasets["pics"]


@pytest.fixture
def folder_with_one_big_image(tmp_path) -> tuple[Path, int]:
    """12 photo crops of 32x32 and one 1000x1000 photo (3 MB raw: more than a 2 MiB page),
    at an index that is not a smoke sample."""
    root = make_photo_folder(tmp_path / "pics", per_class=6, size=32)
    big = np.asarray(Image.open(next((root / "coffee").glob("*.png"))).resize((1000, 1000)))
    Image.fromarray(big).save(root / "coffee" / "zz_big.png")
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*.png"))
    index = files.index("coffee/zz_big.png")
    assert index not in smoke_positions(len(files), SMOKE, 0).tolist()
    return root, index


def smoke_build(spec, tmp_path: Path) -> Path:
    manifest = tmp_path / "results" / "source.json"
    manifest.parent.mkdir(parents=True)
    make_source_manifest(spec, str(manifest))
    inspect = tmp_path / "results" / "inspect.json"
    build(
        spec,
        str(manifest),
        str(tmp_path / "results" / "smoke.beton"),
        str(tmp_path / "results" / "smoke.write.json"),
        smoke=True,
        survey_path=str(inspect),
    )
    return inspect


def test_a_sample_too_big_for_a_page_outside_the_smoke_samples_fails_the_smoke_stage(
    folder_with_one_big_image, tmp_path
):
    root, index = folder_with_one_big_image
    with pytest.raises(SampleError) as info:
        smoke_build(folder_spec(root), tmp_path)
    message = str(info.value)
    assert f"dataset 'pics', field 'image', sample index {index}" in message
    assert "page_size" in message and "4MiB" in message.replace(" ", "")
    assert not (tmp_path / "results" / "smoke.beton").exists()


def test_inspect_json_describes_every_field_and_the_largest_sample(folder_with_one_big_image, tmp_path):
    root, index = folder_with_one_big_image
    report = json.loads(smoke_build(folder_spec(root, "8MiB"), tmp_path).read_text())
    assert report["dataset"] == "pics"
    assert report["samples_inspected"] > 2 * SMOKE  # the smoke samples and the largest ones
    image, label = report["fields"]["image"], report["fields"]["label"]
    assert image["type"] == "rgb_image" and image["dtypes"] == ["uint8"]
    assert image["shape_min"] == [32, 32, 3] and image["shape_max"] == [1000, 1000, 3]
    assert image["bytes"]["min"] <= image["bytes"]["median"] < image["bytes"]["max"]
    assert image["bytes"]["max"] >= 1000 * 1000 * 3
    assert image["json_encodable"] is False and label["json_encodable"] is True
    assert label["python_types"] == ["builtins.int"]
    largest = report["largest_sample"]
    assert largest["index"] == index and largest["page_size"] == 8 << 20
    assert largest["fraction_of_page"] == pytest.approx(largest["bytes"] / (8 << 20), abs=1e-6)
