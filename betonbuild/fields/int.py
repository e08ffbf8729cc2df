"""``type: int``: a signed 64-bit integer, stored in the metadata record.

Accepted without loss besides Python and NumPy integers: a 0-d integer array or tensor, and a
float that is a whole number (``3.0``); a fraction, NaN, infinity or bool is refused."""

from __future__ import annotations

from typing import Any

import numpy as np

from betonbuild.beton.format import BetonFile, FieldInfo
from betonbuild.config.spec import FieldSpec
from betonbuild.fields.builtin_encoders import IntEncoder
from betonbuild.fields.fixed import ScalarKind, unwrap_scalar
from betonbuild.fields.kind import Fail, describe

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class IntKind(ScalarKind):
    name = "int"
    preview_roles = ("caption", "histogram")
    digest_dtype = "<i8"

    def build(self, field: FieldSpec):
        return IntEncoder()

    def check(self, field: FieldSpec, value: Any, fail: Fail) -> int:
        number = unwrap_scalar(value)
        if isinstance(number, (float, np.floating)):
            if not np.isfinite(number):
                raise fail(
                    f"int field got {describe(value)}, which has no integer value",
                    "return an int, or make the field a float (it stores NaN and infinity exactly)",
                )
            number = whole_number(number)
            if number is None:
                raise fail(
                    f"int field got {describe(value)}, which is not a whole number; ffcv would truncate it",
                    "round it explicitly in the adapter (round(value)) or make the field a float",
                )
        if isinstance(number, (bool, np.bool_)) or not isinstance(number, (int, np.integer)):
            raise fail(f"int field got {describe(value)}", "return a Python int or numpy integer")
        if not INT64_MIN <= int(number) <= INT64_MAX:
            raise fail(
                f"int value {int(number)} does not fit in int64",
                "store it as a float or json field, or scale it in the adapter",
            )
        return int(number)

    def loader_pipeline(self, field: FieldSpec, beton, n: int) -> list:
        from ffcv.fields.basics import IntDecoder

        return [IntDecoder()]

    def summarise(self, beton: BetonFile, info: FieldInfo, position: int) -> int:
        return int(beton.metadata[info.name][position])


def whole_number(number: float | np.floating) -> int | None:
    """The int a finite float with no fractional part equals exactly (``3.0`` -> 3), else None."""
    whole = int(number)  # exact for every float dtype, float128 included
    return whole if whole == number else None


KIND = IntKind()
