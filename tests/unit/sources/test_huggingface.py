"""``kind: huggingface``: directories written by ``datasets``' save_to_disk (made here with
``Dataset.from_dict``, an ``Image`` feature of real photo crops), read offline under the same
column rules as Parquet; the DAG lists their files without importing ``datasets``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest
from parquet_samples import IMAGE_FIELDS, hf_image_dataset, jpeg_crops
from PIL import Image

from betonbuild.config.load import load_config
from betonbuild.errors import ConfigError, SampleError, SourceError
from betonbuild.provenance import ffcv_build
from betonbuild.sources import SOURCE_KINDS, input_files, open_source
from betonbuild.sources.huggingface import HuggingFaceSource
from betonbuild.verify import verify_beton
from betonbuild.write.writer import write_beton

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def hf_spec(path, fields=None, name: str = "hf", **source):
    entry = {"source": {"kind": "huggingface", "path": str(path), **source}, "fields": fields or IMAGE_FIELDS}
    return load_config({"datasets": {name: entry}}).datasets[name]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hf") / "photos"
    hf_image_dataset(12).save_to_disk(str(path))
    return path


def test_the_kind_is_registered():
    assert SOURCE_KINDS["huggingface"] is HuggingFaceSource


def test_an_image_feature_is_an_rgb_image_and_its_jpeg_bytes_are_kept(saved):
    source = open_source(hf_spec(saved))
    assert len(source) == 12
    image, label = source[7]
    assert isinstance(image, Image.Image) and image.size == (32, 32) and label == 1
    assert source.encoded_image(7).tobytes() == jpeg_crops(12)[7]


def test_sample_sizes_are_the_jpeg_lengths(saved):
    assert open_source(hf_spec(saved)).sample_sizes().tolist() == [len(j) for j in jpeg_crops(12)]


def test_the_files_tracked_are_the_state_the_info_and_the_arrow_files(saved):
    state = json.loads((saved / "state.json").read_text())
    assert input_files(hf_spec(saved)) == [
        str(saved / "state.json"),
        str(saved / "dataset_info.json"),
        *[str(saved / f["filename"]) for f in state["_data_files"]],
    ]


def test_a_write_and_its_verification_pass(saved, tmp_path):
    spec = hf_spec(saved)
    source = open_source(spec)
    rows = np.arange(len(source))
    write_beton(spec, source, rows, tmp_path / "hf.beton", 2, log=open(os.devnull, "w"))
    assert verify_beton(spec, source, rows, str(tmp_path / "hf.beton"), ffcv_build())["ok"]


def test_the_parquet_export_reads_the_same_values(saved, tmp_path):
    datasets.load_from_disk(str(saved)).to_parquet(str(tmp_path / "photos.parquet"))
    entry = {"source": {"kind": "parquet", "path": str(tmp_path / "photos.parquet")}, "fields": IMAGE_FIELDS}
    from_parquet = open_source(load_config({"datasets": {"pq": entry}}).datasets["pq"])
    from_disk = open_source(hf_spec(saved))
    for i in (0, 11):
        assert from_parquet.encoded_image(i).tobytes() == from_disk.encoded_image(i).tobytes()
        assert from_parquet[i][1] == from_disk[i][1]


def test_a_dataset_dict_needs_a_split(tmp_path):
    ds = hf_image_dataset(4)
    datasets.DatasetDict({"train": ds, "test": ds.select(range(2)).flatten_indices()}).save_to_disk(str(tmp_path / "d"))
    with pytest.raises(SourceError, match=r"saved DatasetDict of splits \['test', 'train'\]: name the one"):
        open_source(hf_spec(tmp_path / "d"))
    assert len(open_source(hf_spec(tmp_path / "d", split="test"))) == 2


def test_sequences_and_array2d_features_are_ndarray_fields(tmp_path):
    features = datasets.Features(
        {
            "vec": datasets.Sequence(datasets.Value("float32"), length=4),
            "grid": datasets.Array2D((2, 3), "int32"),
            "y": datasets.ClassLabel(names=["a", "b", "c"]),
        }
    )
    rows = {
        "vec": [[float(i)] * 4 for i in range(5)],
        "grid": [np.full((2, 3), i, np.int32) for i in range(5)],
        "y": [i % 3 for i in range(5)],
    }
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(tmp_path / "a"))
    fields = {
        "vec": {"type": "ndarray", "dtype": "float32", "shape": [4]},
        "grid": {"type": "ndarray", "dtype": "int32", "shape": [2, 3]},
        "y": {"type": "int"},
    }
    source = open_source(hf_spec(tmp_path / "a", fields))
    vec, grid, y = source[4]
    assert vec.tolist() == [4.0] * 4 and grid.shape == (2, 3) and (grid == 4).all() and y == 1
    assert source.fixed_columns()["grid"][np.array([3, 1])][:, 0, 0].tolist() == [3, 1]


def test_a_missing_feature_lists_the_columns(saved):
    with pytest.raises(SourceError, match=r"field 'caption' reads column 'caption'.*\['image', 'image\.bytes', "):
        open_source(hf_spec(saved, {**IMAGE_FIELDS, "caption": {"type": "json"}}))


def test_a_float_feature_into_an_int_field_is_refused(tmp_path):
    datasets.Dataset.from_dict({"y": [0.5, 1.0]}).save_to_disk(str(tmp_path / "f"))
    with pytest.raises(SourceError, match=r"field 'y' \(int\) reads column 'y' .* holds double"):
        open_source(hf_spec(tmp_path / "f", {"y": {"type": "int"}}))


def test_a_null_is_refused_when_the_source_opens_naming_the_row(tmp_path):
    labels = list(range(30))
    labels[23] = None
    features = datasets.Features({"y": datasets.Value("int64")})
    datasets.Dataset.from_dict({"y": labels}, features=features).save_to_disk(str(tmp_path / "n"))
    with pytest.raises(SampleError) as caught:
        open_source(hf_spec(tmp_path / "n", {"y": {"type": "int"}}))
    assert (caught.value.field, caught.value.index) == ("y", 23)
    assert "record batch 0, row 23 of the file): column 'y' is null in this row" in str(caught.value)


def test_a_directory_that_is_not_a_saved_dataset_is_named(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "state.json").write_text("{}")
    (tmp_path / "x" / "dataset_info.json").write_text("{}")
    with pytest.raises(SourceError, match="is not a readable datasets directory"):
        open_source(hf_spec(tmp_path / "x"))


def test_fingerprints_change_when_the_dataset_is_saved_with_other_rows(tmp_path):
    hf_image_dataset(6).save_to_disk(str(tmp_path / "p"))
    spec = hf_spec(tmp_path / "p")
    before = HuggingFaceSource.open(spec, tmp_path).inputs_fingerprint()
    assert HuggingFaceSource.open(spec, tmp_path).inputs_fingerprint() == before
    ds = hf_image_dataset(6)
    ds.map(lambda row: {"label": 1 - row["label"]}).save_to_disk(str(tmp_path / "q"))
    after = HuggingFaceSource.open(hf_spec(tmp_path / "q"), tmp_path).inputs_fingerprint()
    assert after["sha256"] != before["sha256"]


@pytest.mark.parametrize("writer", [{"shuffle": True}, {"indices": [0]}])
def test_shuffle_and_indices_are_refused(writer):
    entry = {"source": {"kind": "huggingface", "path": "d"}, "fields": IMAGE_FIELDS, "writer": writer}
    with pytest.raises(ConfigError, match="written in row order"):
        load_config({"datasets": {"hf": entry}})


def test_the_dag_lists_the_files_without_importing_datasets_or_pyarrow(saved):
    code = (
        "import sys, json\n"
        "from betonbuild.config.load import load_config\n"
        "from betonbuild.sources import input_files, missing_package\n"
        f"entry = {{'source': {{'kind': 'huggingface', 'path': {str(saved)!r}}}, 'fields': {IMAGE_FIELDS!r}}}\n"
        "pq = {'source': {'kind': 'parquet', 'path': 'x.parquet'}, 'fields': {'x': {'type': 'int'}}}\n"
        "config = load_config({'datasets': {'hf': entry, 'pq': pq}})\n"
        "files = input_files(config.datasets['hf']) + input_files(config.datasets['pq'])\n"
        "assert not missing_package(config.datasets['hf']) and not missing_package(config.datasets['pq'])\n"
        "print(json.dumps([len(files), sorted(m for m in ('datasets', 'pyarrow') if m in sys.modules)]))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(result.stdout) == [4, []]
