"""``type: int``: a signed 64-bit integer, stored in the metadata record."""

from __future__ import annotations

from typing import Any

import numpy as np

from betonbuild.beton.format import BetonFile, FieldInfo
from betonbuild.config.spec import FieldSpec
from betonbuild.fields.fixed import ScalarKind
from betonbuild.fields.kind import Fail, describe

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class IntKind(ScalarKind):
    name = "int"
    preview_roles = ("caption", "histogram")
    digest_dtype = "<i8"

    def build(self, field: FieldSpec):
        from ffcv.fields import IntField

        return IntField()

    def check(self, field: FieldSpec, value: Any, fail: Fail) -> int:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise fail(f"int field got {describe(value)}", "return a Python int or numpy integer")
        if not INT64_MIN <= int(value) <= INT64_MAX:
            raise fail(
                f"int value {int(value)} does not fit in int64",
                "store it as a float or json field, or scale it in the adapter",
            )
        return int(value)

    def loader_pipeline(self, field: FieldSpec, beton, n: int) -> list:
        from ffcv.fields.basics import IntDecoder

        return [IntDecoder()]

    def summarise(self, beton: BetonFile, info: FieldInfo, position: int) -> int:
        return int(beton.metadata[info.name][position])


KIND = IntKind()
