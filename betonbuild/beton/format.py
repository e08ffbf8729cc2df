"""Reads the .beton format without ffcv's Loader, via numpy memmap, bounds-checked.

Layout (all little-endian): a 24-byte header, one 1041-byte descriptor per field, the metadata
table (one aligned record per sample), page-aligned data pages, then the allocation table.
Every size and offset is checked against the file size before anything is allocated, so a
truncated or hostile file gives a ``BetonFormatError``, never a crash or a huge allocation:
parsing allocates a constant amount; the allocation-table index and the structural checks
allocate a small multiple of the table, which is part of the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from betonbuild.errors import BetonFormatError

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
CUSTOM_TYPE_ID = 255

TYPE_NAMES = {
    0: "float",
    1: "int",
    2: "rgb_image",
    3: "bytes",
    4: "ndarray",
    5: "json",
    6: "torch_tensor",
    255: "custom",
}
METADATA_TYPES = {
    0: np.dtype("<f8"),
    1: np.dtype("<i8"),
    2: np.dtype([("mode", "<u1"), ("width", "<u2"), ("height", "<u2"), ("data_ptr", "<u8")]),
    3: np.dtype([("ptr", "<u8"), ("size", "<u8")]),
    4: np.dtype("<u8"),
    5: np.dtype([("ptr", "<u8"), ("size", "<u8")]),
    6: np.dtype("<u8"),
}
POINTER_TYPES = (2, 3, 4, 5, 6)  # built-in fields whose metadata points at one allocation per sample
IMAGE_MODE_JPEG, IMAGE_MODE_RAW = 0, 1
MAX_CUSTOM_RECORD = 1 << 20  # bytes of one custom field's metadata record
MAX_DECODED_PIXELS = 1 << 28  # decode_image refuses larger images (a hostile JPEG header could claim 4 G pixels)
MAX_EQUAL_POINTERS = 4  # allocations sharing one pointer (size-0 ones collide with the next) searched per lookup
_NAME_CHARS = set(range(0x20, 0x7F))


@dataclass(frozen=True)
class FieldInfo:
    name: str
    type_id: int
    type_name: str
    metadata_type: np.dtype
    arguments: bytes
    dtype: np.dtype | None = None  # ndarray / torch_tensor payload dtype
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

    def describe_arguments(self) -> dict[str, Any]:
        """The descriptor's arguments, decoded where the type defines them."""
        if self.type_id in (4, 6):
            return {"dtype": self.dtype.str, "shape": list(self.shape)}
        if self.type_id == CUSTOM_TYPE_ID:
            stripped = self.arguments.rstrip(b"\0")
            described = (
                {"class": f"{type(self.handler).__module__}.{type(self.handler).__qualname__}"} if self.handler else {}
            )
            return {
                **described,
                "metadata_type": str(self.metadata_type),
                "arguments_hex": stripped[:64].hex(),
                "arguments_bytes_used": len(stripped),
            }
        if self.type_id == 2:
            return {"note": "ffcv stores no image arguments (write_mode, quality and max_resolution are not recorded)"}
        return {}


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
        self.data_start = -(-self.metadata_end // self.page_size) * self.page_size
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
            if type_id in (4, 6):
                dtype, shape = self._ndarray_args(i, desc["arguments"])
            fields.append(
                FieldInfo(name, type_id, TYPE_NAMES[type_id], METADATA_TYPES[type_id], arguments, dtype, shape)
            )
        if len({f.name for f in fields}) != len(fields):
            raise BetonFormatError(f"{self.path}: two fields share a name")
        if unregistered:
            names = ", ".join(f"'{n}'" for n in unregistered)
            raise UnregisteredCustomField(
                f"{self.path}: field(s) {names} are custom fields (type id 255) whose metadata layout only their "
                f"class knows; register it: BetonFile(path, custom_handlers={{'{unregistered[0]}': Class}}), "
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
        ptr, sample, size = table["ptr"], table["sample_id"], table["size"]
        order = np.lexsort((size, sample, ptr))
        return ptr[order], sample[order], size[order]

    def match_allocations(self, ptrs: np.ndarray, samples: np.ndarray, sizes: np.ndarray | None = None) -> np.ndarray:
        """Index (into the sorted table) of the allocation of each (ptr, sample[, size]); -1 where none.

        Without ``sizes`` the largest of equal (ptr, sample) allocations is taken: a size-0 allocation
        shares its pointer with the next allocation, and a JPEG is never empty.
        """
        sorted_ptr, sorted_sample, sorted_size = self._sorted_table
        ptrs = np.asarray(ptrs, dtype=np.uint64)
        samples = np.asarray(samples, dtype=np.uint64)
        found = np.full(len(ptrs), -1, dtype=np.int64)
        n = len(sorted_ptr)
        if n == 0 or len(ptrs) == 0:
            return found
        start = np.searchsorted(sorted_ptr, ptrs, side="left")
        for k in range(MAX_EQUAL_POINTERS):
            at = np.minimum(start + k, n - 1)
            hit = (start + k < n) & (sorted_ptr[at] == ptrs) & (sorted_sample[at] == samples)
            if sizes is not None:
                hit &= sorted_size[at] == sizes
                found = np.where(hit & (found < 0), at, found)
            else:
                found = np.where(hit, at, found)
        return found

    def allocation_size(self, row: int, ptr: int) -> int:
        at = int(self.match_allocations(np.array([ptr], dtype=np.uint64), np.array([row], dtype=np.uint64))[0])
        if at < 0:
            raise BetonFormatError(f"{self.path}: sample {row} pointer {ptr} is not in the allocation table")
        return int(self._sorted_table[2][at])

    def pointer_column(self, info: FieldInfo) -> np.ndarray:
        """The pointer of every sample of a built-in pointer field (uint64)."""
        column = self.metadata[info.name]
        if info.type_id in (3, 5):
            return column["ptr"]
        if info.type_id == 2:
            return column["data_ptr"]
        return column

    def expected_sizes(self, info: FieldInfo) -> np.ndarray | None:
        """The allocation size each sample's metadata implies, or None where only the table knows (JPEG)."""
        column = self.metadata[info.name]
        if info.type_id in (3, 5):
            return column["size"]
        if info.type_id in (4, 6):
            return np.full(len(column), info.payload_bytes, dtype=np.uint64)
        if info.type_id == 2:
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
        return None if info.type_id == 2 else self.expected_sizes(info)

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
        if info.type_id in (3, 5):
            return self.read(int(record["ptr"]), int(record["size"]))
        if info.type_id == 2:
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


def jpeg_dimensions(payload) -> tuple[int, int] | None:
    """(width, height) from a JPEG's SOF marker, or None if the bytes are not a readable JPEG header."""
    data = bytes(payload[:65536]) if len(payload) > 65536 else bytes(payload)
    if data[:2] != b"\xff\xd8":
        return None
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        if length < 2:
            return None
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if i + 9 > len(data):
                return None
            height = int.from_bytes(data[i + 5 : i + 7], "big")
            width = int.from_bytes(data[i + 7 : i + 9], "big")
            return width, height
        i += 2 + length
    return None


def decode_image(beton: BetonFile, name: str, row: int, bgr: bool = False) -> np.ndarray:
    """The RGB (or, with ``bgr``, BGR) image of one sample as HxWx3 uint8; JPEG decoded with cv2.

    The JPEG's own dimensions must equal the metadata's, and images above MAX_DECODED_PIXELS are
    refused, so a hostile header cannot make the decoder allocate gigabytes.
    """
    import cv2

    record = beton.metadata[name][row]
    width, height = int(record["width"]), int(record["height"])
    payload = beton.variable_payload(name, row)
    if record["mode"] == IMAGE_MODE_RAW:
        image = np.asarray(payload).reshape(height, width, 3)
        return image[..., ::-1] if bgr else image
    where = f"{beton.path}: sample {row} field '{name}'"
    if width * height > MAX_DECODED_PIXELS:
        raise BetonFormatError(f"{where}: {width}x{height} is above the {MAX_DECODED_PIXELS}-pixel decode limit")
    dims = jpeg_dimensions(payload)
    if dims is None:
        raise BetonFormatError(f"{where} is not a decodable JPEG")
    if dims != (width, height):
        raise BetonFormatError(f"{where}: the JPEG is {dims[0]}x{dims[1]} but the metadata says {width}x{height}")
    try:
        image = cv2.imdecode(np.asarray(payload), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
    except cv2.error:
        image = None
    if image is None or image.shape != (height, width, 3):
        raise BetonFormatError(f"{where} is not a decodable JPEG")
    return image if bgr else cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


def decode_json(payload: np.ndarray):
    """JSONField stores UTF-8 JSON followed by a NUL byte."""
    raw = bytes(payload)
    end = raw.find(b"\0")
    try:
        return json.loads(raw[: end if end >= 0 else len(raw)].decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise BetonFormatError(
            f"JSON payload of {len(raw)} bytes does not decode: {type(exc).__name__}: {exc}"
        ) from None


# --- structural checks -----------------------------------------------------------------------------


def structural_checks(beton: BetonFile, allow_empty: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The layout rules ffcv's Loader relies on, each as {name, ok, detail}.

    ``allow_empty`` names bytes/json fields whose size-0 allocations are accepted (flagged, not failed).
    """
    checks: list[dict[str, Any]] = []

    def check(name: str, ok: bool, detail: str, **extra) -> None:
        checks.append({"name": name, "ok": bool(ok), "detail": detail, **extra})

    table = beton.alloc_table
    ptr, size, sample = table["ptr"], table["size"], table["sample_id"]
    n = len(table)
    ps = beton.page_size

    pages = (beton.alloc_table_ptr - beton.data_start) // ps if beton.alloc_table_ptr >= beton.data_start else 0
    if n:
        aligned = (
            beton.data_start % ps == 0
            and beton.alloc_table_ptr >= beton.data_start
            and ((beton.alloc_table_ptr - beton.data_start) % ps == 0)
        )
        check(
            "data_region_aligned",
            aligned,
            f"data region [{beton.data_start}, {beton.alloc_table_ptr}): {pages} whole pages of {ps} bytes, "
            "at absolute multiples of the page size"
            if aligned
            else f"the data region [{beton.data_start}, {beton.alloc_table_ptr}) is not a whole number of "
            f"{ps}-byte pages starting at a multiple of the page size",
        )
    else:
        check("data_region_aligned", True, "no allocations: the file has no data pages")

    end = np.uint64(beton.alloc_table_ptr)
    inside = (ptr >= np.uint64(beton.data_start)) & (ptr <= end) & (size <= end)
    inside &= ptr <= end - np.where(inside, size, 0).astype(np.uint64)
    outside = int(n - inside.sum())
    check(
        "allocations_in_file",
        outside == 0,
        f"all {n} allocations lie inside the data region"
        if not outside
        else f"{outside} of {n} allocations lie outside the data region "
        f"(first: ptr {int(ptr[~inside][0])}, size {int(size[~inside][0])})",
    )

    p_in, s_in, id_in = ptr[inside], size[inside], sample[inside]
    first_page = p_in >> np.uint64(beton.page_shift)
    last_page = (p_in + np.maximum(s_in, np.uint64(1)) - np.uint64(1)) >> np.uint64(beton.page_shift)
    crossing = int((first_page != last_page).sum())
    check(
        "allocations_in_one_page",
        crossing == 0,
        "every allocation lies inside one page" if not crossing else f"{crossing} allocations cross a page boundary",
    )

    beyond = int((sample >= np.uint64(beton.num_samples)).sum())
    check(
        "sample_ids",
        beyond == 0,
        f"every allocation belongs to one of the {beton.num_samples} samples"
        if not beyond
        else f"{beyond} allocations name a sample id beyond num_samples ({beton.num_samples})",
    )

    overlaps = 0
    if len(p_in) > 1:
        order = np.argsort(p_in, kind="stable")
        sp, ss = p_in[order], s_in[order]
        overlaps = int((sp[1:] < sp[:-1] + ss[:-1]).sum())
    check(
        "no_overlap",
        overlaps == 0,
        "no two allocations overlap" if not overlaps else f"{overlaps} allocations overlap the one before them",
    )

    split = 0
    if len(id_in):
        by_sample = np.lexsort((first_page, id_in))
        ids, pg = id_in[by_sample], first_page[by_sample]
        starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        split = int((np.maximum.reduceat(pg, starts) != np.minimum.reduceat(pg, starts)).sum())
    check(
        "samples_on_one_page",
        split == 0,
        "each sample's allocations lie on one page"
        if not split
        else f"{split} samples have allocations on more than one page",
    )

    problems = []
    rows = np.arange(beton.num_samples, dtype=np.uint64)
    for info in beton.fields:
        if info.type_id not in POINTER_TYPES:
            continue
        pointers = beton.pointer_column(info)
        sizes = beton._size_or_none(info)
        found = beton.match_allocations(pointers, rows, sizes)
        missing = found < 0
        if info.type_id == 2 and not missing.any():
            column = beton.metadata[info.name]
            raw = column["mode"] == IMAGE_MODE_RAW
            want = column["width"].astype(np.uint64) * column["height"].astype(np.uint64) * np.uint64(3)
            wrong = raw & (beton._sorted_table[2][found] != want)
            unknown = (column["mode"] != IMAGE_MODE_RAW) & (column["mode"] != IMAGE_MODE_JPEG)
            if wrong.any():
                row = int(np.argmax(wrong))
                problems.append(
                    f"field '{info.name}': sample {row}'s raw image allocation is not "
                    f"{int(want[row])} bytes ({int(wrong.sum())} such samples)"
                )
            if unknown.any():
                row = int(np.argmax(unknown))
                problems.append(f"field '{info.name}': sample {row} has unknown image mode {int(column['mode'][row])}")
        if missing.any():
            row = int(np.argmax(missing))
            if sizes is not None and beton.match_allocations(pointers[row : row + 1], rows[row : row + 1])[0] >= 0:
                problems.append(
                    f"field '{info.name}': sample {row}'s allocation at {int(pointers[row])} is not "
                    f"{int(sizes[row])} bytes as its metadata says ({int(missing.sum())} such samples)"
                )
            else:
                problems.append(
                    f"field '{info.name}': sample {row}'s pointer {int(pointers[row])} is not an allocation "
                    f"of sample {row} ({int(missing.sum())} such samples)"
                )
    check(
        "metadata_pointers",
        not problems,
        "every metadata pointer is an allocation of its own sample, of the size the metadata says"
        if not problems
        else "; ".join(problems),
    )

    empty = int((size == 0).sum())
    allowed = 0
    per_field = {}
    for info in beton.fields:
        if info.type_id in (3, 5):
            count = int((beton.metadata[info.name]["size"] == 0).sum())
            if count:
                per_field[info.name] = count
                if info.name in allow_empty:
                    allowed += count
    note = (
        "ffcv's Loader mis-reads them: a size-0 allocation shares its pointer with the next allocation, "
        "so the sample's following field can come back corrupted"
    )
    if not empty:
        check("no_empty_allocations", True, "no size-0 allocations")
    else:
        where = ", ".join(f"'{k}': {v}" for k, v in per_field.items()) or "no bytes/json field"
        check(
            "no_empty_allocations",
            empty <= allowed,
            f"{empty} size-0 allocations ({where}){' allowed by allow_empty' if empty <= allowed else ''}; {note}",
            flagged=empty,
        )
    return checks


def page_usage(beton: BetonFile) -> dict[str, Any]:
    """Pages of the data region, how many hold allocations, and how full they are."""
    table = beton.alloc_table
    pages = (
        (beton.alloc_table_ptr - beton.data_start) // beton.page_size if beton.alloc_table_ptr > beton.data_start else 0
    )
    used = int(np.unique(table["ptr"] >> np.uint64(beton.page_shift)).size) if len(table) else 0
    stored = int(table["size"].sum(dtype=np.uint64)) if len(table) else 0
    return {
        "pages": int(pages),
        "pages_used": used,
        "allocations": int(len(table)),
        "allocated_bytes": stored,
        "fill_ratio": round(stored / (pages * beton.page_size), 4) if pages else 0.0,
    }


def bytes_per_field(beton: BetonFile) -> dict[str, dict[str, int]]:
    """Per field: bytes in the metadata table and in the data pages."""
    n = beton.num_samples
    out = {}
    rows = np.arange(n, dtype=np.uint64)
    for info in beton.fields:
        meta = info.metadata_type.itemsize * n
        if info.type_id in (4, 6):
            data = info.payload_bytes * n
        elif info.type_id in (3, 5):
            data = int(beton.metadata[info.name]["size"].sum(dtype=np.uint64))
        elif info.type_id == 2:
            sizes = beton.image_sizes(info.name, rows.astype(np.int64))
            data = int(np.maximum(sizes, 0).sum())
        else:
            data = 0
        out[info.name] = {"metadata": int(meta), "data": int(data)}
    if any(f.type_id == CUSTOM_TYPE_ID for f in beton.fields):
        custom = int(beton._custom_allocations[2].sum(dtype=np.uint64))
        out["(custom allocations)"] = {"metadata": 0, "data": custom}
    return out


# --- a description of any .beton (``betonbuild inspect``) -------------------------------------------


def describe(beton: BetonFile, samples: int = 3, digest: bool = False) -> dict[str, Any]:
    """Header, fields with decoded arguments, layout, pages, bytes per field, structure, first samples."""
    per_field = bytes_per_field(beton)
    n = beton.num_samples
    fields = []
    for info in beton.fields:
        stored = per_field[info.name]
        fields.append(
            {
                "name": info.name,
                "type": info.type_name,
                "type_id": info.type_id,
                "arguments": info.describe_arguments(),
                "metadata_bytes": stored["metadata"],
                "data_bytes": stored["data"],
                "data_bytes_per_sample": round(stored["data"] / n, 1) if n else 0.0,
                **({"image_modes": _image_modes(beton, info)} if info.type_id == 2 else {}),
            }
        )
    checks = structural_checks(beton)
    out = {
        "file": beton.path,
        "bytes": beton.size,
        "header": {
            "version": beton.version,
            "page_size": beton.page_size,
            "num_samples": n,
            "num_fields": beton.num_fields,
            "alloc_table_ptr": beton.alloc_table_ptr,
        },
        "layout": {
            "descriptors": [HEADER_TYPE.itemsize, beton.metadata_start],
            "metadata": [beton.metadata_start, beton.metadata_end],
            "metadata_record_bytes": beton.metadata_type.itemsize,
            "data_region": [min(beton.data_start, beton.alloc_table_ptr), beton.alloc_table_ptr],
            "allocation_table": [beton.alloc_table_ptr, beton.size],
            **page_usage(beton),
        },
        "fields": fields,
        "structure_ok": all(c["ok"] for c in checks),
        "structure": checks,
        "samples": [
            {"index": row, "fields": {info.name: summarise(beton, info, row) for info in beton.fields}}
            for row in range(min(max(samples, 0), n))
        ],
    }
    if digest:
        from betonbuild.beton.digest import content_digest

        out["content_digest"] = content_digest(beton)
    return out


def _image_modes(beton: BetonFile, info: FieldInfo) -> dict[str, int]:
    modes = beton.metadata[info.name]["mode"]
    jpeg, raw = int((modes == IMAGE_MODE_JPEG).sum()), int((modes == IMAGE_MODE_RAW).sum())
    return {"jpeg": jpeg, "raw": raw, **({"unknown": len(modes) - jpeg - raw} if len(modes) - jpeg - raw else {})}


def summarise(beton: BetonFile, info: FieldInfo, row: int) -> Any:
    """A short, JSON-able summary of one stored value; a corrupt value is described, not raised."""
    try:
        return _summary(beton, info, row)
    except BetonFormatError as exc:
        return f"unreadable: {str(exc).removeprefix(beton.path + ': ')}"


def _summary(beton: BetonFile, info: FieldInfo, row: int) -> Any:
    record = beton.metadata[info.name][row]
    if info.type_id == 1:
        return int(record)
    if info.type_id == 0:
        value = float(record)
        return value if np.isfinite(value) else str(value)
    if info.type_id in (4, 6):
        array = beton.ndarray_column(info.name, np.array([row]))[0]
        text = f"{array.dtype}{list(array.shape)}"
        if array.dtype.kind in "biuf" and array.size:
            with np.errstate(all="ignore"):
                flat = array.astype(np.float64).reshape(-1)
            text += (
                f" min={np.nanmin(flat):.6g} max={np.nanmax(flat):.6g} mean={np.nanmean(flat):.6g}"
                if not np.isnan(flat).all()
                else " all NaN"
            )
        return text
    if info.type_id == 3:
        payload = bytes(beton.variable_payload(info.name, row))
        return f"{len(payload)} bytes: {payload[:16].hex(' ')}{' ...' if len(payload) > 16 else ''}"
    if info.type_id == 5:
        text = json.dumps(decode_json(beton.variable_payload(info.name, row)), separators=(",", ":"))
        return text if len(text) <= 80 else text[:77] + "..."
    if info.type_id == 2:
        mode = int(record["mode"])
        kind = {IMAGE_MODE_JPEG: "jpeg", IMAGE_MODE_RAW: "raw"}.get(mode, f"mode {mode}")
        size = len(beton.variable_payload(info.name, row))
        return f"{kind} {int(record['width'])}x{int(record['height'])}, {size} bytes"
    handler = info.handler
    if handler is not None and hasattr(handler, "decode"):
        payloads = [np.asarray(beton.read(p, s)) for p, s in beton.custom_allocations(row)]
        try:
            value = handler.decode(record, payloads)
        except Exception as exc:  # noqa: BLE001 - the class's own decode of hostile bytes
            return f"unreadable: {type(handler).__name__}.decode raised {type(exc).__name__}: {exc}"
        text = repr(value)
        return text if len(text) <= 80 else text[:77] + "..."
    raw = beton.record_bytes(info.name, row)
    return f"record {raw[:16].hex(' ')}{' ...' if len(raw) > 16 else ''}"
