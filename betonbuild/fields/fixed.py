"""What the fixed-size kinds share: scalars (int, float) live in the metadata record, arrays
(ndarray, torch_tensor) in one payload of ``itemsize * prod(shape)`` bytes per sample."""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from betonbuild.beton.format import BetonFile, FieldInfo
from betonbuild.config.spec import FieldSpec
from betonbuild.fields.kind import FieldKind

SECONDS_PER_FIXED_VALUE = 0.0002  # reading, checking and encoding one fixed-size value, one core
SMALL_FIXED = 4096  # array payloads up to this size are gathered into the digest in one copy per block


def unwrap_scalar(value: Any) -> Any:
    """The number inside a 0-d NumPy array or torch tensor, else ``value`` itself.

    A 0-d array holds exactly one number of its dtype: taking it out loses nothing, and the scalar
    fields then apply their own rules to it (a bool stays a bool, which they refuse)."""
    if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "biuf":
        return value[()]
    torch = sys.modules.get("torch")  # a tensor exists only once torch is imported: never import it here
    if torch is not None and isinstance(value, torch.Tensor) and value.dim() == 0 and value.device.type == "cpu":
        return value.item()  # a Python int, float or bool holding the tensor's value exactly
    return value


def bool_as_byte_dtype(value_dtype: np.dtype, want_dtype: np.dtype) -> bool:
    """A bool array into a 1-byte integer dtype: False/True are the bytes 0/1, the same values and
    bytes in either dtype, so the conversion loses nothing (any other dtype change is refused)."""
    return value_dtype == np.bool_ and want_dtype.kind in "iu" and want_dtype.itemsize == 1


class FixedKind(FieldKind):
    fixed_size = True
    cost_per_sample_s = SECONDS_PER_FIXED_VALUE
    verify_check = "fixed_fields"

    def as_stored(self, want: np.ndarray, found: np.ndarray) -> np.ndarray:
        """The source values in the representation the file stores them in (compared with ``found``)."""
        return want


class ScalarKind(FixedKind):
    """int and float: one 8-byte value in the metadata record itself."""

    digest_dtype = ""  # the canonical little-endian form of the stored value

    def fixed_bytes(self, field: FieldSpec) -> int:
        return 8

    def stored_column(self, beton: BetonFile, field: FieldSpec, positions: np.ndarray) -> np.ndarray:
        return np.asarray(beton.metadata[field.name][positions])

    def expected_column(self, values: list, found: np.ndarray) -> np.ndarray:
        return np.asarray(values)

    def as_stored(self, want: np.ndarray, found: np.ndarray) -> np.ndarray:
        return want.astype(found.dtype)

    def loader_equal(self, field: FieldSpec, beton: BetonFile, item: Any, position: int) -> bool:
        expected = beton.metadata[field.name][position]
        return item.reshape(-1)[0] == expected or (np.isnan(expected) and np.isnan(item).all())

    def digest_column(self, beton: BetonFile, info: FieldInfo, positions: np.ndarray, meta: np.ndarray):
        return np.ascontiguousarray(meta, dtype=self.digest_dtype).view(np.uint8).reshape(-1, 8)


class ArrayKind(FixedKind):
    """ndarray and torch_tensor: a fixed-shape array, its payload pointed at by the record."""

    options_schema = {
        "additionalProperties": False,
        "required": ["dtype", "shape"],
        "properties": {
            "type": {},
            "dtype": {"type": "string"},
            "shape": {"type": "array", "items": {"type": "integer", "minimum": 1}},
        },
    }

    preview_roles = ("values",)

    def normalise(self, where: str, options: dict[str, Any]) -> dict[str, Any]:
        options = self.normalise_dtype(where, options)
        options["shape"] = [int(s) for s in options["shape"]]
        return options

    def normalise_dtype(self, where: str, options: dict[str, Any]) -> dict[str, Any]:
        return options

    def fixed_bytes(self, field: FieldSpec) -> int:
        return np.dtype(field.options["dtype"]).itemsize * math.prod(field.options["shape"])

    def describe_arguments(self, info: FieldInfo) -> dict[str, Any]:
        return {"dtype": info.dtype.str, "shape": list(info.shape)}

    def data_bytes(self, beton: BetonFile, info: FieldInfo) -> int:
        return info.payload_bytes * beton.num_samples

    def summarise(self, beton: BetonFile, info: FieldInfo, position: int) -> str:
        """dtype and shape, and min, max and mean of a numeric array."""
        array = beton.ndarray_column(info.name, np.array([position]))[0]
        text = f"{array.dtype}{list(array.shape)}"
        if array.dtype.kind in "biuf" and array.size:
            with np.errstate(all="ignore"):
                flat = array.astype(np.float64).reshape(-1)
            text += (
                f" min={np.nanmin(flat):.6g} max={np.nanmax(flat):.6g} mean={np.nanmean(flat):.6g}"
                if not np.isnan(flat).all()
                else " all NaN"
            )
        return text

    def descriptor_problem(self, field: FieldSpec, info: FieldInfo) -> str | None:
        want = (self.sample_dtype(field), tuple(field.options["shape"]))
        if (info.dtype, info.shape) != want:
            return f"field '{field.name}' stores {info.dtype}{list(info.shape)}, config says {want[0]}{list(want[1])}"
        return None

    def stored_column(self, beton: BetonFile, field: FieldSpec, positions: np.ndarray) -> np.ndarray:
        return beton.ndarray_column(field.name, positions)

    def expected_column(self, values: list, found: np.ndarray) -> np.ndarray:
        return np.stack(values) if values else found[:0]

    def loader_pipeline(self, field: FieldSpec, beton: BetonFile, n: int) -> list:
        from ffcv.fields.ndarray import NDArrayDecoder

        return [NDArrayDecoder()]

    def loader_equal(self, field: FieldSpec, beton: BetonFile, item: Any, position: int) -> bool:
        return np.array_equal(item, beton.ndarray_column(field.name, np.array([position]))[0], equal_nan=True)

    def digest_column(self, beton: BetonFile, info: FieldInfo, rows: np.ndarray, meta: np.ndarray):
        nbytes = info.payload_bytes
        if nbytes <= SMALL_FIXED:
            return np.ascontiguousarray(beton.gather(meta, nbytes, f"field '{info.name}'"))
        beton.check_payloads_inside(meta, nbytes, f"field '{info.name}'")
        return lambda i, row, allocs: (beton.mm[int(meta[i]) : int(meta[i]) + nbytes],)


def check_array_layout(value: np.ndarray, want_dtype: np.dtype, want_shape: tuple, fail) -> None:
    """The array's dtype and shape are the field's exactly (ffcv checks only the byte count)."""
    if value.dtype != want_dtype:
        if value.dtype.newbyteorder("=") == want_dtype.newbyteorder("="):
            raise fail(
                f"array is {value.dtype.str} (non-native byte order); the field stores {want_dtype.str}",
                "convert with value.astype(value.dtype.newbyteorder('='))",
            )
        raise fail(
            f"dtype {value.dtype} does not match the field's {want_dtype} (shape {value.shape}); "
            "ffcv checks only the byte count and would store it wrongly",
            f"convert explicitly in your dataset (value.astype('{want_dtype}')) or change the field's dtype",
        )
    if value.shape != want_shape:
        raise fail(
            f"shape {value.shape} does not match the field's {want_shape}",
            "reshape in your dataset or change the field's shape",
        )
