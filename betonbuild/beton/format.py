"""Reads the .beton format without ffcv's Loader, via numpy memmap, bounds-checked.

Layout (all little-endian): a 24-byte header, one 1041-byte descriptor per field, the metadata
table (one aligned record per sample), page-aligned data pages, then the allocation table.
Every size and offset is checked against the file size before anything is allocated, so a
truncated or hostile file gives a ``BetonFormatError``, never a crash or a huge allocation:
parsing allocates a constant amount; the allocation-table index (``_sorted_table``, for JPEG sizes
and custom fields) a small multiple of the table, which is part of the file. The structural checks
read the table in bounded windows (``runs``).

This module holds the format's tables and the reader. Beside it: ``payloads`` decodes stored
values (JPEG, JSON), ``checks`` holds the structural rules ffcv's Loader relies on, ``describe``
the description behind ``betonbuild inspect``, ``digest`` the content digest, ``merge`` the join
of part files.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from betonbuild.beton.matching import match_sorted, sort_allocations
from betonbuild.errors import BetonFormatError
from betonbuild.mapped_pages import release_mapped

HEADER_TYPE = np.dtype(
    [
        ("version", "<u2"),
        ("num_fields", "<u2"),
        ("page_size", "<u4"),
        ("num_samples", "<u8"),
        ("alloc_table_ptr", "<u8"),
    ],
    align=True,
)
FIELD_DESC_TYPE = np.dtype([("type_id", "<u1"), ("name", ("<u1", 16)), ("arguments", ("<u1", (1024,)))], align=True)
ALLOC_TABLE_TYPE = np.dtype([("sample_id", "<u8"), ("ptr", "<u8"), ("size", "<u8")])
NDARRAY_ARGS_TYPE = np.dtype([("shape", "<u8", 32), ("type_length", "<u8")])
FORMAT_VERSION = 2

# ffcv's descriptor type ids (``ffcv.types.TYPE_ID_HANDLER``): the file format's own table. The
# reader must parse any file, whatever config wrote it, so it knows them; everything else asks
# the field kind (``betonbuild.fields``).
FLOAT_TYPE_ID = 0
INT_TYPE_ID = 1
RGB_IMAGE_TYPE_ID = 2
BYTES_TYPE_ID = 3
NDARRAY_TYPE_ID = 4
JSON_TYPE_ID = 5
TORCH_TENSOR_TYPE_ID = 6
CUSTOM_TYPE_ID = 255
# One fixed-shape payload per sample, its dtype and shape in the descriptor's arguments.
ARRAY_TYPE_IDS = (NDARRAY_TYPE_ID, TORCH_TENSOR_TYPE_ID)
# One variable-size payload per sample, its {ptr, size} in the metadata record.
PAYLOAD_TYPE_IDS = (BYTES_TYPE_ID, JSON_TYPE_ID)

TYPE_NAMES = {
    FLOAT_TYPE_ID: "float",
    INT_TYPE_ID: "int",
    RGB_IMAGE_TYPE_ID: "rgb_image",
    BYTES_TYPE_ID: "bytes",
    NDARRAY_TYPE_ID: "ndarray",
    JSON_TYPE_ID: "json",
    TORCH_TENSOR_TYPE_ID: "torch_tensor",
    CUSTOM_TYPE_ID: "custom",
}
_PAYLOAD_RECORD = np.dtype([("ptr", "<u8"), ("size", "<u8")])
METADATA_TYPES = {
    FLOAT_TYPE_ID: np.dtype("<f8"),
    INT_TYPE_ID: np.dtype("<i8"),
    RGB_IMAGE_TYPE_ID: np.dtype([("mode", "<u1"), ("width", "<u2"), ("height", "<u2"), ("data_ptr", "<u8")]),
    BYTES_TYPE_ID: _PAYLOAD_RECORD,
    NDARRAY_TYPE_ID: np.dtype("<u8"),
    JSON_TYPE_ID: _PAYLOAD_RECORD,
    TORCH_TENSOR_TYPE_ID: np.dtype("<u8"),
}
WHOLE_COLUMN = ""  # in a pointer-column list: the field's metadata column itself is the pointer
# Metadata columns of ffcv's built-in fields that hold absolute file offsets.
BUILTIN_POINTER_COLUMNS: dict[int, tuple[str, ...]] = {
    FLOAT_TYPE_ID: (),
    INT_TYPE_ID: (),
    RGB_IMAGE_TYPE_ID: ("data_ptr",),  # packed {mode u1, width <u2, height <u2, data_ptr <u8}
    BYTES_TYPE_ID: ("ptr",),
    NDARRAY_TYPE_ID: (WHOLE_COLUMN,),
    JSON_TYPE_ID: ("ptr",),
    TORCH_TENSOR_TYPE_ID: (WHOLE_COLUMN,),
}
# Built-in fields whose metadata points at one allocation per sample: (2, 3, 4, 5, 6).
POINTER_TYPES = tuple(type_id for type_id, columns in BUILTIN_POINTER_COLUMNS.items() if columns)
IMAGE_MODE_JPEG, IMAGE_MODE_RAW = 0, 1
MAX_CUSTOM_RECORD = 1 << 20  # bytes of one custom field's metadata record
_NAME_CHARS = set(range(0x20, 0x7F))


def page_aligned(offset: int, page_size: int) -> int:
    """``offset`` rounded up to a multiple of ``page_size``: where the data pages after it start."""
    return -(-offset // page_size) * page_size


@dataclass(frozen=True)
class FieldInfo:
    name: str
    type_id: int
    type_name: str
    metadata_type: np.dtype
    arguments: bytes
    dtype: np.dtype | None = None  # the payload dtype of an ARRAY_TYPE_IDS field
    shape: tuple[int, ...] | None = None
    handler: Any = None  # the custom field instance (type 255), built by its class's from_binary

    @property
    def payload_bytes(self) -> int:
        """Bytes of one sample's payload of an ndarray/torch_tensor field (0 for other types)."""
        if self.dtype is None:
            return 0
        n = self.dtype.itemsize
        for s in self.shape:
            n *= s
        return n


class UnregisteredCustomField(BetonFormatError):
    """A type-255 field whose class was not given: its metadata layout is unknown to the reader.

    Carries what could be parsed (``header`` and ``fields``), so ``inspect`` can still show it.
    """

    def __init__(self, message: str, header: dict, fields: list[FieldInfo | dict]):
        super().__init__(message)
        self.header = header
        self.fields = fields


class BetonFile:
    """A parsed, memory-mapped .beton. ``metadata`` is a structured array with one column per field.

    ``custom_handlers`` maps the name of each custom (type 255) field to its Field class, as
    ``ffcv.reader.Reader(custom_handlers=...)`` does; its ``from_binary`` builds the handler.
    """

    def __init__(self, path: str | os.PathLike, custom_handlers: Mapping[str, type] | None = None):
        self.path = str(path)
        self.custom_handlers = dict(custom_handlers or {})
        self.size = os.path.getsize(self.path)
        if self.size < HEADER_TYPE.itemsize:
            raise BetonFormatError(f"{self.path}: {self.size} bytes is too small for a .beton header")
        # A plain ndarray view of the mapping: slicing np.memmap runs Python code on every access.
        self.mm = np.memmap(self.path, dtype=np.uint8, mode="r").view(np.ndarray)
        header = self.mm[: HEADER_TYPE.itemsize].view(HEADER_TYPE)[0]
        self.version = int(header["version"])
        self.num_fields = int(header["num_fields"])
        self.page_size = int(header["page_size"])
        self.num_samples = int(header["num_samples"])
        self.alloc_table_ptr = int(header["alloc_table_ptr"])
        self._check_header()
        self.metadata_start = HEADER_TYPE.itemsize + FIELD_DESC_TYPE.itemsize * self.num_fields
        self.fields = self._read_descriptors()
        self.metadata_type = np.dtype([(f.name, f.metadata_type) for f in self.fields], align=True)
        if self.metadata_type.itemsize == 0:
            raise BetonFormatError(f"{self.path}: the fields' metadata records are 0 bytes long")
        record = self.metadata_type.itemsize
        if self.num_samples > (self.alloc_table_ptr - self.metadata_start) // record:
            raise BetonFormatError(
                f"{self.path}: metadata for {self.num_samples} samples would end at byte "
                f"{self.metadata_start + record * self.num_samples}, "
                f"past the allocation table at {self.alloc_table_ptr}"
            )
        self.metadata_end = self.metadata_start + record * self.num_samples
        self.metadata = self.mm[self.metadata_start : self.metadata_end].view(self.metadata_type)
        self.data_start = page_aligned(self.metadata_end, self.page_size)
        self.page_shift = self.page_size.bit_length() - 1

    # --- parsing ---------------------------------------------------------------------------------

    def _check_header(self) -> None:
        if self.version != FORMAT_VERSION:
            raise BetonFormatError(f"{self.path}: format version {self.version}, expected {FORMAT_VERSION}")
        if self.page_size == 0 or self.page_size & (self.page_size - 1):
            raise BetonFormatError(f"{self.path}: page size {self.page_size} is not a power of two")
        if self.alloc_table_ptr == 0:
            raise BetonFormatError(f"{self.path}: allocation table pointer is 0: the writer never finished this file")
        if not HEADER_TYPE.itemsize <= self.alloc_table_ptr <= self.size:
            raise BetonFormatError(
                f"{self.path}: allocation table pointer {self.alloc_table_ptr} is outside the file ({self.size} bytes)"
            )
        if (self.size - self.alloc_table_ptr) % ALLOC_TABLE_TYPE.itemsize:
            raise BetonFormatError(f"{self.path}: allocation table size is not a whole number of entries")
        if self.num_fields == 0:
            raise BetonFormatError(f"{self.path}: header declares no fields")
        # Each sample needs at least one metadata byte, so more samples than bytes is impossible.
        if self.num_samples > self.size:
            raise BetonFormatError(f"{self.path}: header claims {self.num_samples} samples in a {self.size}-byte file")
        if HEADER_TYPE.itemsize + FIELD_DESC_TYPE.itemsize * self.num_fields > self.alloc_table_ptr:
            raise BetonFormatError(f"{self.path}: {self.num_fields} field descriptors do not fit in the file")

    def _header_dict(self) -> dict[str, int]:
        return {
            "version": self.version,
            "num_fields": self.num_fields,
            "page_size": self.page_size,
            "num_samples": self.num_samples,
            "alloc_table_ptr": self.alloc_table_ptr,
            "bytes": self.size,
        }

    def _read_descriptors(self) -> list[FieldInfo]:
        descs = self.mm[HEADER_TYPE.itemsize : self.metadata_start].view(FIELD_DESC_TYPE)
        fields: list[FieldInfo] = []
        unregistered: list[str] = []
        for i, desc in enumerate(descs):
            type_id = int(desc["type_id"])
            name = self._field_name(i, bytes(desc["name"]))
            arguments = bytes(desc["arguments"])
            if type_id == CUSTOM_TYPE_ID:
                if name not in self.custom_handlers:
                    unregistered.append(name)
                    fields.append(FieldInfo(name, type_id, TYPE_NAMES[type_id], np.dtype("V0"), arguments))
                    continue
                fields.append(self._custom_field(i, name, arguments, desc["arguments"]))
                continue
            if type_id not in METADATA_TYPES:
                raise BetonFormatError(f"{self.path}: field {i} ('{name}') has unknown type id {type_id}")
            dtype = shape = None
            if type_id in ARRAY_TYPE_IDS:
                dtype, shape = self._ndarray_args(i, desc["arguments"])
            fields.append(
                FieldInfo(name, type_id, TYPE_NAMES[type_id], METADATA_TYPES[type_id], arguments, dtype, shape)
            )
        if len({f.name for f in fields}) != len(fields):
            raise BetonFormatError(f"{self.path}: two fields share a name")
        if unregistered:
            names = ", ".join(f"'{n}'" for n in unregistered)
            raise UnregisteredCustomField(
                f"{self.path}: field(s) {names} are custom fields (type id {CUSTOM_TYPE_ID}) whose metadata layout "
                f"only their class knows; register it: "
                f"BetonFile(path, custom_handlers={{'{unregistered[0]}': Class}}), "
                f"ffcv's Reader(custom_handlers=...) / Loader(custom_fields=...), or "
                f"`betonbuild inspect --custom {unregistered[0]}=module:Class`",
                self._header_dict(),
                fields,
            )
        return fields

    def _field_name(self, i: int, raw: bytes) -> str:
        """ffcv writes the ASCII name padded with NULs; a 16-byte name has no NUL at all."""
        name, nul, rest = raw.partition(b"\0")
        if not name:
            raise BetonFormatError(f"{self.path}: field {i} has an empty name")
        if any(b not in _NAME_CHARS for b in name):
            why = "has no NUL terminator and " if not nul else ""
            raise BetonFormatError(
                f"{self.path}: field {i} name {raw!r} {why}is not printable ASCII; the descriptor is corrupt"
            )
        if rest.strip(b"\0"):
            raise BetonFormatError(f"{self.path}: field {i} name {raw!r} has bytes after its NUL terminator")
        return name.decode("ascii")

    def _custom_field(self, i: int, name: str, arguments: bytes, raw_arguments: np.ndarray) -> FieldInfo:
        cls = self.custom_handlers[name]
        try:
            handler = cls.from_binary(np.array(raw_arguments, dtype=np.uint8))
            metadata_type = np.dtype(handler.metadata_type)
        except Exception as exc:  # noqa: BLE001 - the class's own parse of hostile arguments
            raise BetonFormatError(
                f"{self.path}: field {i} ('{name}'): {cls.__name__}.from_binary rejected the descriptor's "
                f"arguments ({type(exc).__name__}: {exc})"
            ) from None
        if metadata_type.hasobject or metadata_type.itemsize > MAX_CUSTOM_RECORD:
            raise BetonFormatError(
                f"{self.path}: field {i} ('{name}'): {cls.__name__} declares an unusable metadata type {metadata_type}"
            )
        return FieldInfo(name, CUSTOM_TYPE_ID, TYPE_NAMES[CUSTOM_TYPE_ID], metadata_type, arguments, handler=handler)

    def _ndarray_args(self, i: int, arguments: np.ndarray) -> tuple[np.dtype, tuple[int, ...]]:
        header = arguments[: NDARRAY_ARGS_TYPE.itemsize].view(NDARRAY_ARGS_TYPE)[0]
        type_length = int(header["type_length"])
        if type_length > arguments.size - NDARRAY_ARGS_TYPE.itemsize:
            raise BetonFormatError(f"{self.path}: field {i} dtype description length {type_length} is too long")
        try:
            descr = json.loads(bytes(arguments[NDARRAY_ARGS_TYPE.itemsize :][:type_length]).decode("ascii"))
            dtype = np.dtype([tuple(x) for x in descr])["f0"] if len(descr) == 1 else None
        except Exception as exc:  # noqa: BLE001 - any parse failure means a corrupt descriptor
            raise BetonFormatError(f"{self.path}: field {i} has an unreadable dtype description ({exc})") from None
        if (
            dtype is None
            or dtype.hasobject
            or dtype.fields is not None
            or dtype.subdtype is not None
            or dtype.itemsize == 0
            or dtype.kind not in "biufcmMSU"
        ):
            raise BetonFormatError(f"{self.path}: field {i} has an unsupported dtype description {descr!r}")
        shape = [int(s) for s in header["shape"]]
        while shape and shape[-1] == 0:
            shape.pop()
        if any(s == 0 for s in shape):
            raise BetonFormatError(f"{self.path}: field {i} has a zero inside its shape {shape}")
        nbytes = dtype.itemsize
        for s in shape:
            nbytes *= s
            if nbytes > self.page_size:
                raise BetonFormatError(f"{self.path}: field {i} shape {shape} is larger than a page")
        return dtype, tuple(shape)

    # --- the allocation table --------------------------------------------------------------------

    @cached_property
    def alloc_table(self) -> np.ndarray:
        return self.mm[self.alloc_table_ptr :].view(ALLOC_TABLE_TYPE)

    @cached_property
    def _sorted_table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ptr, sample_id, size) sorted by pointer, then sample, then size."""
        table = self.alloc_table
        return sort_allocations(table["ptr"], table["sample_id"], table["size"])

    def forget_sorted_table(self) -> None:
        """Releases the pointer-sorted copy of the table (32 bytes an allocation) and unmaps the file's pages
        (cached still, mapped again when read; mapped, they count in the job's RSS: 24 bytes an allocation)."""
        self.__dict__.pop("_sorted_table", None)
        release_mapped(self.mm)

    def match_allocations(self, ptrs: np.ndarray, samples: np.ndarray, sizes: np.ndarray | None = None) -> np.ndarray:
        """Index (into the sorted table) of the allocation of each (ptr, sample[, size]); -1 where none
        (``match_sorted`` over the whole table)."""
        return match_sorted(self._sorted_table, ptrs, samples, sizes)

    def allocation_size(self, row: int, ptr: int) -> int:
        at = int(self.match_allocations(np.array([ptr], dtype=np.uint64), np.array([row], dtype=np.uint64))[0])
        if at < 0:
            raise BetonFormatError(f"{self.path}: sample {row} pointer {ptr} is not in the allocation table")
        return int(self._sorted_table[2][at])

    def pointer_column(self, info: FieldInfo) -> np.ndarray:
        """The pointer of every sample of a built-in pointer field (uint64)."""
        column = self.metadata[info.name]
        (pointer,) = BUILTIN_POINTER_COLUMNS[info.type_id]
        return column if pointer == WHOLE_COLUMN else column[pointer]

    def expected_sizes(self, info: FieldInfo) -> np.ndarray | None:
        """The allocation size each sample's metadata implies, or None where only the table knows (JPEG)."""
        column = self.metadata[info.name]
        if info.type_id in PAYLOAD_TYPE_IDS:
            return column["size"]
        if info.type_id in ARRAY_TYPE_IDS:  # one size for all: a read-only view, no column of it
            return np.broadcast_to(np.uint64(info.payload_bytes), (len(column),))
        if info.type_id == RGB_IMAGE_TYPE_ID:
            raw = column["mode"] == IMAGE_MODE_RAW
            if raw.all():
                return column["width"].astype(np.uint64) * column["height"].astype(np.uint64) * np.uint64(3)
        return None

    @cached_property
    def _custom_allocations(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Allocations no built-in field points at (they belong to custom fields), sorted by (sample, ptr)."""
        sorted_ptr, sorted_sample, sorted_size = self._sorted_table
        referenced = np.zeros(len(sorted_ptr), dtype=bool)
        rows = np.arange(self.num_samples, dtype=np.uint64)
        for info in self.fields:
            if info.type_id in POINTER_TYPES:
                found = self.match_allocations(self.pointer_column(info), rows, self._size_or_none(info))
                referenced[found[found >= 0]] = True
        keep = np.flatnonzero(~referenced)
        order = keep[np.lexsort((sorted_ptr[keep], sorted_sample[keep]))]
        return sorted_sample[order], sorted_ptr[order], sorted_size[order], order

    def _size_or_none(self, info: FieldInfo) -> np.ndarray | None:
        return None if info.type_id == RGB_IMAGE_TYPE_ID else self.expected_sizes(info)

    def custom_allocations(self, row: int) -> list[tuple[int, int]]:
        """(ptr, size) of sample ``row``'s allocations that no built-in field points at, in pointer order.

        ffcv encodes a sample's fields in order on one page, so these are the custom fields'
        allocations in the order their ``encode`` called ``malloc``.
        """
        samples, ptrs, sizes, _ = self._custom_allocations
        lo, hi = np.searchsorted(samples, [row, row + 1])
        return [(int(p), int(s)) for p, s in zip(ptrs[lo:hi], sizes[lo:hi])]

    # --- payloads --------------------------------------------------------------------------------

    def field(self, name: str) -> FieldInfo:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"{self.path} has no field {name!r} (it has {[f.name for f in self.fields]})")

    def read(self, ptr: int, size: int) -> np.ndarray:
        ptr, size = int(ptr), int(size)
        if ptr < self.data_start or size < 0 or ptr + size > self.alloc_table_ptr:
            raise BetonFormatError(f"{self.path}: payload [{ptr}, {ptr + size}) lies outside the data region")
        return self.mm[ptr : ptr + size]

    def record_bytes(self, name: str, row: int) -> bytes:
        """The raw bytes of one sample's metadata record of one field."""
        dtype, offset = self.metadata_type.fields[name][:2]
        start = self.metadata_start + self.metadata_type.itemsize * int(row) + offset
        return self.mm[start : start + dtype.itemsize].tobytes()

    def check_payloads_inside(self, ptrs: np.ndarray, sizes: np.ndarray | int, what: str) -> None:
        """Raises unless every [ptr, ptr+size) lies in the data region (no integer overflow on hostile values)."""
        ptrs = np.asarray(ptrs, dtype=np.uint64)
        sizes = np.asarray(sizes, dtype=np.uint64)
        if not ptrs.size:
            return
        end = np.uint64(self.alloc_table_ptr)
        bad = (ptrs < np.uint64(self.data_start)) | (ptrs > end) | (sizes > end)
        if not bad.any():
            bad = ptrs > end - sizes
        if bad.any():
            row = int(np.argmax(bad))
            size = int(sizes if sizes.ndim == 0 else sizes[row])
            raise BetonFormatError(
                f"{self.path}: {what} has a payload [{int(ptrs[row])}, +{size}) outside the data region "
                f"[{self.data_start}, {self.alloc_table_ptr})"
            )

    def gather(self, ptrs: np.ndarray, nbytes: int, what: str = "a field") -> np.ndarray:
        """(len(ptrs), nbytes) uint8: the bytes at each pointer, copied once (no index array)."""
        ptrs = np.asarray(ptrs, dtype=np.uint64)
        self.check_payloads_inside(ptrs, nbytes, what)
        if not ptrs.size:
            return np.zeros((0, nbytes), dtype=np.uint8)
        windows = np.lib.stride_tricks.as_strided(
            self.mm, shape=(self.size - nbytes + 1, nbytes), strides=(1, 1), writeable=False
        )
        return windows[ptrs.astype(np.int64)]

    def ndarray_column(self, name: str, rows: np.ndarray | None = None) -> np.ndarray:
        """Every (or the given) sample's payload of a fixed-size field, as one (n, *shape) array."""
        info = self.field(name)
        if info.dtype is None:
            raise ValueError(f"field '{name}' is a {info.type_name} field, not an ndarray")
        ptrs = self.metadata[name]
        if rows is not None:
            ptrs = ptrs[np.asarray(rows)]
        data = self.gather(ptrs, info.payload_bytes, f"field '{name}'")
        return np.ascontiguousarray(data).view(info.dtype).reshape((len(ptrs), *info.shape))

    def variable_payload(self, name: str, row: int) -> np.ndarray:
        """One sample's payload of a bytes/json field, or of an image (JPEG length from the alloc table)."""
        info = self.field(name)
        record = self.metadata[name][row]
        if info.type_id in PAYLOAD_TYPE_IDS:
            return self.read(int(record["ptr"]), int(record["size"]))
        if info.type_id == RGB_IMAGE_TYPE_ID:
            ptr, mode = int(record["data_ptr"]), int(record["mode"])
            if mode == IMAGE_MODE_RAW:
                return self.read(ptr, int(record["width"]) * int(record["height"]) * 3)
            if mode != IMAGE_MODE_JPEG:
                raise BetonFormatError(f"{self.path}: sample {row} field '{name}' has unknown image mode {mode}")
            return self.read(ptr, self.allocation_size(row, ptr))
        raise ValueError(f"field '{name}' is fixed-size")

    def image_sizes(self, name: str, rows: np.ndarray) -> np.ndarray:
        """Stored bytes of each given sample's image (raw: w*h*3; JPEG: its allocation), -1 where unknown."""
        column = self.metadata[name][rows]
        sizes = column["width"].astype(np.int64) * column["height"].astype(np.int64) * 3
        jpeg = column["mode"] == IMAGE_MODE_JPEG
        if jpeg.any():
            found = self.match_allocations(column["data_ptr"][jpeg], np.asarray(rows, dtype=np.uint64)[jpeg])
            table_sizes = self._sorted_table[2]
            if table_sizes.size:  # an empty allocation table matches nothing (a hostile file can say so)
                sizes[jpeg] = np.where(found >= 0, table_sizes[np.maximum(found, 0)].astype(np.int64), -1)
            else:
                sizes[jpeg] = -1
        sizes[(column["mode"] != IMAGE_MODE_JPEG) & (column["mode"] != IMAGE_MODE_RAW)] = -1
        return sizes
