"""``betonbuild init --from PATH``: the first dataset guessed from real files, and the config it writes loads."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import make_digits_npz, make_photo_folder

from betonbuild.cli import main
from betonbuild.config.load import load_config, load_config_file
from betonbuild.errors import BetonbuildError
from betonbuild.project.guess import guess
from betonbuild.project.starter import write_project


def loaded(project: Path, entry: str):
    """The dataset's spec from the config init writes (schema and every kind's checks applied)."""
    write_project(project, entry)
    return load_config_file(project / "config.yaml").datasets


def test_npz_columns_become_fields_by_dtype_and_shape(tmp_path):
    (tmp_path / "project").mkdir()
    npz = make_digits_npz(tmp_path / "project" / "digits.npz", n=50)
    found = guess(npz, tmp_path / "project")
    assert found.name == "digits"
    assert found.source == {"kind": "arrays", "path": "digits.npz", "columns": {"images": "images", "target": "target"}}
    assert found.fields == {"images": {"type": "ndarray", "dtype": "uint8", "shape": [8, 8]}, "target": {"type": "int"}}
    assert any("rows of shape (8, 8)" in note for note in found.notes)
    spec = loaded(tmp_path / "project", found.entry())["digits"]
    assert spec.field_names == ["images", "target"]


def test_npy_folder_outside_the_project_is_named_by_absolute_path(tmp_path):
    folder = tmp_path / "arrays"
    folder.mkdir()
    np.save(folder / "x.npy", np.zeros((10, 3), dtype=np.float32))
    np.save(folder / "y.npy", np.arange(10.0))
    found = guess(folder, tmp_path / "project")
    assert found.source["columns"] == {"x": str(folder / "x.npy"), "y": str(folder / "y.npy")}
    assert found.fields["y"] == {"type": "float"}
    assert loaded(tmp_path / "project", found.entry())["arrays"].field_names == ["x", "y"]


def test_arrays_of_different_lengths_are_flagged(tmp_path):
    folder = tmp_path / "arrays"
    folder.mkdir()
    np.save(folder / "a.npy", np.zeros(10, dtype=np.int64))
    np.save(folder / "b.npy", np.zeros(9, dtype=np.int64))
    assert any(note.startswith("CHECK: the arrays differ in length") for note in guess(folder, tmp_path).notes)


def test_image_folder_classes_modes_and_conversion(tmp_path):
    root = make_photo_folder(tmp_path / "project" / "photos", per_class=2)
    from PIL import Image

    Image.new("L", (20, 10)).save(root / "coffee" / "grey.png")
    found = guess(root, tmp_path / "project")
    assert found.source == {"kind": "image_folder", "root": "photos"}
    assert found.fields["image"]["image_mode"] == "convert" and found.fields["label"] == {"type": "int"}
    assert "2 classes (astronaut, coffee)" in found.notes[0]
    assert loaded(tmp_path / "project", found.entry())["photos"].source["kind"] == "image_folder"


def _shard(path: Path, samples: int) -> None:
    with tarfile.open(path, "w") as tar:
        for i in range(samples):
            for ext, data in (("jpg", b"\xff\xd8fake"), ("cls", b"1"), ("json", b"{}"), ("txt", b"hi")):
                info = tarfile.TarInfo(f"{i:06d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def test_tar_shards_members_map_to_fields_and_the_rest_is_named(tmp_path):
    shards = tmp_path / "project" / "wds"
    shards.mkdir(parents=True)
    for k in range(2):
        _shard(shards / f"train-{k:04d}.tar", 3)
    found = guess(shards, tmp_path / "project")
    assert found.source == {
        "kind": "webdataset",
        "shards": "wds/*.tar",
        "keys": {"image": "jpg", "label": "cls", "meta": "json"},
    }
    assert list(found.fields) == ["image", "label", "meta"]
    assert any("['txt']" in note for note in found.notes)
    assert loaded(tmp_path / "project", found.entry())["wds"].source["kind"] == "webdataset"


def test_parquet_columns_by_arrow_type(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "table.parquet"
    pq.write_table(pa.table({"label": [1, 2], "score": [0.5, 1.5], "text": ["a", "b"], "vec": [[1], [2]]}), path)
    found = guess(path, tmp_path / "project")
    assert found.source == {"kind": "parquet", "path": str(path)}
    assert found.fields == {
        "label": {"type": "int"},
        "score": {"type": "float"},
        "text": {"type": "bytes"},
        "vec": {"type": "json"},
    }


def test_huggingface_save_to_disk_features(tmp_path):
    import datasets

    features = datasets.Features({"label": datasets.ClassLabel(names=["a", "b"]), "x": datasets.Value("float32")})
    datasets.Dataset.from_dict({"label": [0, 1], "x": [0.1, 0.2]}, features=features).save_to_disk(tmp_path / "hf")
    found = guess(tmp_path / "hf", tmp_path / "project")
    assert found.source == {"kind": "huggingface", "path": str(tmp_path / "hf")}
    assert found.fields == {"label": {"type": "int"}, "x": {"type": "float"}}


def test_unknown_content_and_missing_path_say_what_was_looked_for(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(BetonbuildError, match="cannot tell what this is .*image folder"):
        guess(tmp_path / "notes.txt", tmp_path)
    with pytest.raises(BetonbuildError, match="no such file"):
        guess(tmp_path / "absent", tmp_path)


def test_init_writes_a_config_that_loads_and_refuses_to_overwrite(tmp_path, capsys):
    assert main(["init", str(tmp_path / "p")]) == 0
    config = yaml.safe_load((tmp_path / "p" / "config.yaml").read_text())
    assert list(config["datasets"]) == ["squares"]  # the examples of every other kind are comments
    assert load_config(config).datasets["squares"].source["factory"] == "mydatasets:squares"
    text = (tmp_path / "p" / "config.yaml").read_text()
    for kind in ("arrays", "image_folder", "webdataset", "python", "parquet", "huggingface"):
        assert f"#     kind: {kind}" in text
    assert main(["init", str(tmp_path / "p")]) == 1
    assert "already has config.yaml, mydatasets.py, README.md" in capsys.readouterr().err


def test_init_from_prints_the_guess(tmp_path, capsys):
    npz = make_digits_npz(tmp_path / "digits.npz", n=20)
    assert main(["init", str(tmp_path / "p"), "--from", str(npz)]) == 0
    out = capsys.readouterr().out
    assert "dataset 'digits' from" in out and "images: uint8 rows of shape (8, 8) -> ndarray" in out
    assert "# guessed from 2 NumPy array(s) of [20] rows:" in (tmp_path / "p" / "config.yaml").read_text()
