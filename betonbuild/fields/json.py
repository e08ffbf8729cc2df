"""``type: json``: any JSON-encodable value, stored as its NUL-terminated UTF-8 text."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from betonbuild.beton.format import BetonFile, FieldInfo
from betonbuild.beton.payloads import decode_json
from betonbuild.config.spec import FieldSpec
from betonbuild.fields.builtin_encoders import JSONEncoder
from betonbuild.fields.kind import Fail, StoredSample, clipped, describe
from betonbuild.fields.payload import PayloadKind


class JSONKind(PayloadKind):
    name = "json"
    # The field's entry in the config, as JSON Schema (config.load assembles the whole schema)
    options_schema = {
        "additionalProperties": False,
        "properties": {
            "type": {},
            "json_numpy": {
                "enum": ["reject", "convert"],
                "default": "reject",
                "description": "convert turns numpy scalars/arrays into Python numbers/lists.",
            },
        },
    }

    def build(self, field: FieldSpec):
        return JSONEncoder()

    def check(self, field: FieldSpec, value: Any, fail: Fail) -> Any:
        if field.options.get("json_numpy") == "convert":
            value = _numpy_to_python(value)
        problem = _json_problem(value, "value")
        if problem:
            raise fail(*problem)
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise fail(
                f"value is not JSON-encodable: {exc}",
                "return dicts, lists, str, int, float, bool or None (no sets, bytes or objects)",
            ) from None
        return value

    def compare(self, field: FieldSpec, stored: StoredSample, value: Any, stats: dict) -> str | None:
        found = decode_json(stored.beton.variable_payload(field.name, stored.position))
        return None if found == json.loads(json.dumps(value)) else f"stored {found!r} != source"

    def summarise(self, beton: BetonFile, info: FieldInfo, position: int) -> str:
        """The compact JSON text, clipped to 80 characters."""
        return clipped(json.dumps(decode_json(beton.variable_payload(info.name, position)), separators=(",", ":")), 80)

    def loader_equal(self, field: FieldSpec, beton: BetonFile, item: Any, position: int) -> bool:
        from ffcv.fields.json import JSONField

        return JSONField.unpack(item) == decode_json(beton.variable_payload(field.name, position))


NUMPY_FIX = "return plain Python values (use .item()/.tolist()), or set `json_numpy: convert`"
# `json_numpy: convert` keeps a NaN a NaN, so it is not offered for one
NON_FINITE_FIX = (
    "replace NaN and infinity with None (JSON null) or a string in your dataset, "
    "or store such numbers in a float or ndarray field, which keeps NaN and infinity exactly"
)
KEY_FIX = "use str keys (e.g. str(key)) in your dataset"


def _json_problem(value: Any, where: str) -> tuple[str, str] | None:
    """(why, fix) of what json.dumps would reject or silently change (numpy values, NaN, non-str keys)."""
    if isinstance(value, (float, np.floating)) and not math.isfinite(value):
        return f"{where} is {value}, which JSON cannot represent", NON_FINITE_FIX
    if isinstance(value, np.ndarray) and value.dtype.kind in "fc" and not np.isfinite(value).all():
        return f"{where} is a {describe(value)} holding NaN or infinity, which JSON cannot represent", NON_FINITE_FIX
    if isinstance(value, (np.generic, np.ndarray)) and not isinstance(value, str):
        return f"{where} is a {describe(value)}; JSON needs plain Python values", NUMPY_FIX
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                why = f"{where} has key {key!r} of type {type(key).__name__}; JSON would turn it into a string"
                return why, KEY_FIX
            problem = _json_problem(item, f"{where}[{key!r}]")
            if problem:
                return problem
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            problem = _json_problem(item, f"{where}[{i}]")
            if problem:
                return problem
    return None


def _numpy_to_python(value: Any) -> Any:
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _numpy_to_python(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_numpy_to_python(v) for v in value]
    return value


KIND = JSONKind()
