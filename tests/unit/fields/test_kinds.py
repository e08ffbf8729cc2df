"""The field-kind registry (betonbuild.fields): one kind per config type, each answering for itself."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from betonbuild.beton.format import METADATA_TYPES, TYPE_NAMES, FieldInfo
from betonbuild.config.load import load_config, schema
from betonbuild.errors import BetonFormatError
from betonbuild.fields import (
    FIELD_KINDS,
    describe_arguments,
    field_kind,
    kind_of_type_id,
    metadata_type,
    sample_dtype,
    stored_kind,
)
from betonbuild.fields.kind import OWN_DECODER, FieldKind, clipped

PAGE = 1 << 22
FIELDS = {
    "label": {"type": "int"},
    "score": {"type": "float"},
    "emb": {"type": "ndarray", "dtype": "float32", "shape": [2, 3]},
    "tens": {"type": "torch_tensor", "dtype": "int16", "shape": [4, 5]},
    "flag": {"type": "torch_tensor", "dtype": "bool", "shape": [3]},
    "image": {"type": "rgb_image"},
    "small": {"type": "rgb_image", "max_resolution": 32},
    "blob": {"type": "bytes"},
    "meta": {"type": "json"},
    "title": {"type": "custom", "class": "betonbuild.custom:FixedUTF8Field", "args": {"width": 12}},
}


@pytest.fixture(scope="module")
def fields():
    spec = load_config(
        {"datasets": {"d": {"source": {"kind": "python", "factory": "m:f"}, "fields": FIELDS}}}
    ).datasets["d"]
    return {f.name: f for f in spec.fields}


def test_every_type_the_schema_admits_has_one_kind_and_every_kind_a_type_id_of_the_format_table():
    types = schema()["$defs"]["field"]["properties"]["type"]["enum"]
    assert list(FIELD_KINDS) == types
    builtin = {name: kind for name, kind in FIELD_KINDS.items() if name in TYPE_NAMES.values()}
    assert {kind.type_id: name for name, kind in builtin.items()} == TYPE_NAMES
    # the kinds betonbuild stores with its own classes are ffcv custom fields
    assert {name: kind.type_id for name, kind in FIELD_KINDS.items() if name not in builtin} == {
        "ragged_ndarray": 255,
        "int_list": 255,
        "text": 255,
        "gray_image": 255,
    }
    assert all(isinstance(kind, FieldKind) and field_kind(name) is kind for name, kind in FIELD_KINDS.items())


def test_a_type_id_names_its_kind_and_an_unknown_one_is_a_format_error():
    assert kind_of_type_id(255, "here") is FIELD_KINDS["custom"]
    assert kind_of_type_id(2, "here") is FIELD_KINDS["rgb_image"]
    with pytest.raises(BetonFormatError, match="f.beton: field 'x' has type id 7"):
        kind_of_type_id(7, "f.beton: field 'x'")


def info(type_id: int, **more) -> FieldInfo:
    """A parsed descriptor of field 'x' (what BetonFile.fields holds)."""
    return FieldInfo(
        "x", type_id, TYPE_NAMES.get(type_id, "?"), METADATA_TYPES.get(type_id, np.dtype("V0")), b"", **more
    )


def test_the_kind_of_a_stored_field_and_an_unknown_type_id_naming_the_file_and_field():
    assert stored_kind(info(4), "f.beton") is FIELD_KINDS["ndarray"]
    with pytest.raises(BetonFormatError, match=r"^f\.beton: field 'x' has type id 7$"):
        stored_kind(info(7), "f.beton")
    with pytest.raises(BetonFormatError, match=r"^field 'x' has type id 7$"):
        describe_arguments(info(7))


def test_descriptor_arguments_are_described_by_the_kind_and_only_a_custom_class_reads_its_own():
    assert describe_arguments(info(4, dtype=np.dtype("<f4"), shape=(2, 3))) == {"dtype": "<f4", "shape": [2, 3]}
    assert describe_arguments(info(6, dtype=np.dtype("<i2"), shape=(5,))) == {"dtype": "<i2", "shape": [5]}
    assert set(describe_arguments(info(2))) == {"note"}
    assert [describe_arguments(info(t)) for t in (0, 1, 3, 5)] == [{}, {}, {}, {}]
    unregistered = FieldInfo("x", 255, "custom", np.dtype("V0"), b"\x05" + bytes(1023))
    assert describe_arguments(unregistered) == {
        "metadata_type": "|V0",
        "arguments_hex": "05",
        "arguments_bytes_used": 1,
    }  # no class without a handler
    assert [name for name, kind in FIELD_KINDS.items() if kind.class_decodes_arguments] == ["custom"]


def test_the_inspect_text_of_an_image_field_is_its_modes_and_of_others_their_arguments():
    image = {"arguments": {"note": "n"}, "image_modes": {"jpeg": 2, "raw": 1}}
    assert FIELD_KINDS["rgb_image"].arguments_text(image) == "jpeg 2, raw 1"
    assert FIELD_KINDS["rgb_image"].arguments_text({"arguments": {"note": "n"}}) == ""
    assert (
        FIELD_KINDS["ndarray"].arguments_text({"arguments": {"dtype": "<f4", "shape": [2]}}) == "dtype=<f4, shape=[2]"
    )


def test_a_kind_without_its_own_summary_shows_the_raw_record():
    class Stored:
        def record_bytes(self, name, position):
            return bytes(range(position, position + 20))

    assert FieldKind().summarise(Stored(), info(1), 0) == "record 00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f ..."
    assert FieldKind().summarise(Stored(), info(1), 3)[:12] == "record 03 04"
    assert clipped("x" * 80, 80) == "x" * 80 and clipped("x" * 81, 80) == "x" * 77 + "..."


def test_the_fixed_size_kinds_are_the_scalars_and_the_arrays(fields):
    assert [name for name, kind in FIELD_KINDS.items() if kind.fixed_size] == [
        "int",
        "float",
        "ndarray",
        "torch_tensor",
    ]
    assert {f.name for f in fields.values() if field_kind(f).fixed_size} == {"label", "score", "emb", "tens", "flag"}


def test_metadata_types_come_from_the_format_table_and_a_custom_class_declares_its_own(fields):
    for name in ("label", "score", "emb", "tens", "image", "blob", "meta"):
        assert metadata_type(fields[name]) == METADATA_TYPES[field_kind(fields[name]).type_id]
    assert metadata_type(fields["title"]) == np.dtype(("<u1", (12,)))


def test_sample_dtypes_of_array_fields(fields):
    assert sample_dtype(fields["emb"]) == np.dtype("<f4")
    assert sample_dtype(fields["tens"]) == np.dtype("int16")
    assert sample_dtype(fields["flag"]) == np.dtype(bool)
    assert sample_dtype(fields["label"]) is None and sample_dtype(fields["image"]) is None


def test_seconds_per_sample_of_each_kind():
    costs = {name: kind.cost_per_sample_s for name, kind in FIELD_KINDS.items()}
    assert costs == {
        "int": 0.0002,
        "float": 0.0002,
        "ndarray": 0.0002,
        "torch_tensor": 0.0002,
        "rgb_image": 0.05,
        "bytes": 0.002,
        "json": 0.002,
        "custom": 0,
        "ragged_ndarray": 0.0005,
        "int_list": 0.0005,
        "text": 0.0005,
        "gray_image": 0.02,
    }


def test_fixed_bytes_are_the_payload_of_one_fixed_size_value(fields):
    got = {name: field_kind(f).fixed_bytes(f) for name, f in fields.items()}
    assert got == {
        "label": 8,
        "score": 8,
        "emb": 4 * 6,
        "tens": 2 * 20,
        "flag": 3,
        "image": 0,
        "small": 0,
        "blob": 0,
        "meta": 0,
        "title": 0,
    }


def test_decoded_bytes_bound_one_decoded_value(fields):
    got = {name: field_kind(f).decoded_bytes(f, PAGE) for name, f in fields.items()}
    assert got == {
        "label": 8,
        "score": 8,
        "emb": 24,
        "tens": 40,
        "flag": 3,
        "image": PAGE,  # no max_resolution: a value fits one page (ffcv's rule)
        "small": 3 * 32**2,
        "blob": PAGE,
        "meta": PAGE,
        "title": PAGE,
    }


def test_preview_roles_pick_the_contact_sheet_captions_and_plot_panels():
    roles = {name: kind.preview_roles for name, kind in FIELD_KINDS.items() if kind.preview_roles}
    assert roles == {
        "int": ("caption", "histogram"),
        "float": ("histogram",),
        "ndarray": ("values",),
        "torch_tensor": ("values",),
        "rgb_image": ("image",),
        "ragged_ndarray": ("histogram",),  # of the elements per sample
        "int_list": ("histogram",),
        "text": ("histogram",),  # of the UTF-8 bytes per sample
        "gray_image": ("image",),
    }


def test_each_variable_kind_reports_under_its_check_and_only_bytes_may_be_empty(fields):
    checks = {name: kind.verify_check for name, kind in FIELD_KINDS.items()}
    assert {name for name, check in checks.items() if check == "fixed_fields"} == {
        "int",
        "float",
        "ndarray",
        "torch_tensor",
    }
    assert checks["custom"] == "custom_fields"
    assert {checks[n] for n in ("rgb_image", "bytes", "json")} == {"variable_fields"}
    assert {checks[n] for n in ("ragged_ndarray", "int_list", "text", "gray_image")} == {"variable_fields"}
    assert [n for n, f in fields.items() if field_kind(f).allow_empty(f)] == []
    blob = load_config(
        {
            "datasets": {
                "d": {
                    "source": {"kind": "python", "factory": "m:f"},
                    "fields": {"b": {"type": "bytes", "allow_empty": True}},
                }
            }
        }
    ).datasets["d"]
    assert field_kind(blob.fields[0]).allow_empty(blob.fields[0])


def test_comparisons_that_need_ffcv_or_torch(fields):
    needs = {name for name, f in fields.items() if field_kind(f).compare_needs_ffcv(f)}
    assert needs == {"tens", "flag", "title"}  # rgb_image: ffcv_resizer reproduces ffcv's resizer


def test_a_custom_field_is_loaded_by_its_own_decoder_and_compared_when_its_class_can(fields):
    kind = field_kind(fields["title"])
    assert kind.loader_pipeline(fields["title"], None, 4) is OWN_DECODER
    assert kind.loader_comparable(fields["title"])  # FixedUTF8Field has decode and from_loader
    # type-255 kinds only: custom and betonbuild's own classes (ragged_ndarray...)
    assert kind.custom_allocations and not any(k.custom_allocations for k in FIELD_KINDS.values() if k.type_id != 255)


def test_importing_the_registry_imports_neither_ffcv_nor_torch_nor_an_image_library():
    code = (
        "import sys, betonbuild.fields, betonbuild.write.contract, betonbuild.config.load\n"
        "print([m for m in sys.modules if m.split('.')[0] in ('ffcv', 'torch', 'PIL', 'cv2', 'numba')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
