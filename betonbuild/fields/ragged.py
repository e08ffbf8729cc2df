"""``type: ragged_ndarray``: a numpy array of one dtype and number of dimensions whose shape varies
per sample (token ids, point clouds, boxes per image, audio), stored exactly with its shape.

Read back through ``ffcv.Loader`` as a batch zero-padded to the file's largest shape plus
``<name>_shape`` (``betonbuild.loader_fields`` / ``betonbuild.loader_pipelines``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from betonbuild.beton.format import BetonFile, FieldInfo
from betonbuild.config.spec import FieldSpec
from betonbuild.errors import ConfigError
from betonbuild.fields.fixed import bool_as_byte_dtype
from betonbuild.fields.kind import Fail, describe
from betonbuild.fields.ndarray import numpy_dtype
from betonbuild.fields.ragged_field import MAX_NDIM, RaggedArrayField
from betonbuild.fields.shipped import ShippedKind

MAX_ELEMENTS = {
    "type": "integer",
    "minimum": 1,
    "description": "The most elements one value may hold (checked for every sample).",
}


def element_counts(beton: BetonFile, name: str) -> np.ndarray:
    """Elements of every stored value (the product of its shape)."""
    shapes = np.asarray(beton.metadata[name]["shape"]).reshape(beton.num_samples, -1)
    return shapes.astype(np.int64).prod(axis=1)


class RaggedKind(ShippedKind):
    name = "ragged_ndarray"
    field_class = RaggedArrayField
    options_schema = {
        "additionalProperties": False,
        "required": ["dtype", "ndim"],
        "properties": {
            "type": {},
            "dtype": {"type": "string"},
            "ndim": {"type": "integer", "minimum": 1, "maximum": MAX_NDIM},
            "max_elements": {**MAX_ELEMENTS, "type": ["integer", "null"], "default": None},
            "max_shape": {"type": ["array", "null"], "items": {"type": "integer", "minimum": 1}, "default": None},
        },
    }
    cost_per_sample_s = 0.0005
    preview_roles = ("histogram",)

    def normalise(self, where: str, options: dict[str, Any]) -> dict[str, Any]:
        options["dtype"] = numpy_dtype(f"{where}.dtype", options["dtype"]).str
        if options["max_shape"] is not None:
            if len(options["max_shape"]) != options["ndim"]:
                raise ConfigError(
                    f"{where}.max_shape",
                    f"{options['max_shape']} has {len(options['max_shape'])} dimensions; ndim is {options['ndim']}",
                )
            largest = math.prod(options["max_shape"])
            options["max_elements"] = min(options["max_elements"] or largest, largest)
        if options["max_elements"] is None:
            raise ConfigError(where, "give max_elements (the most elements one value holds) or max_shape")
        return options

    def check(self, field: FieldSpec, value: Any, fail: Fail) -> np.ndarray:
        o = field.options
        want = np.dtype(o["dtype"])
        fix = f"return np.asarray(value, dtype='{want}') with {o['ndim']} dimension(s)"
        if not isinstance(value, np.ndarray):
            raise fail(f"ragged_ndarray field got {describe(value)}", fix)
        if bool_as_byte_dtype(value.dtype, want):
            value = value.view(want)
        if value.dtype != want:
            raise fail(
                f"dtype {value.dtype} does not match the field's {want} (shape {value.shape})",
                f"convert explicitly in your dataset (value.astype('{want}')) or change the field's dtype",
            )
        if value.ndim != o["ndim"]:
            why = f"array has {value.ndim} dimension(s) (shape {value.shape}); the field's ndim is {o['ndim']}"
            raise fail(why, fix)
        self.check_size(field, value, fail)
        return np.ascontiguousarray(value)

    def check_size(self, field: FieldSpec, value: np.ndarray, fail: Fail) -> None:
        o = field.options
        if value.size > o["max_elements"]:
            raise fail(
                f"array of shape {value.shape} holds {value.size} elements; the field's max_elements is "
                f"{o['max_elements']}",
                "raise max_elements (or max_shape), or split or truncate such values in the dataset",
            )
        if o.get("max_shape") and any(s > m for s, m in zip(value.shape, o["max_shape"])):
            raise fail(
                f"array shape {value.shape} exceeds the field's max_shape {o['max_shape']}",
                "raise max_shape, or crop such values in the dataset",
            )

    def decoded_bytes(self, field: FieldSpec, page_size: int) -> int:
        return min(page_size, field.options["max_elements"] * np.dtype(field.options["dtype"]).itemsize)

    def loader_pipeline(self, field: FieldSpec, beton: BetonFile, n: int) -> list:
        return [self.build(field).get_decoder_class()()]

    def histogram_values(self, beton: BetonFile, field: FieldSpec) -> np.ndarray:
        return element_counts(beton, field.name)

    histogram_title = "elements per sample"

    def describe_stored(self, beton: BetonFile, info: FieldInfo) -> dict[str, Any]:
        counts = element_counts(beton, info.name)
        shapes = np.asarray(beton.metadata[info.name]["shape"]).reshape(beton.num_samples, -1)
        if not len(counts):
            return {"elements": None}
        return {
            "elements": {"min": int(counts.min()), "mean": round(float(counts.mean()), 3), "max": int(counts.max())},
            "padded_shape": [int(s) for s in shapes.max(axis=0)],
        }

    def summary_text(self, value: np.ndarray) -> str:
        text = f"{value.dtype}{list(value.shape)}"
        if value.size and value.dtype.kind in "biuf":
            flat = value.astype(np.float64).reshape(-1)
            if not np.isnan(flat).all():
                text += f" min={np.nanmin(flat):.6g} max={np.nanmax(flat):.6g}"
        return text


KIND = RaggedKind()
