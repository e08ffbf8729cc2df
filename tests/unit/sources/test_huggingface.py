"""``kind: huggingface``: directories written by ``datasets``' save_to_disk (made here with
``Dataset.from_dict``, an ``Image`` feature of real photo crops), read offline under the same
column rules as Parquet; the DAG lists their files without importing ``datasets``."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
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
    assert label == 1 and source.encoded_image(7).tobytes() == jpeg_crops(12)[7]
    with Image.open(io.BytesIO(jpeg_crops(12)[7])) as expected:  # PIL's pixels, decoded by PIL or directly
        assert np.array_equal(np.asarray(image), np.asarray(expected.convert("RGB"))) and expected.size == (32, 32)


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


def _kinds_dataset(n: int = 9):
    """Image, Sequence, Array2D and ClassLabel features, shuffled and cut (an indices mapping)."""
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "vec": datasets.Sequence(datasets.Value("float32"), length=4),
            "grid": datasets.Array2D((2, 3), "int32"),
            "y": datasets.ClassLabel(names=["a", "b", "c"]),
        }
    )
    rows = {
        "image": [{"bytes": b, "path": None} for b in jpeg_crops(n)],
        "vec": [[float(i), -1.0, 0.5, float(i * i)] for i in range(n)],
        "grid": [np.arange(6, dtype=np.int32).reshape(2, 3) * i for i in range(n)],
        "y": [i % 3 for i in range(n)],
    }
    return datasets.Dataset.from_dict(rows, features=features).shuffle(seed=3).select(range(n - 2))


def _storage(array):
    return array.storage if isinstance(array, pa.ExtensionArray) else array


KINDS_FIELDS = {
    "image": {"type": "rgb_image"},
    "vec": {"type": "ndarray", "dtype": "float32", "shape": [4]},
    "grid": {"type": "ndarray", "dtype": "int32", "shape": [2, 3]},
    "y": {"type": "int"},
}


def test_the_arrow_files_read_directly_are_what_load_from_disk_gives(tmp_path):
    """The write and verify jobs read the record batches with pyarrow, not datasets: the same
    batches, column values and rows as load_from_disk, over several files and a saved shuffle."""
    _kinds_dataset().save_to_disk(str(tmp_path / "k"), num_shards=3)
    source = open_source(hf_spec(tmp_path / "k", KINDS_FIELDS))
    loaded = datasets.load_from_disk(str(tmp_path / "k"))
    table = loaded.data.table
    assert len(source.files) == 5 and len(source) == len(loaded) == 7
    assert [b.num_rows for b in source.batches] == [b.num_rows for b in table.to_batches()]
    for name in table.column_names:
        theirs = table.column(name).combine_chunks()
        ours = pa.concat_arrays([b.column(name) for b in source.batches])
        assert _storage(ours).equals(_storage(theirs)), name
    raw = loaded.cast_column("image", datasets.Image(decode=False))
    for i in range(len(loaded)):
        image, vec, grid, y = source[i]
        row = raw[i]
        assert source.encoded_image(i).tobytes() == row["image"]["bytes"]
        assert np.asarray(image).tolist() == np.asarray(loaded[i]["image"]).tolist()
        assert vec.tolist() == row["vec"] and grid.tolist() == row["grid"] and y == row["y"]
    assert source.inputs_fingerprint()["sha256"]  # the manifest's check with datasets passes
    code = (  # and in a process without datasets (its Array2D extension type not registered)
        "import sys, json, hashlib\n"
        "from betonbuild.config.load import load_config\n"
        "from betonbuild.sources import open_source\n"
        f"entry = {{'source': {{'kind': 'huggingface', 'path': {str(tmp_path / 'k')!r}}}, "
        f"'fields': {KINDS_FIELDS!r}}}\n"
        "source = open_source(load_config({'datasets': {'hf': entry}}).datasets['hf'])\n"
        "rows = [[hashlib.sha256(source.encoded_image(i)).hexdigest(), *[v.tolist() for v in source[i][1:3]],\n"
        "         int(source[i][3])] for i in range(len(source))]\n"
        "print(json.dumps(['datasets' in sys.modules, rows]))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    want = [[hashlib.sha256(r["image"]["bytes"]).hexdigest(), r["vec"], r["grid"], r["y"]] for r in raw]
    assert json.loads(result.stdout) == [False, want]


def test_the_write_and_verify_read_without_importing_datasets(saved, tmp_path):
    code = (
        "import sys, json, os\n"
        "from betonbuild.config.load import load_config\n"
        "from betonbuild.provenance import ffcv_build\n"
        "from betonbuild.sources import open_source\n"
        "from betonbuild.verify import verify_beton\n"
        "from betonbuild.write.writer import write_beton\n"
        "import numpy as np\n"
        f"entry = {{'source': {{'kind': 'huggingface', 'path': {str(saved)!r}}}, 'fields': {IMAGE_FIELDS!r}}}\n"
        "spec = load_config({'datasets': {'hf': entry}}).datasets['hf']\n"
        "source = open_source(spec)\n"
        "rows = np.arange(len(source))\n"
        f"out = {str(tmp_path / 'hf.beton')!r}\n"
        "write_beton(spec, source, rows, out, 2, log=open(os.devnull, 'w'))\n"
        "ok = verify_beton(spec, source, rows, out, ffcv_build())['ok']\n"
        "before = 'datasets' in sys.modules\n"
        "source.inputs_fingerprint()\n"
        "print(json.dumps([ok, before, 'datasets' in sys.modules]))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(result.stdout.splitlines()[-1]) == [True, False, True]  # only the manifest imports it


def test_a_column_that_datasets_would_cast_is_refused_by_the_manifest(tmp_path):
    """load_from_disk casts a dictionary-encoded column to its feature's type; the direct read
    would not, so the manifest job (which asks datasets) refuses the directory."""
    datasets.Dataset.from_dict({"y": [1, 2, 1]}).save_to_disk(str(tmp_path / "c"))
    path = next((tmp_path / "c").glob("*.arrow"))
    metadata = pa.ipc.open_stream(pa.memory_map(str(path))).schema.metadata
    table = pa.table({"y": pa.array([1, 2, 1]).dictionary_encode()}).replace_schema_metadata(metadata)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    assert datasets.load_from_disk(str(tmp_path / "c"))["y"][:] == [1, 2, 1]  # datasets decodes it
    source = open_source(hf_spec(tmp_path / "c", {"y": {"type": "json"}}))
    with pytest.raises(SourceError, match=r"datasets reads the columns \[\('y', DataType\(int64\)\)\] .*dictionary"):
        source.inputs_fingerprint()
