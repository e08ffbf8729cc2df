"""Field specs -> ``ffcv.fields.Field`` instances, in the configured order."""

from __future__ import annotations

import numpy as np

from betonbuild.config.spec import DatasetSpec, FieldSpec

# ffcv's descriptor type ids (ffcv/types.py TYPE_ID_HANDLER); 255 = any other class.
TYPE_IDS = {"float": 0, "int": 1, "rgb_image": 2, "bytes": 3, "ndarray": 4, "json": 5, "torch_tensor": 6, "custom": 255}


def torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def build_field(spec: FieldSpec):
    from ffcv import fields

    o = spec.options
    if spec.type == "int":
        return fields.IntField()
    if spec.type == "float":
        return fields.FloatField()
    if spec.type == "ndarray":
        return fields.NDArrayField(dtype=np.dtype(o["dtype"]), shape=tuple(o["shape"]))
    if spec.type == "torch_tensor":
        return fields.TorchTensorField(dtype=torch_dtype(o["dtype"]), shape=tuple(o["shape"]))
    if spec.type == "rgb_image":
        return fields.RGBImageField(
            write_mode=o["write_mode"],
            max_resolution=o["max_resolution"],
            smart_threshold=o["smart_threshold"],
            jpeg_quality=o["jpeg_quality"],
            compress_probability=o["compress_probability"],
        )
    if spec.type == "bytes":
        return fields.BytesField()
    if spec.type == "json":
        return fields.JSONField()
    if spec.type == "custom":
        from betonbuild.fields.custom import build

        return build(spec)
    raise ValueError(f"unknown field type {spec.type!r}")  # the schema makes this unreachable


def build_fields(spec: DatasetSpec) -> dict:
    """Ordered mapping name -> Field: the order is the order of values in every sample."""
    return {f.name: build_field(f) for f in spec.fields}


def metadata_type(field: FieldSpec) -> np.dtype:
    """The field's metadata record type in the .beton (a custom field's class declares its own)."""
    from betonbuild.beton.format import METADATA_TYPES

    if field.type == "custom":
        from betonbuild.fields.custom import build

        return np.dtype(build(field).metadata_type)
    return METADATA_TYPES[TYPE_IDS[field.type]]


def sample_dtype(field: FieldSpec) -> np.dtype:
    """The numpy dtype a fixed-size ndarray/torch_tensor field's values must have."""
    if field.type == "ndarray":
        return np.dtype(field.options["dtype"])
    return np.dtype(field.options["dtype"]) if field.options["dtype"] != "bool" else np.dtype(bool)
