"""``type: float``: a 64-bit float, stored in the metadata record."""

from __future__ import annotations

from typing import Any

import numpy as np

from betonbuild.beton.format import BetonFile, FieldInfo
from betonbuild.config.spec import FieldSpec
from betonbuild.fields.fixed import ScalarKind
from betonbuild.fields.kind import Fail, describe


class FloatKind(ScalarKind):
    name = "float"
    preview_roles = ("histogram",)
    digest_dtype = "<f8"

    def build(self, field: FieldSpec):
        from ffcv.fields import FloatField

        return FloatField()

    def check(self, field: FieldSpec, value: Any, fail: Fail) -> float:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise fail(f"float field got {describe(value)}", "return a Python float or numpy floating value")
        try:
            return float(value)
        except OverflowError:
            raise fail(
                f"value {describe(value)} is too large for a float64",
                "scale it in the adapter, or store it as a json field (a string)",
            ) from None

    def loader_pipeline(self, field: FieldSpec, beton, n: int) -> list:
        from ffcv.fields.basics import FloatDecoder

        return [FloatDecoder()]

    def summarise(self, beton: BetonFile, info: FieldInfo, position: int) -> float | str:
        value = float(beton.metadata[info.name][position])
        return value if np.isfinite(value) else str(value)  # JSON has no NaN or infinity


KIND = FloatKind()
