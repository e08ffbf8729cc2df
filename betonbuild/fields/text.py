"""``type: text``: a Python ``str`` per sample, stored as its exact UTF-8 bytes (no padding, NUL
characters kept). The Loader gives the zero-padded bytes and ``<name>_len``; ``betonbuild.texts``
turns them back into the strings."""

from __future__ import annotations

from typing import Any

import numpy as np

from betonbuild.config.spec import FieldSpec
from betonbuild.fields.kind import Fail, clipped, describe
from betonbuild.fields.ragged import RaggedKind
from betonbuild.fields.ragged_field import TextField


class TextKind(RaggedKind):
    name = "text"
    field_class = TextField
    options_schema = {
        "additionalProperties": False,
        "required": ["max_bytes"],
        "properties": {
            "type": {},
            "max_bytes": {
                "type": "integer",
                "minimum": 1,
                "description": "The most UTF-8 bytes one string may take (checked for every sample).",
            },
        },
    }

    def normalise(self, where: str, options: dict[str, Any]) -> dict[str, Any]:
        return options

    def check(self, field: FieldSpec, value: Any, fail: Fail) -> str:
        if isinstance(value, (bytes, bytearray, memoryview)):
            try:
                bytes(value).decode("utf-8")
                why = "text field got bytes (valid UTF-8)"
            except UnicodeDecodeError as exc:
                why = f"text field got bytes that are not UTF-8 ({exc})"
            raise fail(why, "return a str (e.g. data.decode('utf-8')), or store binary data in a `bytes` field")
        if not isinstance(value, str):
            raise fail(f"text field got {describe(value)}", "return a Python str")
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise fail(
                f"string {clipped(repr(value), 40)} is not valid UTF-8 text ({exc.reason} at character {exc.start})",
                "remove lone surrogates in the dataset (e.g. s.encode('utf-8', 'replace').decode())",
            ) from None
        if size > field.options["max_bytes"]:
            raise fail(
                f"string {clipped(repr(value), 40)} is {size} UTF-8 bytes; the field's max_bytes is "
                f"{field.options['max_bytes']}",
                "raise max_bytes, or truncate such strings in the dataset",
            )
        return value

    def decoded_bytes(self, field: FieldSpec, page_size: int) -> int:
        return min(page_size, field.options["max_bytes"])

    def histogram_values(self, beton, field: FieldSpec) -> np.ndarray:
        return np.asarray(beton.metadata[field.name]["size"]).astype(np.int64)

    histogram_title = "UTF-8 bytes per sample"

    def summary_text(self, value: str) -> str:
        return clipped(repr(value), 80)


KIND = TextKind()
