"""``type: ndarray``: a numpy array of one dtype and shape per field, one payload per sample.

The array's dtype must be the field's; the one conversion accepted is a bool array into a 1-byte
integer field (``uint8``, ``int8``), where False/True are stored as the bytes 0/1 they already are."""

from __future__ import annotations

from typing import Any

import numpy as np

from betonbuild.config.spec import FieldSpec
from betonbuild.errors import ConfigError
from betonbuild.fields.builtin_encoders import NDArrayEncoder
from betonbuild.fields.fixed import ArrayKind, bool_as_byte_dtype, check_array_layout
from betonbuild.fields.kind import Fail, describe


class NDArrayKind(ArrayKind):
    name = "ndarray"

    def normalise_dtype(self, where: str, options: dict[str, Any]) -> dict[str, Any]:
        options["dtype"] = numpy_dtype(f"{where}.dtype", options["dtype"]).str
        return options

    def sample_dtype(self, field: FieldSpec) -> np.dtype:
        return np.dtype(field.options["dtype"])

    def build(self, field: FieldSpec):
        return NDArrayEncoder(dtype=np.dtype(field.options["dtype"]), shape=tuple(field.options["shape"]))

    def check(self, field: FieldSpec, value: Any, fail: Fail) -> np.ndarray:
        want_dtype, want_shape = np.dtype(field.options["dtype"]), tuple(field.options["shape"])
        if not isinstance(value, np.ndarray):
            raise fail(
                f"ndarray field got {describe(value)}",
                f"return np.asarray(value, dtype='{want_dtype}') with shape {want_shape}",
            )
        if bool_as_byte_dtype(value.dtype, want_dtype):
            value = value.view(want_dtype)
        check_array_layout(value, want_dtype, want_shape, fail)
        return np.ascontiguousarray(value)


KIND = NDArrayKind()


def numpy_dtype(where: str, text: str) -> np.dtype:
    """A config's dtype string as a plain, native numpy dtype; ConfigError otherwise."""
    try:
        dtype = np.dtype(text)
    except TypeError as exc:
        raise ConfigError(where, f"{text!r} is not a numpy dtype ({exc})") from None
    if dtype.hasobject:
        raise ConfigError(where, f"{text!r} holds Python objects; ffcv stores only plain-data dtypes")
    if dtype.fields is not None or dtype.subdtype is not None:
        raise ConfigError(
            where, f"{text!r} is a structured or sub-array dtype; use a plain dtype and put every dimension in `shape`"
        )
    if dtype.byteorder == ">" or (dtype.byteorder == "=" and not dtype.isnative):
        raise ConfigError(where, f"{text!r} is big-endian; use the native little-endian dtype")
    return dtype
