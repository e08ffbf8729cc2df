"""The source-kind registry and interface (betonbuild.sources, betonbuild.sources.base): every kind
implements the interface, the registry finds it, and the questions the workflow asks a kind from
the config alone (shard list, inputs, resource estimates) have the answers the .smk files had."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from wds_samples import photo_samples, wds_spec, write_shard

from betonbuild.config.load import load_config
from betonbuild.config.spec import DatasetSpec
from betonbuild.fields import field_kind
from betonbuild.sources import (
    SOURCE_KINDS,
    ArraysSource,
    HuggingFaceSource,
    ImageFolderSource,
    IterableSource,
    ParquetSource,
    PythonSource,
    WebDatasetSource,
    gathers_fixed_values_one_by_one,
    input_files,
    missing_package,
    needs_shard_list,
    open_source,
    shard_files,
    source_class,
)
from betonbuild.sources.base import Source

DIGIT_FIELDS = {"image": {"type": "ndarray", "dtype": "uint8", "shape": [8, 8]}, "label": {"type": "int"}}
FOLDER_FIELDS = {"image": {"type": "rgb_image"}, "label": {"type": "int"}}
CLASS_MEMBERS = ("check_config", "input_files", "adapter_references", "open", "shard_files", "missing_package")
ESTIMATES = ("estimated_length", "resident_bytes")
INSTANCE_MEMBERS = (
    "__len__",
    "__getitem__",
    "sample_sizes",
    "fixed_columns",
    "encoded_image",
    "shard_counts",
    "work_items",
    "inputs_fingerprint",
    "part_fingerprint",
    "smoke_fingerprint",
)
FLAGS = ("may_import_ffcv", "needs_shard_list", "gives_fixed_columns", "fingerprint_from_parts", "one_pass")


def make_spec(source: dict, fields: dict, name: str = "ds", **entry) -> DatasetSpec:
    return load_config({"datasets": {name: {"source": source, "fields": fields, **entry}}}).datasets[name]


def arrays_npz(tmp_path: Path, n: int = 30) -> DatasetSpec:
    path = tmp_path / "d.npz"
    np.savez(path, images=np.zeros((n, 8, 8), np.uint8), target=np.arange(n, dtype=np.int64))
    return make_spec(
        {"kind": "arrays", "path": str(path), "columns": {"image": "images", "label": "target"}}, DIGIT_FIELDS
    )


def arrays_npy(tmp_path: Path, n: int = 20) -> DatasetSpec:
    np.save(tmp_path / "x.npy", np.zeros((n, 8, 8), np.uint8))
    np.save(tmp_path / "y.npy", np.arange(n, dtype=np.int32))
    columns = {"image": str(tmp_path / "x.npy"), "label": str(tmp_path / "y.npy")}
    return make_spec({"kind": "arrays", "columns": columns}, DIGIT_FIELDS)


def folder_spec(root: Path) -> DatasetSpec:
    return make_spec({"kind": "image_folder", "root": str(root)}, FOLDER_FIELDS)


def python_spec(factory: str = "bb_kinds_module:make") -> DatasetSpec:
    return make_spec({"kind": "python", "factory": factory}, {"value": {"type": "int"}})


# --- the registry and the interface --------------------------------------------------------------


def test_the_registry_holds_every_kind_by_its_config_name():
    assert SOURCE_KINDS == {
        "arrays": ArraysSource,
        "image_folder": ImageFolderSource,
        "iterable": IterableSource,
        "python": PythonSource,
        "webdataset": WebDatasetSource,
        "parquet": ParquetSource,
        "huggingface": HuggingFaceSource,
    }
    assert all(cls.kind == name for name, cls in SOURCE_KINDS.items())


@pytest.mark.parametrize("kind", sorted(SOURCE_KINDS))
def test_every_kind_implements_the_interface(kind):
    cls = SOURCE_KINDS[kind]
    assert issubclass(cls, Source)
    for flag in FLAGS:
        assert isinstance(getattr(cls, flag), bool), flag
    for name in CLASS_MEMBERS + ESTIMATES:
        assert callable(getattr(cls, name)), name
    for name in INSTANCE_MEMBERS:
        assert callable(getattr(cls, name)), name
    assert cls.__len__ is not Source.__len__ and cls.__getitem__ is not Source.__getitem__


def test_the_kinds_flags():
    assert {k: c.may_import_ffcv for k, c in SOURCE_KINDS.items()} == {
        "arrays": False,
        "image_folder": False,
        "iterable": True,
        "python": True,
        "webdataset": False,
        "parquet": False,
        "huggingface": False,
    }
    assert [k for k, c in SOURCE_KINDS.items() if c.needs_shard_list] == ["webdataset"]
    assert [k for k, c in SOURCE_KINDS.items() if c.one_pass] == ["iterable"]
    assert sorted(k for k, c in SOURCE_KINDS.items() if c.gives_fixed_columns) == [
        "arrays",
        "huggingface",
        "image_folder",
        "parquet",
    ]
    assert [k for k, c in SOURCE_KINDS.items() if c.fingerprint_from_parts] == ["arrays"]


def test_source_class_of_each_kind(tmp_path, photo_folder):
    specs = {
        "arrays": arrays_npz(tmp_path),
        "image_folder": folder_spec(photo_folder),
        "iterable": make_spec({"kind": "iterable", "factory": "m:f"}, {"value": {"type": "int"}}),
        "python": python_spec(),
        "webdataset": wds_spec("x.tar"),
        "parquet": make_spec({"kind": "parquet", "path": "x.parquet"}, {"x": {"type": "int"}}),
        "huggingface": make_spec({"kind": "huggingface", "path": "hf"}, {"x": {"type": "int"}}),
    }
    assert {kind: source_class(spec) for kind, spec in specs.items()} == SOURCE_KINDS


def test_open_source_opens_the_kinds_class(tmp_path, photo_folder):
    assert type(open_source(arrays_npz(tmp_path))) is ArraysSource
    assert type(open_source(folder_spec(photo_folder), tmp_path)) is ImageFolderSource


def test_a_webdataset_source_is_opened_from_its_shard_list(tmp_path, monkeypatch):
    pytest.importorskip("webdataset")
    monkeypatch.chdir(tmp_path)
    write_shard(tmp_path / "s/p-0.tar", photo_samples()[:3])
    spec = wds_spec("s/p-0.tar")
    with pytest.raises(ValueError, match="give dataset_dir"):
        open_source(spec)
    from betonbuild.sources.shards import shard_list

    (tmp_path / "r").mkdir()
    (tmp_path / "r/shards.json").write_text(json.dumps(shard_list(spec, "cache.json")))
    source = open_source(spec, tmp_path / "r")
    assert type(source) is WebDatasetSource and len(source) == 3
    assert source.shard_counts() == [3]
    plan = source.work_items(np.array([2, 0]))  # a WorkPlan of numpy arrays, no list of tuples per sample
    assert [(list(d), s.tolist()) for d, s in (plan.item(k) for k in range(plan.num_items))] == [([0, 1], [2, 0])]


def test_kinds_without_shards_have_no_shard_counts_or_work_items(tmp_path):
    source = open_source(arrays_npz(tmp_path))
    assert source.shard_counts() is None and source.work_items(np.arange(3)) is None


# --- what the workflow asks of a kind (rules/common.smk, rules/resources.smk) --------------------


def test_only_a_webdataset_source_needs_a_shard_list(tmp_path, photo_folder):
    assert needs_shard_list(wds_spec("x.tar"))
    assert not any(needs_shard_list(s) for s in (arrays_npz(tmp_path), folder_spec(photo_folder), python_spec()))


def test_shard_files_are_the_expanded_shards_of_a_webdataset_source(tmp_path, monkeypatch):
    pytest.importorskip("webdataset")
    monkeypatch.chdir(tmp_path)
    for i in range(3):
        (tmp_path / f"p-{i}.tar").write_bytes(b"")
    assert shard_files(wds_spec("p-{0..2}.tar")) == ["p-0.tar", "p-1.tar", "p-2.tar"]
    assert shard_files(wds_spec("p-*.tar")) == ["p-0.tar", "p-1.tar", "p-2.tar"]
    assert shard_files(arrays_npz(tmp_path)) == []


def test_without_webdataset_there_are_no_shard_files_and_the_package_is_missing(tmp_path, monkeypatch):
    import betonbuild.sources.webdataset as wds_source

    monkeypatch.setattr(wds_source, "webdataset_installed", lambda: False)
    spec = wds_spec("p-{0..2}.tar")
    assert shard_files(spec) == [] and missing_package(spec)
    assert not missing_package(arrays_npz(tmp_path)) and not missing_package(python_spec())


def test_the_webdataset_package_counts_as_missing_only_when_it_is(monkeypatch):
    pytest.importorskip("webdataset")
    assert not missing_package(wds_spec("x.tar"))


def test_verification_gathers_fixed_values_one_by_one_unless_the_kind_gives_columns(tmp_path, photo_folder):
    assert not gathers_fixed_values_one_by_one(arrays_npz(tmp_path))
    assert not gathers_fixed_values_one_by_one(folder_spec(photo_folder))
    assert gathers_fixed_values_one_by_one(python_spec())
    assert gathers_fixed_values_one_by_one(wds_spec("x.tar"))


def test_fixed_columns_cover_every_fixed_size_field_where_the_kind_says_so(tmp_path, photo_folder):
    for spec in (arrays_npz(tmp_path), folder_spec(photo_folder)):
        source = open_source(spec)
        fixed = [f.name for f in spec.fields if field_kind(f).fixed_size]
        assert source.gives_fixed_columns and sorted(source.fixed_columns()) == sorted(fixed)


def test_input_files_of_a_webdataset_source_are_only_its_adapter_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "bb_kinds_pipeline.py").write_text("def pipe(dataset):\n    return dataset\n")
    assert input_files(wds_spec("x.tar")) == []  # the shards are inputs of the shard list
    assert input_files(wds_spec("x.tar", pipeline="bb_kinds_pipeline:pipe", keys=None)) == ["bb_kinds_pipeline.py"]
    sys.modules.pop("bb_kinds_pipeline", None)


# --- resource estimates from the config alone --------------------------------------------------


def test_estimated_length_of_arrays_is_the_first_arrays_header_length(tmp_path):
    assert ArraysSource.estimated_length(arrays_npz(tmp_path, n=30)) == 30
    npy = arrays_npy(tmp_path, n=20)
    assert ArraysSource.estimated_length(npy) == 20
    Path(npy.source["columns"]["image"]).unlink()
    assert ArraysSource.estimated_length(npy) is None  # a missing file: unknown, not an error


def test_estimated_length_of_a_zero_dimensional_array_is_unknown(tmp_path):
    np.save(tmp_path / "x.npy", np.array(3, dtype=np.int64))
    spec = make_spec({"kind": "arrays", "columns": {"v": str(tmp_path / "x.npy")}}, {"v": {"type": "int"}})
    assert ArraysSource.estimated_length(spec) is None


def test_estimated_length_of_an_image_folder_is_its_number_of_images(photo_folder, tmp_path):
    assert ImageFolderSource.estimated_length(folder_spec(photo_folder)) == 6
    assert ImageFolderSource.estimated_length(folder_spec(tmp_path / "missing")) is None  # the file_list job says why


def test_estimated_length_of_python_and_webdataset_sources_is_unknown():
    assert PythonSource.estimated_length(python_spec()) is None
    assert WebDatasetSource.estimated_length(wds_spec("x.tar")) is None


def test_resident_bytes_of_an_npz_source_are_its_arrays_bytes(tmp_path):
    spec = arrays_npz(tmp_path, n=30)
    assert ArraysSource.resident_bytes(spec) == 30 * 64 + 30 * 8
    assert ArraysSource.resident_bytes(arrays_npy(tmp_path)) == 0  # .npy columns are memory-mapped


def test_resident_bytes_and_length_of_a_missing_npz_are_unknown(tmp_path):
    spec = arrays_npz(tmp_path)
    Path(spec.source["path"]).unlink()
    assert ArraysSource.resident_bytes(spec) == 0 and ArraysSource.estimated_length(spec) is None


def test_resident_bytes_of_the_other_kinds_are_zero(photo_folder):
    assert ImageFolderSource.resident_bytes(folder_spec(photo_folder)) == 0
    assert PythonSource.resident_bytes(python_spec()) == 0
    assert WebDatasetSource.resident_bytes(wds_spec("x.tar")) == 0


def test_array_headers_read_an_npz_without_loading_it(tmp_path):
    from betonbuild.sources.arrays import array_headers

    np.savez(tmp_path / "a.npz", x=np.zeros((5, 2, 3), np.float32), y=np.arange(5, dtype=np.int16))
    assert array_headers(str(tmp_path / "a.npz")) == {
        "x": ((5, 2, 3), np.dtype("float32")),
        "y": ((5,), np.dtype("int16")),
    }
    np.save(tmp_path / "b.npy", np.zeros((4, 7), np.uint8))
    assert array_headers(str(tmp_path / "b.npy")) == {"": ((4, 7), np.dtype("uint8"))}
