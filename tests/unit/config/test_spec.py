"""Unit tests of betonbuild.config.spec: config validation, defaults, index selection and smoke positions."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from betonbuild.config.load import check_no_duplicate_keys, load_config, load_config_file, parse_size, spec_from_dict
from betonbuild.config.spec import DatasetSpec, WriterSpec, resolve_indices, smoke_positions
from betonbuild.errors import ConfigError
from betonbuild.fields import field_kind

PYTHON_SOURCE = {"kind": "python", "factory": "adapters.tables:wine"}


def raw_config(name: str = "photos", fields=None, source=None, **entry) -> dict:
    """A minimal valid config with one dataset; keyword arguments are extra dataset keys."""
    dataset = {
        "source": copy.deepcopy(source) if source is not None else dict(PYTHON_SOURCE),
        "fields": copy.deepcopy(fields) if fields is not None else {"label": {"type": "int"}},
    }
    dataset.update(copy.deepcopy(entry))
    return {"datasets": {name: dataset}}


def spec_of(name: str = "photos", **kwargs) -> DatasetSpec:
    return load_config(raw_config(name, **kwargs)).datasets[name]


def config_error(**kwargs) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        spec_of(**kwargs)
    return info.value


def writer(**overrides) -> WriterSpec:
    values = dict(num_workers=1, page_size=1 << 23, chunksize=100, indices=None, shuffle=False, seed=0)
    values.update(overrides)
    return WriterSpec(**values)


# --- field names ---------------------------------------------------------------------------------


def test_field_name_longer_than_16_bytes_is_rejected_with_its_byte_count():
    error = config_error(fields={"a_very_long_field_name": {"type": "int"}})
    assert str(error) == "datasets.photos.fields: name 'a_very_long_field_name' is 22 bytes; ffcv stores at most 16"
    assert error.where == "datasets.photos.fields"


def test_field_name_of_exactly_16_bytes_is_accepted():
    spec = spec_of(fields={"sixteen_bytes_ok": {"type": "int"}})
    assert spec.field_names == ["sixteen_bytes_ok"]


def test_two_long_names_that_ffcv_would_collapse_are_rejected_before_they_collide():
    # ffcv truncates both to 'embedding_vector' and silently keeps one field.
    error = config_error(fields={"embedding_vector_a": {"type": "int"}, "embedding_vector_b": {"type": "int"}})
    assert "'embedding_vector_a' is 18 bytes; ffcv stores at most 16" in str(error)


def test_non_ascii_field_name_is_rejected():
    error = config_error(fields={"größe": {"type": "float"}})
    assert str(error) == "datasets.photos.fields: name 'größe' is not ASCII; ffcv stores field names as ASCII"


def test_empty_field_name_is_rejected():
    error = config_error(fields={"": {"type": "int"}})
    assert str(error) == "datasets.photos.fields: name '' must be non-empty and contain no NUL byte"


def test_field_order_is_the_config_order():
    spec = spec_of(fields={"z": {"type": "int"}, "a": {"type": "float"}, "m": {"type": "bytes"}})
    assert spec.field_names == ["z", "a", "m"]
    assert [f.type for f in spec.fields] == ["int", "float", "bytes"]


# --- duplicate keys in YAML ----------------------------------------------------------------------

DUPLICATE_FIELD_YAML = """\
datasets:
  photos:
    source:
      kind: python
      factory: adapters.tables:wine
    fields:
      label:
        type: int
      image:
        type: bytes
      label:
        type: float
"""


def test_duplicate_field_key_in_yaml_is_an_error_naming_both_lines(tmp_path: Path):
    path = tmp_path / "config.yaml"
    path.write_text(DUPLICATE_FIELD_YAML)
    with pytest.raises(ConfigError) as info:
        check_no_duplicate_keys(path)
    assert info.value.where == f"{path}:11"
    assert str(info.value) == (
        f"{path}:11: key 'label' appears twice in one mapping (first on line 7); "
        "YAML would silently keep only the last one"
    )


def test_load_config_file_refuses_duplicate_keys(tmp_path: Path):
    path = tmp_path / "config.yaml"
    path.write_text(DUPLICATE_FIELD_YAML)
    with pytest.raises(ConfigError, match="key 'label' appears twice"):
        load_config_file(path)


def test_duplicate_dataset_name_in_yaml_is_an_error(tmp_path: Path):
    path = tmp_path / "config.yaml"
    path.write_text(
        "datasets:\n"
        "  a:\n    source: {kind: python, factory: 'm:f'}\n    fields: {x: {type: int}}\n"
        "  a:\n    source: {kind: python, factory: 'm:g'}\n    fields: {x: {type: int}}\n"
    )
    with pytest.raises(ConfigError) as info:
        check_no_duplicate_keys(path)
    assert info.value.where == f"{path}:5"
    assert "key 'a' appears twice in one mapping (first on line 2)" in str(info.value)


def test_same_key_in_different_mappings_is_not_a_duplicate(tmp_path: Path):
    path = tmp_path / "config.yaml"
    path.write_text(
        "datasets:\n"
        "  a:\n    source: {kind: python, factory: 'm:f'}\n    fields: {label: {type: int}}\n"
        "  b:\n    source: {kind: python, factory: 'm:f'}\n    fields: {label: {type: int}}\n"
    )
    check_no_duplicate_keys(path)
    config = load_config_file(path)
    assert sorted(config.datasets) == ["a", "b"]
    assert config.datasets["b"].field_names == ["label"]


def test_load_config_file_of_an_empty_file_is_a_config_error(tmp_path: Path):
    path = tmp_path / "config.yaml"
    path.write_text("")
    with pytest.raises(ConfigError) as info:
        load_config_file(path)
    assert str(info.value) == "config: 'datasets' is a required property"


MERGE_KEY_YAML = """\
datasets:
  a:
    source: {kind: python, factory: 'm:f'}
    fields: {x: {type: int}}
    writer: &shared
      page_size: 4MiB
      chunksize: 50
  b:
    source: {kind: python, factory: 'm:g'}
    fields: {x: {type: int}}
    writer:
      <<: *shared
      chunksize: 10
"""


def test_yaml_merge_key_is_understood_by_plain_yaml(tmp_path: Path):
    import yaml

    config = load_config(yaml.safe_load(MERGE_KEY_YAML))
    assert config.datasets["b"].writer.page_size == 4 << 20
    assert config.datasets["b"].writer.chunksize == 10


def test_yaml_merge_key_is_not_a_duplicate_and_loads(tmp_path: Path):
    path = tmp_path / "config.yaml"
    path.write_text(MERGE_KEY_YAML)
    check_no_duplicate_keys(path)
    config = load_config_file(path)
    assert config.datasets["b"].writer.page_size == 4 << 20
    assert config.datasets["b"].writer.chunksize == 10


# --- page size -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "page_size, nbytes",
    [
        (3_000_000, 3_000_000),  # not a power of two
        (6 << 20, 6 << 20),  # not a power of two either, though a whole number of MiB
        ("1MiB", 1 << 20),  # below 2 MiB
        (1 << 20, 1 << 20),
        (0, 0),
        ("4GiB", 1 << 32),  # the header stores page_size as <u4
        (1 << 33, 1 << 33),
    ],
)
def test_bad_page_size_is_rejected(page_size, nbytes):
    error = config_error(writer={"page_size": page_size})
    assert error.where == "datasets.photos.writer.page_size"
    assert str(error) == (
        f"datasets.photos.writer.page_size: {page_size!r} ({nbytes} bytes) must be a power of two in [2MiB, 4GiB)"
    )


@pytest.mark.parametrize("text", ["eight", "8 megabytes", "8mib", "8.5MiB", "-8MiB", ""])
def test_unparsable_page_size_string_is_rejected(text):
    error = config_error(writer={"page_size": text})
    assert str(error) == (
        f"datasets.photos.writer.page_size: cannot read size {text!r}; write bytes or e.g. '8MiB', '1GiB'"
    )


@pytest.mark.parametrize(
    "page_size, expected",
    [
        ("8MiB", 8388608),
        ("2MiB", 1 << 21),
        (" 16 MiB ", 1 << 24),
        ("2GiB", 1 << 31),
        (1 << 22, 1 << 22),
        ("4194304", 1 << 22),
        ("4194304B", 1 << 22),
        ("2048KiB", 1 << 21),
    ],
)
def test_valid_page_sizes_are_parsed_to_bytes(page_size, expected):
    assert spec_of(writer={"page_size": page_size}).writer.page_size == expected


def test_parse_size_reads_units_and_names_the_key_on_error():
    assert parse_size("8MiB", "w") == 8 * 1024 * 1024
    assert parse_size("1GiB", "w") == 1 << 30
    assert parse_size(123, "w") == 123
    with pytest.raises(ConfigError) as info:
        parse_size("8 TB", "datasets.x.writer.page_size")
    assert info.value.where == "datasets.x.writer.page_size"


# --- other writer controls -----------------------------------------------------------------------


@pytest.mark.parametrize("chunksize", [0, -3])
def test_chunksize_must_be_positive(chunksize):
    error = config_error(writer={"chunksize": chunksize})
    assert error.where == "datasets.photos.writer.chunksize"
    assert str(error) == f"datasets.photos.writer.chunksize: {chunksize} is less than the minimum of 1"


def test_zero_workers_is_rejected_with_the_alternatives():
    error = config_error(writer={"num_workers": 0})
    assert str(error) == (
        "datasets.photos.writer.num_workers: 0 is not a worker count; use -1 (all CPUs) or a positive number"
    )


def test_num_workers_below_minus_one_is_rejected():
    error = config_error(writer={"num_workers": -2})
    assert error.where == "datasets.photos.writer.num_workers"


def test_num_workers_minus_one_and_positive_are_accepted():
    assert spec_of(writer={"num_workers": -1}).writer.num_workers == -1
    assert spec_of(writer={"num_workers": 3}).writer.num_workers == 3


def test_unknown_writer_key_is_rejected():
    error = config_error(writer={"num_threads": 4})
    assert error.where == "datasets.photos.writer"
    assert "num_threads" in str(error)


@pytest.mark.parametrize("indices", ["a:b", "1-5", "1:2:3:4", "1:2:-1"])
def test_indices_string_must_be_a_range(indices):
    error = config_error(writer={"indices": indices})
    assert str(error) == f"datasets.photos.writer.indices: {indices!r} is not a range 'start:stop[:step]'"


def test_indices_range_with_step_zero_is_a_config_error():
    with pytest.raises(ConfigError, match=r"datasets\.photos\.writer\.indices"):
        spec = spec_of(writer={"indices": "0:10:0"})
        resolve_indices(spec.writer, 10, "photos")


@pytest.mark.parametrize(
    "entry, value_of",
    [
        ({"writer": {"page_size": 4194304.0}}, lambda s: s.writer.page_size),
        ({"writer": {"num_workers": 2.0}}, lambda s: s.writer.num_workers),
        ({"writer": {"chunksize": 10.0}}, lambda s: s.writer.chunksize),
        ({"writer": {"seed": 1.0}}, lambda s: s.writer.seed),
        ({"smoke": {"samples": 4.0}}, lambda s: s.smoke_samples),
    ],
    ids=["page_size", "num_workers", "chunksize", "seed", "smoke_samples"],
)
def test_integral_float_in_an_integer_setting_is_rejected_or_made_int(entry, value_of):
    try:
        spec = spec_of(**entry)
    except ConfigError:
        return
    assert type(value_of(spec)) is int


# --- fields --------------------------------------------------------------------------------------


def test_unknown_field_type_is_rejected_naming_the_field():
    error = config_error(fields={"x": {"type": "float16"}})
    assert error.where == "datasets.photos.fields.x.type"
    assert str(error).startswith("datasets.photos.fields.x.type: 'float16' is not one of ['int', 'float', 'ndarray'")


def test_unknown_field_option_is_rejected():
    error = config_error(fields={"x": {"type": "int", "dtype": "int32"}})
    assert error.where == "datasets.photos.fields.x"
    assert "dtype" in str(error)


def test_smart_write_mode_without_threshold_is_rejected():
    error = config_error(fields={"image": {"type": "rgb_image", "write_mode": "smart"}})
    assert error.where == "datasets.photos.fields.image.smart_threshold"
    assert str(error) == (
        "datasets.photos.fields.image.smart_threshold: write_mode 'smart' needs smart_threshold "
        "(image bytes, height*width*3, above which it is stored as JPEG); without it ffcv stores raw and "
        "wastes a JPEG encode per image"
    )


def test_smart_write_mode_with_threshold_is_accepted():
    spec = spec_of(fields={"image": {"type": "rgb_image", "write_mode": "smart", "smart_threshold": 65536}})
    assert spec.fields[0].options["smart_threshold"] == 65536


def test_ndarray_needs_dtype_and_shape():
    error = config_error(fields={"x": {"type": "ndarray", "dtype": "float32"}})
    assert error.where == "datasets.photos.fields.x"
    assert "'shape' is a required property" in str(error)


def test_ndarray_shape_entries_must_be_positive():
    error = config_error(fields={"x": {"type": "ndarray", "dtype": "float32", "shape": [3, 0]}})
    assert error.where == "datasets.photos.fields.x.shape.1"


@pytest.mark.parametrize("dtype", [">f4", ">i8", ">u2"])
def test_big_endian_ndarray_dtype_is_rejected(dtype):
    error = config_error(fields={"x": {"type": "ndarray", "dtype": dtype, "shape": [2]}})
    assert str(error) == f"datasets.photos.fields.x.dtype: {dtype!r} is big-endian; use the native little-endian dtype"


def test_object_ndarray_dtype_is_rejected():
    error = config_error(fields={"x": {"type": "ndarray", "dtype": "O", "shape": [2]}})
    assert str(error) == "datasets.photos.fields.x.dtype: 'O' holds Python objects; ffcv stores only plain-data dtypes"


def test_unknown_ndarray_dtype_is_rejected():
    error = config_error(fields={"x": {"type": "ndarray", "dtype": "float33", "shape": [2]}})
    assert error.where == "datasets.photos.fields.x.dtype"
    assert str(error).startswith("datasets.photos.fields.x.dtype: 'float33' is not a numpy dtype")


@pytest.mark.parametrize(
    "dtype, canonical",
    [("float32", "<f4"), ("<f4", "<f4"), ("=f4", "<f4"), ("uint8", "|u1"), ("int64", "<i8"), ("f8", "<f8")],
)
def test_ndarray_dtype_is_stored_in_canonical_form(dtype, canonical):
    spec = spec_of(fields={"x": {"type": "ndarray", "dtype": dtype, "shape": [2, 3]}})
    assert spec.fields[0].options == {"dtype": canonical, "shape": [2, 3]}
    assert field_kind(spec.fields[0]).fixed_size


@pytest.mark.parametrize("dtype", ["f4,i4", "(2,)f4"])
def test_structured_or_subarray_dtype_is_rejected_or_kept(dtype):
    try:
        spec = spec_of(fields={"x": {"type": "ndarray", "dtype": dtype, "shape": [2]}})
    except ConfigError as error:
        assert error.where == "datasets.photos.fields.x.dtype"
        return
    assert np.dtype(spec.fields[0].options["dtype"]) == np.dtype(dtype)


def test_torch_tensor_dtype_must_be_a_torch_name():
    error = config_error(fields={"t": {"type": "torch_tensor", "dtype": "complex64", "shape": [2]}})
    assert str(error) == (
        "datasets.photos.fields.t.dtype: 'complex64' is not one of "
        "float16, float32, float64, uint8, int8, int16, int32, int64, bool"
    )


def test_sample_keys_length_must_match_the_fields():
    error = config_error(fields={"image": {"type": "bytes"}, "label": {"type": "int"}}, sample_keys=["img"])
    assert str(error) == (
        "datasets.photos.sample_keys: has 1 keys but there are 2 fields; give one key per field, in field order"
    )


def test_sample_keys_of_the_right_length_are_kept_in_order():
    spec = spec_of(fields={"image": {"type": "bytes"}, "label": {"type": "int"}}, sample_keys=["img", 1])
    assert spec.sample_keys == ("img", 1)


# --- sources -------------------------------------------------------------------------------------


def test_arrays_columns_must_name_exactly_the_fields():
    error = config_error(
        fields={"image": {"type": "ndarray", "dtype": "uint8", "shape": [8, 8]}, "label": {"type": "int"}},
        source={"kind": "arrays", "path": "digits.npz", "columns": {"image": "images", "target": "target"}},
    )
    assert (
        str(error)
        == "datasets.photos.source.columns: must name one array per field; missing ['label'], not a field ['target']"
    )


def test_arrays_without_path_need_npy_columns():
    error = config_error(fields={"label": {"type": "int"}}, source={"kind": "arrays", "columns": {"label": "y.npz"}})
    assert str(error) == "datasets.photos.source.columns: without `path` every column is a .npy file; got ['y.npz']"


def test_arrays_path_must_be_npz():
    error = config_error(
        fields={"label": {"type": "int"}},
        source={"kind": "arrays", "path": "digits.npy", "columns": {"label": "target"}},
    )
    assert str(error) == "datasets.photos.source.path: 'digits.npy' must be an .npz file (or give .npy columns)"


@pytest.mark.parametrize(
    "fields",
    [
        {"label": {"type": "int"}, "image": {"type": "rgb_image"}},
        {"image": {"type": "rgb_image"}},
        {"image": {"type": "bytes"}, "label": {"type": "int"}},
    ],
)
def test_image_folder_needs_an_rgb_image_then_an_int_field(fields):
    error = config_error(fields=fields, source={"kind": "image_folder", "root": "photos"})
    types = [f["type"] for f in fields.values()]
    assert str(error) == (
        "datasets.photos.fields: an image_folder yields (image, label): declare an rgb_image field then an int "
        f"field, not {types}"
    )


def test_image_folder_with_image_and_label_is_accepted_with_default_extensions():
    spec = spec_of(
        fields={"image": {"type": "rgb_image"}, "label": {"type": "int"}},
        source={"kind": "image_folder", "root": "photos"},
    )
    assert ".png" in spec.source["extensions"] and ".jpg" in spec.source["extensions"]


def test_unknown_source_kind_is_rejected():
    error = config_error(source={"kind": "webdataset_v9", "urls": "x"})
    assert error.where == "datasets.photos.source.kind"


def test_python_factory_must_be_module_colon_function():
    error = config_error(source={"kind": "python", "factory": "adapters.tables.wine"})
    assert error.where == "datasets.photos.source.factory"


def test_dataset_name_must_be_a_safe_path_component():
    with pytest.raises(ConfigError) as info:
        load_config(raw_config(name="my photos/../x"))
    assert "my photos/../x" in str(info.value)


def test_unknown_top_level_key_is_rejected():
    config = raw_config()
    config["dataset"] = {}
    with pytest.raises(ConfigError, match="dataset"):
        load_config(config)


# --- defaults ------------------------------------------------------------------------------------


def test_defaults_are_filled_in():
    config = load_config(raw_config())
    spec = config.datasets["photos"]
    assert config.results == "results"
    assert spec.writer == WriterSpec(
        num_workers=-1, page_size=8388608, chunksize=100, indices=None, shuffle=False, seed=0
    )
    assert spec.smoke_samples == 32
    assert spec.verify == {
        "samples": 256,
        "jpeg_mean_abs_error": 8.0,
        "loader_batch": 16,
        "mode": "auto",
        "full_max_samples": 100000,
    }
    assert spec.sample_keys is None
    assert spec.source == {"kind": "python", "factory": "adapters.tables:wine", "args": {}}


def test_field_option_defaults_are_filled_in():
    spec = spec_of(
        fields={
            "image": {"type": "rgb_image"},
            "blob": {"type": "bytes"},
            "meta": {"type": "json"},
            "n": {"type": "int"},
        }
    )
    options = {f.name: f.options for f in spec.fields}
    assert options["image"] == {
        "write_mode": "raw",
        "max_resolution": None,
        "smart_threshold": None,
        "jpeg_quality": 90,
        "compress_probability": 0.5,
        "image_mode": "strict",
        "decode": "full",
        "source_jpeg": "reencode",
    }
    assert options["blob"] == {"allow_empty": False}
    assert options["meta"] == {"json_numpy": "reject"}
    assert options["n"] == {}


def test_explicit_values_override_defaults():
    spec = spec_of(
        writer={"page_size": "16MiB", "chunksize": 7, "shuffle": True, "seed": 3},
        smoke={"samples": 4},
        verify={"samples": 9},
    )
    assert spec.writer.page_size == 1 << 24
    assert (spec.writer.chunksize, spec.writer.shuffle, spec.writer.seed) == (7, True, 3)
    assert spec.smoke_samples == 4
    assert spec.verify == {
        "samples": 9,
        "jpeg_mean_abs_error": 8.0,
        "loader_batch": 16,
        "mode": "auto",
        "full_max_samples": 100000,
    }


def test_load_config_does_not_modify_its_input():
    config = raw_config(fields={"image": {"type": "rgb_image"}})
    before = copy.deepcopy(config)
    load_config(config)
    assert config == before


def test_smoke_samples_must_be_positive():
    error = config_error(smoke={"samples": 0})
    assert error.where == "datasets.photos.smoke.samples"


# --- round trip ----------------------------------------------------------------------------------


def test_to_dict_round_trips_through_from_dict_and_json():
    spec = spec_of(
        fields={
            "image": {"type": "rgb_image", "write_mode": "smart", "smart_threshold": 1000, "max_resolution": 64},
            "label": {"type": "int"},
            "score": {"type": "float"},
            "emb": {"type": "ndarray", "dtype": "float32", "shape": [4, 2]},
            "t": {"type": "torch_tensor", "dtype": "int16", "shape": [3]},
            "raw": {"type": "bytes", "allow_empty": True},
            "meta": {"type": "json", "json_numpy": "convert"},
        },
        source={"kind": "python", "factory": "adapters.tables:wine", "args": {"split": "train", "n": 3}},
        sample_keys=["img", "y", "s", "e", "t", "r", 7],
        writer={"page_size": "4MiB", "indices": "1:50:2", "shuffle": True, "seed": 11, "num_workers": 2},
        smoke={"samples": 5},
    )
    data = spec.to_dict()
    assert spec_from_dict(data) == spec
    assert spec_from_dict(json.loads(json.dumps(data))) == spec
    assert data["fields"]["emb"] == {"type": "ndarray", "dtype": "<f4", "shape": [4, 2]}
    assert list(data["fields"]) == ["image", "label", "score", "emb", "t", "raw", "meta"]


def test_round_trip_of_arrays_and_image_folder_specs():
    arrays = spec_of(
        name="digits",
        fields={"image": {"type": "ndarray", "dtype": "uint8", "shape": [8, 8]}, "label": {"type": "int"}},
        source={"kind": "arrays", "path": "digits.npz", "columns": {"image": "images", "label": "target"}},
        writer={"indices": [5, 3, 1]},
    )
    folder = spec_of(
        name="photos",
        fields={"image": {"type": "rgb_image"}, "label": {"type": "int"}},
        source={"kind": "image_folder", "root": "data/photos"},
    )
    for spec in (arrays, folder):
        assert spec_from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_the_json_form_keeps_the_field_order():
    spec = spec_of(fields={"z": {"type": "int"}, "a": {"type": "float"}})
    swapped = spec_of(fields={"a": {"type": "float"}, "z": {"type": "int"}})
    assert spec_from_dict(json.loads(json.dumps(spec.to_dict()))).field_names == ["z", "a"]
    assert list(spec.to_dict()["fields"]) == ["z", "a"] and list(swapped.to_dict()["fields"]) == ["a", "z"]


def test_from_dict_of_a_part_fills_the_schema_defaults():
    spec = spec_of(smoke={"samples": 4}, verify={"samples": 9}, writer={"chunksize": 5})
    part = {k: v for k, v in spec.to_dict().items() if k not in ("smoke", "verify")}
    rebuilt = spec_from_dict(part)
    assert rebuilt.smoke_samples == 32
    assert rebuilt.verify == {
        "samples": 256,
        "jpeg_mean_abs_error": 8.0,
        "loader_batch": 16,
        "mode": "auto",
        "full_max_samples": 100000,
    }
    assert (rebuilt.fields, rebuilt.writer, rebuilt.source) == (spec.fields, spec.writer, spec.source)


def test_from_dict_still_checks_the_rules():
    data = spec_of().to_dict()
    data["fields"] = {"a_very_long_field_name": {"type": "int"}}
    with pytest.raises(ConfigError, match="is 22 bytes; ffcv stores at most 16"):
        spec_from_dict(data)


# --- resolve_indices -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "indices, expected",
    [
        (None, list(range(10))),
        ("2:8", [2, 3, 4, 5, 6, 7]),
        (":4", [0, 1, 2, 3]),
        ("7:", [7, 8, 9]),
        ("::3", [0, 3, 6, 9]),
        ("1:10:4", [1, 5, 9]),
        (" 1 : 3 ", [1, 2]),
        ([9, 0, 4], [9, 0, 4]),
    ],
)
def test_resolve_indices_selects_ranges_and_lists(indices, expected):
    order = resolve_indices(writer(indices=indices), 10, "photos")
    assert order.dtype == np.int64
    assert order.tolist() == expected


def test_resolve_indices_from_a_validated_config():
    spec = spec_of(writer={"indices": "10:20:5"})
    assert resolve_indices(spec.writer, 100, spec.name).tolist() == [10, 15]


@pytest.mark.parametrize("indices, bad", [([1, 10], 10), ("5:12", 10), ([3, 400, 500], 400)])
def test_out_of_range_index_names_the_dataset_and_the_index(indices, bad):
    with pytest.raises(ConfigError) as info:
        resolve_indices(writer(indices=indices), 10, "photos")
    assert info.value.where == "datasets.photos.writer.indices"
    assert str(info.value) == f"datasets.photos.writer.indices: index {bad} is outside the source's 10 samples"


@pytest.mark.parametrize("indices", [[], "8:2", "3:3"])
def test_empty_selection_is_rejected(indices):
    with pytest.raises(ConfigError) as info:
        resolve_indices(writer(indices=indices), 10, "photos")
    assert str(info.value) == "datasets.photos.writer.indices: selects no sample; a .beton needs at least one"


def test_seeded_shuffle_is_reproducible_and_a_permutation():
    first = resolve_indices(writer(shuffle=True, seed=5), 1000, "photos")
    second = resolve_indices(writer(shuffle=True, seed=5), 1000, "photos")
    assert np.array_equal(first, second)
    assert sorted(first.tolist()) == list(range(1000))
    assert not np.array_equal(first, np.arange(1000))


def test_different_seeds_give_different_orders():
    a = resolve_indices(writer(shuffle=True, seed=1), 1000, "photos")
    b = resolve_indices(writer(shuffle=True, seed=2), 1000, "photos")
    assert not np.array_equal(a, b)


def test_shuffle_applies_after_the_selection():
    order = resolve_indices(writer(indices="100:200", shuffle=True, seed=0), 1000, "photos")
    assert sorted(order.tolist()) == list(range(100, 200))
    assert order.tolist() != list(range(100, 200))


def test_shuffle_does_not_touch_numpys_global_rng():
    np.random.seed(123)
    expected = np.random.random()
    np.random.seed(123)
    resolve_indices(writer(shuffle=True, seed=9), 500, "photos")
    assert np.random.random() == expected


# --- smoke_positions -----------------------------------------------------------------------------


def test_smoke_positions_are_the_first_k_then_k_distinct_others():
    positions = smoke_positions(1000, 8, seed=0)
    assert positions.dtype == np.int64
    assert positions[:8].tolist() == list(range(8))
    others = positions[8:]
    assert len(others) == 8
    assert len(set(others.tolist())) == 8
    assert others.min() >= 8 and others.max() < 1000
    assert others.tolist() == sorted(others.tolist())


@pytest.mark.parametrize("num_samples, k, seed", [(100, 32, 0), (12345, 64, 7), (3_000_000, 64, 1234)])
def test_smoke_positions_are_the_ones_drawn_from_the_array_of_the_others_without_making_it(num_samples, k, seed):
    """The same positions as drawing from ``np.arange(k, num_samples)`` (so that smoke.json, and the
    smoke file, stay as they were), with memory for the k picks only (800 MB at 100M samples)."""
    import tracemalloc  # why: only this test measures allocations

    others = np.arange(k, num_samples)
    drawn = np.sort(np.random.default_rng(seed).choice(others, size=k, replace=False))
    del others
    tracemalloc.start()
    positions = smoke_positions(num_samples, k, seed)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert positions.tolist() == list(range(k)) + drawn.tolist()
    assert peak < 1 << 20, f"{peak} bytes for {2 * k} positions"


def test_smoke_positions_are_reproducible_per_seed_and_differ_between_seeds():
    assert np.array_equal(smoke_positions(1000, 8, seed=4), smoke_positions(1000, 8, seed=4))
    assert not np.array_equal(smoke_positions(1000, 8, seed=4), smoke_positions(1000, 8, seed=5))


@pytest.mark.parametrize(
    "num_samples, k, expected", [(7, 5, list(range(7))), (3, 5, [0, 1, 2]), (10, 5, list(range(10))), (1, 1, [0])]
)
def test_smoke_positions_of_small_datasets_take_every_sample_once(num_samples, k, expected):
    assert smoke_positions(num_samples, k, seed=0).tolist() == expected


def test_smoke_positions_when_others_are_fewer_than_k():
    positions = smoke_positions(12, 8, seed=3)
    assert positions.tolist() == list(range(12))


@pytest.mark.parametrize("entry", [{"shuffle": True, "seed": 3}, {"indices": "5:", "shuffle": True}, {}])
def test_the_order_peaks_at_one_int64_per_sample(entry):
    """numpy reports its buffers to tracemalloc: the order of 4M samples must not be built twice
    (a shuffled copy, boolean masks of the range check), which at 10**9 samples is 8 GB more."""
    import tracemalloc

    n = 4_000_000
    tracemalloc.start()
    try:
        order = resolve_indices(writer(**entry), n, "photos")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert order.nbytes <= 8 * n
    assert peak < 8 * n * 1.1, f"peak {peak / 2**20:.0f} MiB for an order of {8 * n / 2**20:.0f} MiB"


def test_the_in_place_shuffle_gives_the_order_permutation_gave():
    """Files written before the in-place shuffle keep their order (and their source.json digests)."""
    expected = np.random.default_rng(7).permutation(np.arange(2, 5000, 3, dtype=np.int64))
    assert np.array_equal(resolve_indices(writer(indices="2::3", shuffle=True, seed=7), 5000, "photos"), expected)
