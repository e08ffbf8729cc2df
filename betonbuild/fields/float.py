"""``type: float``: a 64-bit float, stored in the metadata record.

Accepted: any Python or NumPy number that float64 holds exactly, and a 0-d array or tensor of one;
a bool, and a number float64 would round (an int above 2**53 that is not a float64, a float128),
are refused."""

from __future__ import annotations

from typing import Any

import numpy as np

from betonbuild.beton.format import BetonFile, FieldInfo
from betonbuild.config.spec import FieldSpec
from betonbuild.fields.builtin_encoders import FloatEncoder
from betonbuild.fields.fixed import ScalarKind, unwrap_scalar
from betonbuild.fields.kind import Fail, describe


class FloatKind(ScalarKind):
    name = "float"
    preview_roles = ("histogram",)
    digest_dtype = "<f8"

    def build(self, field: FieldSpec):
        return FloatEncoder()

    def check(self, field: FieldSpec, value: Any, fail: Fail) -> float:
        number = unwrap_scalar(value)
        if isinstance(number, (bool, np.bool_)) or not isinstance(number, (int, float, np.integer, np.floating)):
            raise fail(f"float field got {describe(value)}", "return a Python float or numpy floating value")
        exact = int(number) if isinstance(number, np.integer) else number  # numpy would compare in float64
        try:
            result = float(exact)
        except OverflowError:
            raise fail(
                f"value {describe(value)} is too large for a float64",
                "scale it in the adapter, or store it as a json field (a string)",
            ) from None
        if result != exact and not np.isnan(result):
            raise fail(
                f"value {describe(value)} is not exactly a float64; it would be stored as {result!r}",
                "convert it in the adapter (float(value)) if the rounding is intended, or store it as an int field",
            )
        return result

    def loader_pipeline(self, field: FieldSpec, beton, n: int) -> list:
        from ffcv.fields.basics import FloatDecoder

        return [FloatDecoder()]

    def summarise(self, beton: BetonFile, info: FieldInfo, position: int) -> float | str:
        value = float(beton.metadata[info.name][position])
        return value if np.isfinite(value) else str(value)  # JSON has no NaN or infinity


KIND = FloatKind()
