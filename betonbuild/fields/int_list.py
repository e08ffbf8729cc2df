"""``type: int_list``: a variable-length list of integers per sample (multi-label targets, token or
id lists), stored exactly. The Loader gives a (batch, longest) array padded with ``pad_value``
(default 0) and ``<name>_len``, or with ``multi_hot: W`` a (batch, W) uint8 vector with a 1 at
every listed id."""

from __future__ import annotations

from typing import Any

import numpy as np

from betonbuild.config.spec import FieldSpec
from betonbuild.errors import ConfigError
from betonbuild.fields.kind import Fail, clipped, describe
from betonbuild.fields.ndarray import numpy_dtype
from betonbuild.fields.ragged import MAX_ELEMENTS, RaggedKind
from betonbuild.fields.ragged_field import IntListField


class IntListKind(RaggedKind):
    name = "int_list"
    field_class = IntListField
    options_schema = {
        "additionalProperties": False,
        "required": ["max_elements"],
        "properties": {
            "type": {},
            "dtype": {"type": "string", "default": "int64"},
            "max_elements": MAX_ELEMENTS,
            "multi_hot": {"type": ["integer", "null"], "minimum": 1, "default": None},
            "pad_value": {
                "type": "integer",
                "default": 0,
                "description": "What fills the padded batch after each list (e.g. -1 or -100, an ignore index).",
            },
        },
    }

    def normalise(self, where: str, options: dict[str, Any]) -> dict[str, Any]:
        dtype = numpy_dtype(f"{where}.dtype", options["dtype"])
        if dtype.kind not in "iu":
            raise ConfigError(f"{where}.dtype", f"{options['dtype']!r} is not an integer dtype (int64, int32...)")
        options["dtype"] = dtype.str
        if options["multi_hot"] is not None and options["multi_hot"] - 1 > np.iinfo(dtype).max:
            raise ConfigError(f"{where}.multi_hot", f"ids up to {options['multi_hot'] - 1} do not fit in {dtype}")
        pad = options.pop("pad_value")  # kept only when set: the rule params of other fields stay as they were
        if pad:
            info = np.iinfo(dtype)
            if not info.min <= pad <= info.max:
                raise ConfigError(
                    f"{where}.pad_value", f"{pad} does not fit in {dtype} ({info.min}..{info.max}): pick another"
                )
            if options["multi_hot"] is not None:
                raise ConfigError(
                    f"{where}.pad_value", "the multi_hot decoder pads nothing: remove pad_value or multi_hot"
                )
            options["pad_value"] = pad
        return options

    def class_arguments(self, field: FieldSpec) -> dict[str, Any]:
        o = field.options
        return {
            "dtype": o["dtype"],
            "ndim": 1,
            "max_elements": o["max_elements"],
            "multi_hot": o["multi_hot"] or 0,
            "pad_value": o.get("pad_value", 0),
        }

    def check(self, field: FieldSpec, value: Any, fail: Fail) -> np.ndarray:
        want = np.dtype(field.options["dtype"])
        fix = f"return a list of Python ints or a 1-D integer numpy array whose values fit {want}"
        if isinstance(value, (list, tuple)):
            bad = next((v for v in value if type(v) is not int and not isinstance(v, np.integer)), None)
            if bad is not None:
                raise fail(f"int_list value holds {describe(bad)}, not an integer", fix)
            value = np.array([int(v) for v in value], dtype=object)
        elif not isinstance(value, np.ndarray) or value.dtype.kind not in "iu":
            raise fail(f"int_list field got {describe(value)}", fix)
        if value.ndim != 1:
            raise fail(f"int_list value has shape {value.shape}; it must be 1-D", "flatten it, or use ragged_ndarray")
        info = np.iinfo(want)
        if value.size and (value.min() < info.min or value.max() > info.max):
            raise fail(f"int_list values {clipped(repr(value.tolist()), 60)} do not fit the field's dtype {want}", fix)
        value = value.astype(want)
        width = field.options["multi_hot"]
        if width is not None and value.size and (value.min() < 0 or value.max() >= width):
            raise fail(
                f"int_list ids {clipped(repr(value.tolist()), 60)} are outside 0..{width - 1} (multi_hot: {width})",
                "raise multi_hot to the number of classes, or fix the ids in the dataset",
            )
        self.check_size(field, value, fail)
        return value

    def summary_text(self, value: np.ndarray) -> str:
        return f"{value.size} ids: " + clipped(repr(value.tolist()), 72)


KIND = IntListKind()
