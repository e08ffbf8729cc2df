"""Custom fields (ffcv type id 255): the config names a class, ``class: "pkg.module:Class"``, and ``args``.

The class implements ffcv's Field interface (``metadata_type``, ``from_binary``, ``to_binary``,
``encode``, ``get_decoder_class``); subclassing ``ffcv.fields.Field`` is the usual way, but ffcv
only calls these methods. The writer builds ``Class(**args)``; readers register the class under
the field's name (``BetonFile(custom_handlers=...)``, ``ffcv.reader.Reader(custom_handlers=...)``,
``ffcv.loader.Loader(custom_fields=...)``), all from the same config (``custom_handlers(spec)``).

Verification re-encodes the source value with the class and requires the same metadata record
and payload bytes as the file holds. Two optional methods make the report compare decoded values:
``decode(record, payloads) -> value`` (the stored value, without the Loader; it must equal the
source value) and ``from_loader(item) -> value`` (one item of a Loader batch, compared with
``decode``). ``betonbuild.custom.FixedUTF8Field`` is a complete example.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
from functools import cache
from typing import Any

import numpy as np

from betonbuild.beton.format import BetonFile, FieldInfo
from betonbuild.config.spec import FieldSpec
from betonbuild.errors import ConfigError
from betonbuild.fields.kind import OWN_DECODER, Fail, FieldKind, StoredSample, clipped

CLASS_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$")
FIELD_METHODS = ("metadata_type", "from_binary", "to_binary", "encode", "get_decoder_class")
ARGUMENT_BYTES = 1024  # the descriptor's argument slot


def load_class(path: str, where: str = "class") -> type:
    """Imports ``pkg.module:Class`` (the working directory first on sys.path); a ConfigError if it cannot."""
    if not CLASS_PATTERN.match(path or ""):
        raise ConfigError(where, f"{path!r} is not 'pkg.module:Class'")
    module_name, attr = path.split(":")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is a config error the user must fix
        raise ConfigError(
            where, f"cannot import module {module_name!r} of {path}: {type(exc).__name__}: {exc}"
        ) from None
    cls = getattr(module, attr, None)
    if cls is None:
        raise ConfigError(where, f"module {module_name!r} has no attribute {attr!r}")
    if not isinstance(cls, type):
        raise ConfigError(where, f"{path} is a {type(cls).__name__}, not a class")
    missing = [m for m in FIELD_METHODS if not hasattr(cls, m)]
    if missing:
        raise ConfigError(where, f"{path} is not an ffcv Field: it lacks {', '.join(missing)}")
    return cls


def validate(where: str, options: dict[str, Any]) -> None:
    """Config-time checks of a custom field: the class resolves, accepts ``args`` and describes itself."""
    cls = load_class(options["class"], f"{where}.class")
    try:
        field = cls(**options["args"])
    except Exception as exc:  # noqa: BLE001 - the user's constructor rejected the args
        raise ConfigError(
            f"{where}.args", f"{options['class']}(**{options['args']!r}) raised {type(exc).__name__}: {exc}"
        ) from None
    try:
        metadata_type = np.dtype(field.metadata_type)
        arguments = argument_bytes(field)
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(where, f"{options['class']} does not describe itself: {type(exc).__name__}: {exc}") from None
    if metadata_type.hasobject:
        raise ConfigError(where, f"{options['class']}.metadata_type {metadata_type} holds Python objects")
    try:
        cls.from_binary(np.frombuffer(arguments, dtype=np.uint8).copy())
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(
            where, f"{options['class']}.from_binary cannot read its own to_binary(): {type(exc).__name__}: {exc}"
        ) from None


def argument_bytes(field) -> bytes:
    """The 1024 descriptor bytes ``to_binary`` produces (ffcv writes ``to_binary()[0]``)."""
    data = np.asarray(field.to_binary()[0], dtype=np.uint8).reshape(-1).tobytes()
    if len(data) != ARGUMENT_BYTES:
        raise ValueError(f"to_binary() gave {len(data)} bytes; ffcv's descriptor holds exactly {ARGUMENT_BYTES}")
    return data


@cache
def _build(class_path: str, args_json: str):
    return load_class(class_path)(**json.loads(args_json))


def build(field_spec) -> Any:
    """The field instance of a custom FieldSpec (one per class and args)."""
    return _build(field_spec.options["class"], json.dumps(field_spec.options["args"], sort_keys=True))


# kind name -> its class, for the kinds betonbuild stores with its own classes (``betonbuild.fields.shipped``
# registers each as it is defined)
SHIPPED_CLASSES: dict[str, type] = {}


def custom_handlers(spec) -> dict[str, type]:
    """{field name: class} of a dataset's type-255 fields (``type: custom`` and the kinds betonbuild
    ships as classes, e.g. ``ragged_ndarray``), for Reader/Loader/BetonFile registration."""
    handlers = {}
    for f in spec.fields:
        if f.type == KIND.name:
            handlers[f.name] = load_class(f.options["class"])
        elif f.type in SHIPPED_CLASSES:
            handlers[f.name] = SHIPPED_CLASSES[f.type]
    return handlers


def scratch_record(field) -> np.ndarray:
    """A zeroed one-sample metadata destination shaped as ffcv passes it to ``encode``."""
    return np.zeros(1, dtype=[("v", np.dtype(field.metadata_type))])


def encode(field, value, pointers: list[int] | None = None) -> tuple[bytes, list[np.ndarray]]:
    """(metadata record bytes, payloads) of ``value`` encoded by ``field`` into scratch memory.

    Allocation j is given pointer ``pointers[j]`` (0 beyond them), so that a record holding
    pointers can be compared byte for byte with a file's.
    """
    record = scratch_record(field)
    payloads: list[np.ndarray] = []

    def malloc(size):
        size = int(size)
        if size < 0:
            raise ValueError(f"malloc({size})")
        ptr = pointers[len(payloads)] if pointers and len(payloads) < len(pointers) else 0
        payloads.append(np.zeros(size, dtype=np.uint8))
        return ptr, payloads[-1]

    field.encode(record["v"], value, malloc)
    return record.tobytes(), payloads


def encode_problem(field_spec, value) -> str | None:
    """Why the custom field's ``encode`` fails on ``value``, or None if it encodes."""
    try:
        encode(build(field_spec), value)
    except Exception as exc:  # noqa: BLE001 - any failure inside ffcv's worker would kill it
        return f"{field_spec.options['class']}.encode raised {type(exc).__name__}: {exc}"
    return None


def values_equal(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001
        return False


def normalise_pointers(record: bytes, allocations: list[tuple[int, int]]) -> bytes:
    """The record with every 8-byte little-endian copy of an allocation's pointer replaced by its ordinal."""
    out = bytearray(record)
    for ordinal, (ptr, _) in enumerate(allocations):
        needle = int(ptr).to_bytes(8, "little")
        marker = b"\xff\xff\xff\xff" + ordinal.to_bytes(4, "little")
        at = bytes(out).find(needle)
        while at >= 0:
            out[at : at + 8] = marker
            at = bytes(out).find(needle, at + 8)
    return bytes(out)


class CustomKind(FieldKind):
    name = "custom"
    # The field's entry in the config, as JSON Schema (config.load assembles the whole schema)
    options_schema = {
        "additionalProperties": False,
        "required": ["class"],
        "properties": {
            "type": {},
            "class": {
                "type": "string",
                "pattern": "^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$",
                "description": "pkg.module:Class implementing ffcv's Field interface (type id 255).",
            },
            "args": {"type": "object", "default": {}, "description": "Keyword arguments of the class's constructor."},
        },
    }
    verify_check = "custom_fields"
    custom_allocations = True
    class_decodes_arguments = True

    def normalise(self, where: str, options: dict[str, Any]) -> dict[str, Any]:
        validate(where, options)  # the class must resolve and accept its args: a config error otherwise
        return options

    def metadata_type(self, field: FieldSpec) -> np.dtype:
        return np.dtype(self.build(field).metadata_type)  # the class declares its own

    def adapter_references(self, field: FieldSpec) -> list[str]:
        return [field.options["class"]]

    def build(self, field: FieldSpec) -> Any:
        return build(field)

    def check(self, field: FieldSpec, value: Any, fail: Fail) -> Any:
        """Custom values pass through as they are; only their encode must not fail (it would kill ffcv's worker)."""
        problem = encode_problem(field, value)
        if problem:
            raise fail(problem, "return a value the class's encode accepts, or fix the class")
        return value

    def descriptor_problem(self, field: FieldSpec, info: FieldInfo) -> str | None:
        if info.arguments != argument_bytes(self.build(field)):
            return (
                f"field '{field.name}': the descriptor's arguments differ from "
                f"{field.options['class']}(**{field.options['args']!r}).to_binary()"
            )
        return None

    def compare_needs_ffcv(self, field: FieldSpec) -> bool:
        return True  # the class is an ffcv Field

    def compare(self, field: FieldSpec, stored: StoredSample, value: Any, stats: dict) -> str | None:
        """Re-encodes the source value and requires the file's record and payload bytes; then ``decode``."""
        problem, used = _compare_encoded(self.build(field), field, stored, value, stats)
        stored.claim(used)
        return problem

    def report_stats(self, field: FieldSpec, column: int, stats: dict, tolerance: float) -> None:
        stats["class"] = field.options["class"]
        stats["comparison"] = "re-encoded source bytes" + (
            " and decoded value" if hasattr(self.build(field), "decode") else ""
        )

    def loader_pipeline(self, field: FieldSpec, beton: BetonFile, n: int) -> str:
        return OWN_DECODER  # the class's get_decoder_class, registered through custom_fields

    def loader_comparable(self, field: FieldSpec) -> bool:
        instance = self.build(field)
        return hasattr(instance, "from_loader") and hasattr(instance, "decode")

    def loader_equal(self, field: FieldSpec, beton: BetonFile, item: Any, position: int) -> bool:
        instance = self.build(field)
        payloads = [np.asarray(beton.read(p, s)) for p, s in beton.custom_allocations(position)]
        return values_equal(instance.from_loader(item), instance.decode(beton.metadata[field.name][position], payloads))

    def describe_arguments(self, info: FieldInfo) -> dict[str, Any]:
        """The handler's class and metadata type, and the argument bytes (only the class reads them)."""
        stripped = info.arguments.rstrip(b"\0")
        handler = info.handler
        described = {"class": f"{type(handler).__module__}.{type(handler).__qualname__}"} if handler else {}
        return {
            **described,
            "metadata_type": str(info.metadata_type),
            "arguments_hex": stripped[:64].hex(),
            "arguments_bytes_used": len(stripped),
        }

    def summarise(self, beton: BetonFile, info: FieldInfo, position: int) -> Any:
        """The class's ``decode`` of the value (its repr, clipped), else the raw record."""
        handler = info.handler
        if handler is None or not hasattr(handler, "decode"):
            return super().summarise(beton, info, position)
        record = beton.metadata[info.name][position]
        payloads = [np.asarray(beton.read(p, s)) for p, s in beton.custom_allocations(position)]
        try:
            value = handler.decode(record, payloads)
        except Exception as exc:  # noqa: BLE001 - the class's own decode of hostile bytes
            return f"unreadable: {type(handler).__name__}.decode raised {type(exc).__name__}: {exc}"
        return clipped(repr(value), 80)

    def digest_column(self, beton: BetonFile, info: FieldInfo, positions: np.ndarray, meta: np.ndarray):
        """``<u8`` record length, then the record with the sample's allocation pointers normalised."""

        def parts(i: int, position: int, allocations: list[tuple[int, int]]) -> tuple[bytes, bytes]:
            record = normalise_pointers(beton.record_bytes(info.name, position), allocations)
            return np.uint64(len(record)).astype("<u8").tobytes(), record

        return parts


def _compare_encoded(
    instance, field: FieldSpec, stored: StoredSample, value: Any, stats: dict
) -> tuple[str | None, int]:
    """(why the file differs from ``instance``'s re-encoding of the value or None, the allocations it takes)."""
    beton, position = stored.beton, stored.position
    allocations = stored.allocations()
    record, payloads = encode(instance, value, [p for p, _ in allocations])
    if record != beton.record_bytes(field.name, position):
        return "the metadata record differs from the re-encoded source value", len(payloads)
    if len(payloads) > len(allocations):
        return f"encode allocates {len(payloads)} payloads, the file has {len(allocations)}", len(payloads)
    found = []
    for j, payload in enumerate(payloads):
        ptr, size = allocations[j]
        if size != payload.size:
            return f"payload {j} is {size} bytes in the file, {payload.size} re-encoded", len(payloads)
        found.append(np.asarray(beton.read(ptr, size)))
        if not np.array_equal(found[-1], payload):
            return f"payload {j} differs from the re-encoded source value", len(payloads)
    stats["reencoded_equal"] = stats.get("reencoded_equal", 0) + 1
    if hasattr(instance, "decode"):
        decoded = instance.decode(beton.metadata[field.name][position], found)
        if not values_equal(decoded, value):
            return f"decodes to {decoded!r}, the source holds {value!r}", len(payloads)
        stats["decoded_equal"] = stats.get("decoded_equal", 0) + 1
    return None, len(payloads)


KIND = CustomKind()
