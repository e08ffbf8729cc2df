"""Reads the .beton format without ffcv's Loader, via numpy memmap, bounds-checked.

Layout (all little-endian): a 24-byte header, one 1041-byte descriptor per field, the metadata
table (one aligned record per sample), page-aligned data pages, then the allocation table.
Every size and offset is checked against the file size before anything is allocated, so a
truncated or hostile file gives a ``BetonFormatError``, never a crash or a huge allocation.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .errors import BetonFormatError

HEADER_TYPE = np.dtype(
    [("version", "<u2"), ("num_fields", "<u2"), ("page_size", "<u4"), ("num_samples", "<u8"), ("alloc_table_ptr", "<u8")],
    align=True,
)
FIELD_DESC_TYPE = np.dtype([("type_id", "<u1"), ("name", ("<u1", 16)), ("arguments", ("<u1", (1024,)))], align=True)
ALLOC_TABLE_TYPE = np.dtype([("sample_id", "<u8"), ("ptr", "<u8"), ("size", "<u8")])
NDARRAY_ARGS_TYPE = np.dtype([("shape", "<u8", 32), ("type_length", "<u8")])
FORMAT_VERSION = 2

TYPE_NAMES = {0: "float", 1: "int", 2: "rgb_image", 3: "bytes", 4: "ndarray", 5: "json", 6: "torch_tensor", 255: "custom"}
METADATA_TYPES = {
    0: np.dtype("<f8"),
    1: np.dtype("<i8"),
    2: np.dtype([("mode", "<u1"), ("width", "<u2"), ("height", "<u2"), ("data_ptr", "<u8")]),
    3: np.dtype([("ptr", "<u8"), ("size", "<u8")]),
    4: np.dtype("<u8"),
    5: np.dtype([("ptr", "<u8"), ("size", "<u8")]),
    6: np.dtype("<u8"),
}
IMAGE_MODE_JPEG, IMAGE_MODE_RAW = 0, 1


@dataclass(frozen=True)
class FieldInfo:
    name: str
    type_id: int
    type_name: str
    dtype: np.dtype | None = None  # ndarray / torch_tensor payload dtype
    shape: tuple[int, ...] | None = None

    @property
    def payload_bytes(self) -> int:
        return int(self.dtype.itemsize * np.prod(self.shape, dtype=np.int64)) if self.dtype is not None else 0


class BetonFile:
    """A parsed, memory-mapped .beton. ``metadata`` is a structured array with one column per field."""

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        self.size = os.path.getsize(self.path)
        if self.size < HEADER_TYPE.itemsize:
            raise BetonFormatError(f"{self.path}: {self.size} bytes is too small for a .beton header")
        self.mm = np.memmap(self.path, dtype=np.uint8, mode="r")
        self.header = self.mm[: HEADER_TYPE.itemsize].view(HEADER_TYPE)[0]
        self.version = int(self.header["version"])
        self.num_fields = int(self.header["num_fields"])
        self.page_size = int(self.header["page_size"])
        self.num_samples = int(self.header["num_samples"])
        self.alloc_table_ptr = int(self.header["alloc_table_ptr"])
        self._check_header()
        self.fields = self._read_descriptors()
        self.metadata_type = np.dtype([(f.name, METADATA_TYPES[f.type_id]) for f in self.fields], align=True)
        self.metadata_start = HEADER_TYPE.itemsize + FIELD_DESC_TYPE.itemsize * self.num_fields
        self.metadata_end = self.metadata_start + self.metadata_type.itemsize * self.num_samples
        if self.metadata_end > self.alloc_table_ptr:
            raise BetonFormatError(
                f"{self.path}: metadata for {self.num_samples} samples would end at byte {self.metadata_end}, "
                f"past the allocation table at {self.alloc_table_ptr}"
            )
        self.metadata = self.mm[self.metadata_start : self.metadata_end].view(self.metadata_type)
        self.data_start = -(-self.metadata_end // self.page_size) * self.page_size

    def _check_header(self) -> None:
        if self.version != FORMAT_VERSION:
            raise BetonFormatError(f"{self.path}: format version {self.version}, expected {FORMAT_VERSION}")
        if self.page_size == 0 or self.page_size & (self.page_size - 1):
            raise BetonFormatError(f"{self.path}: page size {self.page_size} is not a power of two")
        if self.alloc_table_ptr == 0:
            raise BetonFormatError(
                f"{self.path}: allocation table pointer is 0: the writer never finished this file"
            )
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

    def _read_descriptors(self) -> list[FieldInfo]:
        end = HEADER_TYPE.itemsize + FIELD_DESC_TYPE.itemsize * self.num_fields
        if end > self.size:
            raise BetonFormatError(f"{self.path}: {self.num_fields} field descriptors do not fit in the file")
        descs = self.mm[HEADER_TYPE.itemsize : end].view(FIELD_DESC_TYPE)
        fields = []
        for i, desc in enumerate(descs):
            type_id = int(desc["type_id"])
            if type_id not in METADATA_TYPES:
                raise BetonFormatError(f"{self.path}: field {i} has unknown or custom type id {type_id}")
            raw_name = bytes(desc["name"])
            name_bytes = raw_name.split(b"\0", 1)[0]
            try:
                name = name_bytes.decode("ascii")
            except UnicodeDecodeError:
                raise BetonFormatError(f"{self.path}: field {i} name {raw_name!r} is not ASCII") from None
            if not name:
                raise BetonFormatError(f"{self.path}: field {i} has an empty name")
            dtype = shape = None
            if type_id in (4, 6):
                dtype, shape = self._ndarray_args(i, desc["arguments"])
            fields.append(FieldInfo(name, type_id, TYPE_NAMES[type_id], dtype, shape))
        if len({f.name for f in fields}) != len(fields):
            raise BetonFormatError(f"{self.path}: two fields share a name")
        return fields

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
        if dtype is None or dtype.hasobject:
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

    @cached_property
    def alloc_table(self) -> np.ndarray:
        return self.mm[self.alloc_table_ptr :].view(ALLOC_TABLE_TYPE)

    def field(self, name: str) -> FieldInfo:
        return next(f for f in self.fields if f.name == name)

    def read(self, ptr: int, size: int) -> np.ndarray:
        if ptr < self.data_start or ptr + size > self.alloc_table_ptr:
            raise BetonFormatError(f"{self.path}: payload [{ptr}, {ptr + size}) lies outside the data region")
        return self.mm[ptr : ptr + size]

    def ndarray_column(self, name: str, rows: np.ndarray | None = None) -> np.ndarray:
        """Every (or the given) sample's payload of a fixed-size field, as one (n, *shape) array."""
        info = self.field(name)
        ptrs = self.metadata[name].astype(np.int64)
        if rows is not None:
            ptrs = ptrs[rows]
        nbytes = info.payload_bytes
        if ptrs.size and (ptrs.min() < self.data_start or ptrs.max() + nbytes > self.alloc_table_ptr):
            raise BetonFormatError(f"{self.path}: field '{name}' has a payload pointer outside the data region")
        data = self.mm[ptrs[:, None] + np.arange(nbytes, dtype=np.int64)]
        return data.view(info.dtype).reshape((len(ptrs), *info.shape))

    def variable_payload(self, name: str, row: int) -> np.ndarray:
        """One sample's payload of a bytes/json field, or of an image (JPEG length from the alloc table)."""
        info = self.field(name)
        record = self.metadata[name][row]
        if info.type_id in (3, 5):
            return self.read(int(record["ptr"]), int(record["size"]))
        if info.type_id == 2:
            ptr = int(record["data_ptr"])
            if record["mode"] == IMAGE_MODE_RAW:
                return self.read(ptr, int(record["width"]) * int(record["height"]) * 3)
            return self.read(ptr, self.allocation_size(row, ptr))
        raise ValueError(f"field '{name}' is fixed-size")

    @cached_property
    def _alloc_index(self) -> dict[tuple[int, int], int]:
        table = self.alloc_table
        return {(int(s), int(p)): int(z) for s, p, z in zip(table["sample_id"], table["ptr"], table["size"])}

    def allocation_size(self, row: int, ptr: int) -> int:
        try:
            return self._alloc_index[(row, ptr)]
        except KeyError:
            raise BetonFormatError(f"{self.path}: sample {row} pointer {ptr} is not in the allocation table") from None


def decode_image(beton: BetonFile, name: str, row: int) -> np.ndarray:
    """The RGB image of one sample as HxWx3 uint8 (JPEG decoded with cv2, BGR -> RGB)."""
    import cv2

    record = beton.metadata[name][row]
    payload = beton.variable_payload(name, row)
    if record["mode"] == IMAGE_MODE_RAW:
        return np.asarray(payload).reshape(int(record["height"]), int(record["width"]), 3)
    bgr = cv2.imdecode(np.asarray(payload), cv2.IMREAD_COLOR)
    if bgr is None:
        raise BetonFormatError(f"{beton.path}: sample {row} field '{name}' is not a decodable JPEG")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def decode_json(payload: np.ndarray):
    """JSONField stores UTF-8 JSON followed by a NUL byte."""
    raw = bytes(payload)
    end = raw.find(b"\0")
    return json.loads(raw[: end if end >= 0 else len(raw)].decode("utf-8"))
