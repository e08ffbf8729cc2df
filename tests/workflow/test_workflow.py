"""The real workflow, run by real `snakemake` on small real data in a temp directory."""

from __future__ import annotations

import hashlib
import json
import textwrap
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, make_digits_npz, make_photo_folder, run_snakemake, write_config

from betonbuild.workflow.status import plan

WINE_ADAPTER = textwrap.dedent(
    """
    import numpy as np
    from sklearn.datasets import load_wine


    class Wine:
        def __init__(self, n):
            data = load_wine()
            self.x, self.y, self.names = data.data[:n].astype(np.float32), data.target[:n], data.target_names

        def __len__(self):
            return len(self.y)

        def __getitem__(self, i):
            # keys deliberately not in field order: dict samples are mapped by name
            return {"meta": {"row": i, "class": str(self.names[self.y[i]])}, "label": int(self.y[i]), "x": self.x[i]}


    def make(n=60):
        return Wine(n)
    """
)


def datasets(workdir: Path, digits: Path, photos: Path) -> dict:
    return {
        "digits": {
            "source": {
                "kind": "arrays",
                "path": str(digits.relative_to(workdir)),
                "columns": {"image": "images", "label": "target"},
            },
            "fields": {"image": {"type": "ndarray", "dtype": "uint8", "shape": [8, 8]}, "label": {"type": "int"}},
            "writer": {"shuffle": True, "seed": 3},
            "smoke": {"samples": 8},
        },
        "photos": {
            "source": {"kind": "image_folder", "root": str(photos.relative_to(workdir))},
            "fields": {
                "image": {"type": "rgb_image", "write_mode": "jpg", "max_resolution": 32},
                "label": {"type": "int"},
            },
            "smoke": {"samples": 2},
        },
        "wine": {
            "source": {"kind": "python", "factory": "wine_adapter:make", "args": {"n": 60}},
            "fields": {
                "x": {"type": "ndarray", "dtype": "float32", "shape": [13]},
                "label": {"type": "int"},
                "meta": {"type": "json"},
            },
            "smoke": {"samples": 4},
        },
        "gray_tokens": {  # betonbuild's own field kinds (docs/field-kinds.md), as in the demo config
            "source": {"kind": "python", "factory": "betonbuild.demo:gray_tokens", "args": {"n": 40}},
            "fields": {
                "digit": {"type": "gray_image"},
                "photo": {"type": "gray_image", "write_mode": "jpg"},
                "tokens": {"type": "int_list", "dtype": "int16", "max_elements": 13},
                "caption": {"type": "text", "max_bytes": 512},
                "label": {"type": "int"},
            },
            "smoke": {"samples": 4},
        },
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One real build of four datasets (arrays, image folder, python factories), shared by the tests."""
    workdir = tmp_path_factory.mktemp("project")
    make_digits_npz(workdir / "digits.npz")
    make_photo_folder(workdir / "photos")
    (workdir / "wine_adapter.py").write_text(WINE_ADAPTER)
    write_config(workdir, datasets(workdir, workdir / "digits.npz", workdir / "photos"))
    result = run_snakemake(workdir, "all")
    return workdir, result


def report(workdir: Path, ds: str, name: str | None = None) -> dict:
    return json.loads((workdir / "results" / ds / (name or f"{ds}.verify.json")).read_text())


def jobs_in_dry_run(workdir: Path) -> list[tuple[str, str]]:
    """(rule, dataset) of every job a dry run would execute."""
    jobs = plan(run_snakemake(workdir, "-n", "all").stdout)
    return sorted((rule, ds) for ds, rules in jobs.items() for rule, _ in rules)


@contextmanager
def edited(path: Path, edit):
    """The file changed by ``edit(text) -> text`` for the block, then restored."""
    original = path.read_text()
    path.write_text(edit(original))
    try:
        yield
    finally:
        path.write_text(original)


def test_every_dataset_ends_with_a_verified_beton(built):
    workdir, _ = built
    expected = {"digits": 300, "photos": 6, "wine": 60, "gray_tokens": 40}
    for ds, count in expected.items():
        rep = report(workdir, ds)
        assert rep["ok"] is True, rep["worst"]
        assert rep["num_samples"] == {"expected": count, "found": count}
        beton = workdir / "results" / ds / f"{ds}.beton"
        assert rep["file"]["bytes"] == beton.stat().st_size
        assert rep["file"]["sha256"] == hashlib.sha256(beton.read_bytes()).hexdigest()
        assert {c["name"] for c in rep["checks"]} >= {
            "format_version",
            "num_samples",
            "fields",
            "allocations",
            "loader_batch",
            "same_ffcv_build",
        }
        assert all(c["ok"] for c in rep["checks"])
        writer, reader = rep["provenance"]["writer"], rep["provenance"]["reader"]
        assert writer["libffcv_sha256"] == reader["libffcv_sha256"] and len(writer["libffcv_sha256"]) == 64
        assert writer["ffcv_distribution"] == "1.0.2"


def test_fields_are_in_config_order_with_ffcv_type_ids(built):
    workdir, _ = built
    assert report(workdir, "wine")["fields"] == [
        {"name": "x", "type": "ndarray", "type_id": 4},
        {"name": "label", "type": "int", "type_id": 1},
        {"name": "meta", "type": "json", "type_id": 5},
    ]
    assert [f["type_id"] for f in report(workdir, "photos")["fields"]] == [2, 1]


def test_fixed_fields_of_every_sample_were_compared(built):
    workdir, _ = built
    fixed = next(c for c in report(workdir, "digits")["checks"] if c["name"] == "fixed_fields")
    assert fixed["fields"] == {"image": {"compared": 300, "mismatches": 0}, "label": {"compared": 300, "mismatches": 0}}


def test_jpeg_images_are_within_the_stated_tolerance(built):
    workdir, _ = built
    variable = next(c for c in report(workdir, "photos")["checks"] if c["name"] == "variable_fields")
    image = variable["fields"]["image"]
    assert image["jpeg"] == image["compared"] == 6
    assert 0 < image["jpeg_mean_abs_error_max"] <= image["jpeg_tolerance"]


def test_the_beton_holds_the_shuffled_source_rows(built):
    """Read back independently with ffcv's own Reader: row i is source row order[i] of a seeded shuffle."""
    from ffcv.reader import Reader

    workdir, _ = built
    data = np.load(workdir / "digits.npz")
    order = np.random.default_rng(3).permutation(300)
    reader = Reader(str(workdir / "results/digits/digits.beton"))
    assert np.array_equal(reader.metadata["f1"], data["target"][order])


def test_smoke_stage_ran_first_and_was_verified(built):
    workdir, _ = built
    smoke = report(workdir, "digits", "smoke.verify.json")
    assert smoke["ok"] and smoke["stage"] == "smoke" and smoke["num_samples"]["found"] == 16
    inspect = json.loads((workdir / "results/digits/inspect.json").read_text())
    assert inspect["fields"]["image"]["dtypes"] == ["uint8"]
    assert inspect["largest_sample"]["bytes"] == 64  # the 8x8 uint8 payload; the label lives in metadata


def test_second_run_has_nothing_to_do(built):
    workdir, _ = built
    result = run_snakemake(workdir, "all")
    assert "Nothing to be done" in result.stdout + result.stderr


def test_a_corrupted_beton_fails_verification_and_keeps_the_report(tmp_path, digits_npz):
    workdir = tmp_path
    write_config(
        workdir,
        {
            "d": {
                "source": {
                    "kind": "arrays",
                    "path": digits_npz.name,
                    "columns": {"image": "images", "label": "target"},
                },
                "fields": {"image": {"type": "ndarray", "dtype": "uint8", "shape": [8, 8]}, "label": {"type": "int"}},
            }
        },
    )
    run_snakemake(workdir, "all")
    beton = workdir / "results/d/d.beton"
    data = bytearray(beton.read_bytes())
    from betonbuild.beton.format import BetonFile

    first_payload = int(BetonFile(beton).metadata["image"][5])
    data[first_payload] ^= 0xFF
    beton.write_bytes(bytes(data))
    result = run_snakemake(workdir, "all", check=False)
    assert result.returncode != 0
    failed = json.loads((workdir / "results/d/failed/d.verify.json").read_text())
    assert failed["ok"] is False
    assert "field 'image': 1 of 300 samples differ" in failed["worst"]
    assert "first: sample 5" in failed["worst"]
    assert not (workdir / "results/d/d.verify.json").exists()
    assert "field 'image': 1 of 300 samples differ" in result.stdout + result.stderr


def test_the_demo_config_is_valid_and_plans_every_dataset():
    """The repo's own config (the demo `make run` builds) passes validation and plans all six datasets."""
    from betonbuild.config.load import load_config_file

    datasets = load_config_file(REPO / "config/config.yaml").datasets
    assert set(datasets) == {"digits", "photos", "faces", "wine", "photo_shards", "gray_tokens"}
    types = {f.type for spec in datasets.values() for f in spec.fields}
    assert types >= {"ndarray", "int", "rgb_image", "json", "gray_image", "int_list", "text"}


def test_editing_verify_settings_reruns_only_the_verifications(built):
    workdir, _ = built
    with edited(
        workdir / "config.yaml",
        lambda text: text.replace(
            "smoke:\n      samples: 8", "smoke:\n      samples: 8\n    verify:\n      samples: 7"
        ),
    ):
        assert jobs_in_dry_run(workdir) == [("verify", "digits")]  # the report's pictures with it


def test_a_comment_in_the_config_reruns_nothing(built):
    workdir, _ = built
    with edited(workdir / "config.yaml", lambda text: "# a comment a user added\n" + text):
        assert jobs_in_dry_run(workdir) == []
