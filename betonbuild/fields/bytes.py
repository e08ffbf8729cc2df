"""``type: bytes``: a 1-D uint8 array of any length per sample.

Accepted: bytes-like objects and 1-D arrays of a 1-byte integer or bool dtype (``int8``), whose
bytes are stored as they are; wider dtypes are refused (ffcv would cast every value to one byte)."""

from __future__ import annotations

from typing import Any

import numpy as np

from betonbuild.beton.format import BetonFile, FieldInfo
from betonbuild.config.spec import FieldSpec
from betonbuild.fields.builtin_encoders import BytesEncoder
from betonbuild.fields.kind import Fail, StoredSample, describe
from betonbuild.fields.payload import PayloadKind

LOADER_NOTE = (
    "ffcv's BytesDecoder pads every item of a batch to the batch's largest item; the exact length of "
    "sample i is the field's metadata size: ffcv.reader.Reader(path).metadata['{column}']['size'][i]"
)


class BytesKind(PayloadKind):
    name = "bytes"
    # The field's entry in the config, as JSON Schema (config.load assembles the whole schema)
    options_schema = {
        "additionalProperties": False,
        "properties": {
            "type": {},
            "allow_empty": {
                "type": "boolean",
                "default": False,
                "description": "An empty value makes ffcv's Loader corrupt the sample's next field.",
            },
        },
    }

    def build(self, field: FieldSpec):
        return BytesEncoder()

    def check(self, field: FieldSpec, value: Any, fail: Fail) -> np.ndarray:
        if isinstance(value, (bytes, bytearray, memoryview)):
            value = np.frombuffer(bytes(value), dtype=np.uint8)
        elif not isinstance(value, np.ndarray):
            raise fail(f"bytes field got {describe(value)}", "return bytes or a 1-D uint8 numpy array")
        elif value.ndim == 1 and value.dtype.kind in "biu" and value.dtype.itemsize == 1:
            value = np.ascontiguousarray(value).view(np.uint8)  # the same bytes: int8 -1 is the byte 0xff
        if value.dtype != np.uint8 or value.ndim != 1:
            raise fail(
                f"bytes field got {describe(value)}; ffcv would cast every value to one byte",
                "return a 1-D uint8 array (e.g. np.frombuffer(data, dtype=np.uint8))",
            )
        if value.size == 0 and not field.options.get("allow_empty"):
            raise fail(
                "value is empty; ffcv stores a size-0 allocation whose pointer collides with the next one, "
                "and its Loader then returns corrupted data for this sample's following field",
                "store at least one byte (e.g. a length prefix or terminator)",
            )
        return np.ascontiguousarray(value)

    def allow_empty(self, field: FieldSpec) -> bool:
        return bool(field.options.get("allow_empty"))

    def compare(self, field: FieldSpec, stored: StoredSample, value: Any, stats: dict) -> str | None:
        payload = np.asarray(stored.beton.variable_payload(field.name, stored.position))
        if payload.size != value.size:
            return f"stored length {payload.size}, source length {value.size}"
        stats["lengths_equal"] = stats.get("lengths_equal", 0) + 1
        return None if np.array_equal(payload, value) else "bytes differ"

    def report_stats(self, field: FieldSpec, column: int, stats: dict, tolerance: float) -> None:
        stats["loader_lengths"] = LOADER_NOTE.format(column=f"f{column}")

    def summarise(self, beton: BetonFile, info: FieldInfo, position: int) -> str:
        """The length and the first 16 bytes in hex."""
        payload = bytes(beton.variable_payload(info.name, position))
        return f"{len(payload)} bytes: {payload[:16].hex(' ')}{' ...' if len(payload) > 16 else ''}"

    def loader_equal(self, field: FieldSpec, beton: BetonFile, item: Any, position: int) -> bool:
        payload = np.asarray(beton.variable_payload(field.name, position))
        return np.array_equal(item[: payload.size], payload)


KIND = BytesKind()
