"""What the field kinds betonbuild ships as ffcv custom fields (type id 255) share.

``ragged_ndarray``, ``int_list``, ``text`` and ``gray_image`` are stored by classes of betonbuild
(``betonbuild.fields.ragged_field``, ``betonbuild.fields.gray_field``) whose descriptor arguments
start with ``MAGIC`` and the kind's name, then the class's arguments as JSON. A file therefore says
which class reads each of these fields: ``betonbuild.loader_fields(path)`` finds them without the
config, and ``betonbuild inspect`` decodes them with no ``--custom``.

Everything else (re-encoding comparison, digest, allocations) is ``type: custom``'s machinery
(``betonbuild.fields.custom``), given the kind's own class instead of a config's ``class:``.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import numpy as np

from betonbuild.beton.format import CUSTOM_TYPE_ID, BetonFile, FieldInfo
from betonbuild.config.spec import FieldSpec
from betonbuild.fields.builtin_encoders import no_arguments
from betonbuild.fields.custom import ARGUMENT_BYTES, SHIPPED_CLASSES, CustomKind

MAGIC = b"betonbuild kind\0"  # the first 16 argument bytes of a shipped kind's descriptor
NAME_BYTES = 32  # the kind's name, NUL-padded, after MAGIC
_JSON_AT = len(MAGIC) + NAME_BYTES + 4  # <u4 length of the JSON arguments, then the JSON


def arguments_record(kind: str, args: dict[str, Any]):
    """The 1024-byte descriptor arguments, shaped as ffcv's fields return ``to_binary()``."""
    text = json.dumps(args, sort_keys=True, separators=(",", ":")).encode()
    if _JSON_AT + len(text) > ARGUMENT_BYTES:
        room = ARGUMENT_BYTES - _JSON_AT
        raise ValueError(f"the {kind} field's arguments take {len(text)} bytes of JSON; at most {room} fit")
    data = bytearray(ARGUMENT_BYTES)
    data[: len(MAGIC)] = MAGIC
    data[len(MAGIC) : len(MAGIC) + len(kind)] = kind.encode("ascii")
    data[_JSON_AT - 4 : _JSON_AT] = len(text).to_bytes(4, "little")
    data[_JSON_AT : _JSON_AT + len(text)] = text
    result = no_arguments()
    result[0][:] = np.frombuffer(bytes(data), dtype=np.uint8)
    return result


def _raw(arguments) -> bytes:
    """The argument bytes, given as bytes (``FieldInfo.arguments``) or as ffcv's uint8 array."""
    if isinstance(arguments, (bytes, bytearray, memoryview)):
        return bytes(arguments)
    return np.ascontiguousarray(arguments).view(np.uint8).reshape(-1).tobytes()


def shipped_kind_name(arguments) -> str | None:
    """The kind a descriptor's arguments name (``MAGIC`` + name), or None for any other class's."""
    data = _raw(arguments)
    if not data.startswith(MAGIC):
        return None
    return data[len(MAGIC) : len(MAGIC) + NAME_BYTES].rstrip(b"\0").decode("ascii", errors="replace")


def parse_arguments(arguments, kind: str) -> dict[str, Any]:
    """The JSON arguments of a descriptor written by ``arguments_record(kind, ...)``; ValueError otherwise."""
    found = shipped_kind_name(arguments)
    if found != kind:
        raise ValueError(f"the descriptor's arguments are not a betonbuild {kind} field's (they name {found!r})")
    data = _raw(arguments)
    length = int.from_bytes(data[_JSON_AT - 4 : _JSON_AT], "little")
    if _JSON_AT + length > len(data):
        raise ValueError(f"JSON arguments of {length} bytes do not fit in the descriptor")
    return json.loads(data[_JSON_AT : _JSON_AT + length].decode())


@cache
def _instance(cls: type, args_json: str):
    return cls(**json.loads(args_json))


class ShippedKind(CustomKind):
    """A kind stored by one of betonbuild's classes: its config keys are the class's arguments."""

    type_id = CUSTOM_TYPE_ID
    verify_check = "variable_fields"
    class_decodes_arguments = False  # the arguments are JSON betonbuild reads (describe_arguments)
    field_class: type = object  # the class that writes and reads the kind

    def class_arguments(self, field: FieldSpec) -> dict[str, Any]:
        """The class's constructor arguments, from the normalised config options."""
        return {k: v for k, v in field.options.items() if k != "type"}

    def normalise(self, where: str, options: dict[str, Any]) -> dict[str, Any]:
        return options

    def build(self, field: FieldSpec) -> Any:
        return _instance(self.field_class, json.dumps(self.class_arguments(field), sort_keys=True))

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        SHIPPED_CLASSES[cls.name] = cls.field_class  # custom_handlers(spec) registers it for readers

    def adapter_references(self, field: FieldSpec) -> list[str]:
        return []  # betonbuild's own code: not the user's

    def compare_needs_ffcv(self, field: FieldSpec) -> bool:
        return False  # the classes import ffcv only for their Loader decoders

    def report_stats(self, field: FieldSpec, column: int, stats: dict, tolerance: float) -> None:
        stats["comparison"] = "re-encoded source bytes and decoded value"

    def loader_comparable(self, field: FieldSpec) -> bool:
        return True

    def describe_arguments(self, info: FieldInfo) -> dict[str, Any]:
        try:
            return parse_arguments(info.arguments, self.name)
        except ValueError as exc:
            return {"note": f"unreadable arguments: {exc}"}

    def stored_value(self, beton: BetonFile, name: str, position: int, handler=None) -> Any:
        """The value stored at ``position``, read through the record's own pointer (several custom
        fields of one sample each find their allocation so)."""
        record = beton.metadata[name][position]
        size = int(record["size"])
        payloads = [np.asarray(beton.read(int(record["ptr"]), size))]
        handler = handler if handler is not None else beton.fields[beton_index(beton, name)].handler
        return handler.decode(record, payloads)

    def loader_equal(self, field: FieldSpec, beton: BetonFile, item: Any, position: int) -> bool:
        return self.build(field).loader_item_equal(item, self.stored_value(beton, field.name, position))

    def loader_extra_outputs(self, field: FieldSpec) -> dict:
        return self.build(field).extra_outputs(field.name)

    def loader_extra_equal(self, field: FieldSpec, beton: BetonFile, item: Any, position: int) -> bool:
        """``<name>_shape`` is the record's shape, ``<name>_len`` its first dimension."""
        shape = np.asarray(beton.metadata[field.name]["shape"][position]).reshape(-1)
        item = np.asarray(item).reshape(-1)
        return np.array_equal(item, shape if item.size == shape.size else shape[:1])

    def summarise(self, beton: BetonFile, info: FieldInfo, position: int) -> Any:
        try:
            return self.summary_text(self.stored_value(beton, info.name, position, info.handler))
        except Exception as exc:  # noqa: BLE001 - hostile bytes: say so instead of failing the whole inspect
            return f"unreadable: {type(exc).__name__}: {exc}"

    def summary_text(self, value: Any) -> str:
        raise NotImplementedError(self.name)

    def data_bytes(self, beton: BetonFile, info: FieldInfo) -> int:
        return int(beton.metadata[info.name]["size"].sum(dtype=np.uint64))


def beton_index(beton: BetonFile, name: str) -> int:
    return next(i for i, f in enumerate(beton.fields) if f.name == name)
