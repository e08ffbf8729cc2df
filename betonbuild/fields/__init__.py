"""The field-kind registry: ``FIELD_KINDS[type]`` holds everything betonbuild knows about a kind.

Adding a kind is one module of this package (a ``FieldKind`` subclass and its ``KIND``), listed
below, plus its tests; its type id comes from ``betonbuild.beton.format.TYPE_NAMES``.
"""

from __future__ import annotations

import numpy as np

from betonbuild.beton.format import FieldInfo
from betonbuild.config.spec import DatasetSpec, FieldSpec
from betonbuild.errors import BetonFormatError
from betonbuild.fields import bytes as bytes_kind
from betonbuild.fields import custom, gray_image, int_list, ndarray, ragged, rgb_image, text, torch_tensor
from betonbuild.fields import float as float_kind
from betonbuild.fields import int as int_kind
from betonbuild.fields import json as json_kind
from betonbuild.fields.kind import FieldKind

_BUILTIN = (int_kind, float_kind, ndarray, torch_tensor, rgb_image, bytes_kind, json_kind, custom)
# Kinds betonbuild stores with its own custom classes (type id 255, ``betonbuild.fields.shipped``)
_SHIPPED = (ragged, int_list, text, gray_image)
FIELD_KINDS: dict[str, FieldKind] = {module.KIND.name: module.KIND for module in _BUILTIN + _SHIPPED}
_BY_TYPE_ID = {module.KIND.type_id: module.KIND for module in _BUILTIN}


def field_kind(field: FieldSpec | str) -> FieldKind:
    """The kind of a field spec, or of a config ``type`` name."""
    return FIELD_KINDS[field if isinstance(field, str) else field.type]


def kind_of_type_id(type_id: int, where: str) -> FieldKind:
    """The kind a .beton descriptor's type id stands for; BetonFormatError naming ``where`` if none."""
    try:
        return _BY_TYPE_ID[type_id]
    except KeyError:
        raise BetonFormatError(f"{where} has type id {type_id}") from None


def stored_kind(info: FieldInfo, path: str = "") -> FieldKind:
    """The kind of a field of a .beton (its descriptor's type id, and for a type-255 field read by one
    of betonbuild's classes, that class's kind); ``path`` names the file in the error."""
    shipped = getattr(info.handler, "betonbuild_kind", None)
    if shipped in FIELD_KINDS:
        return FIELD_KINDS[shipped]
    return kind_of_type_id(info.type_id, f"{path}: field '{info.name}'" if path else f"field '{info.name}'")


def describe_arguments(info: FieldInfo) -> dict:
    """A .beton field's descriptor arguments, decoded where its kind defines them."""
    return stored_kind(info).describe_arguments(info)


def build_field(field: FieldSpec):
    """The ``ffcv.fields.Field`` instance that writes ``field``."""
    return field_kind(field).build(field)


def build_fields(spec: DatasetSpec) -> dict:
    """Ordered mapping name -> Field: the order is the order of values in every sample."""
    return {f.name: build_field(f) for f in spec.fields}


def metadata_type(field: FieldSpec) -> np.dtype:
    """The field's metadata record type in the .beton (a custom field's class declares its own)."""
    return field_kind(field).metadata_type(field)


def sample_dtype(field: FieldSpec) -> np.dtype | None:
    """The numpy dtype a fixed-size ndarray/torch_tensor field's values must have."""
    return field_kind(field).sample_dtype(field)
