"""Joins part .beton files into one standard .beton that plain ``ffcv.Loader`` reads: a byte-level merge.

FFCV writes one file from one process tree. betonbuild writes a dataset as several independent
parts (parallel jobs, possibly on many nodes) and joins them here without decoding anything.

Output layout (the .beton layout is described in ``betonbuild.beton.format``)::

    header            num_samples = sum over parts, alloc_table_ptr = where the table below starts
    descriptors       the parts' descriptors, which must be byte-identical
    metadata          every part's metadata table in part order, pointer columns shifted
    (zeros)           up to the next page boundary
    data regions      part 0's pages, part 1's pages, ... each starting on a page boundary
    allocation table  every part's table in part order, ptr shifted, sample_id offset

A part's data region runs from its first page boundary after its metadata up to its allocation
table. ffcv always writes whole pages, so that is a whole number of pages; should it not be, the
region is padded with zeros to a whole page before the next part. Each region lands on a page
boundary of the output, so every pointer moves by a multiple of ``page_size`` and ffcv's page
arithmetic (``ptr >> log2(page_size)``, page p read at ``p * page_size``) stays valid. A file with
no data pages at all (only int/float fields) keeps its allocation table right after the metadata,
as ffcv itself writes it, so merging a single part reproduces that part byte for byte.

Data regions are copied by ``betonbuild.beton.copy``: with ``os.copy_file_range`` (reflinked on
XFS/btrfs/bcachefs/ZFS, copied on the server by NFS 4.2/SMB/Ceph, an in-kernel splice copy
elsewhere) and, where the kernel or filesystem refuses it (EXDEV, ENOSYS, EINVAL, EOPNOTSUPP...),
with a buffered pread/pwrite loop.
Regions are written in file order; the page padding between them is left as holes (zeros). The
output depends only on the bytes and the order of the parts: same parts, same order => same sha256.

Refused, with a ``MergeError`` naming the part and what differs: a different format version (or a
version other than 2), page size, number of fields or field descriptor (type, name or arguments such
as an ndarray's dtype/shape); an allocation table pointer of 0 (a writer that never finished); a
truncated or inconsistent part; and custom fields (type id 255) whose pointer columns are unknown.

Custom fields (type id 255, any Field class that is not exactly one of ffcv's built-ins): the merge
must know which metadata columns hold file offsets. Declare them on the Field class and pass the
class by field name::

    class BoxesField(ffcv.fields.Field):
        betonbuild_pointer_columns = ("ptr",)   # names in metadata_type; "" = the whole column
        ...                                      # () = this field stores no file offsets

    merge_betons(parts, target, custom_handlers={"boxes": BoxesField})

The metadata dtype is taken from ``Class.from_binary(arguments).metadata_type``, as ffcv's Reader
does. Every declared column must be an 8-byte integer, and every value in it is treated as an
absolute file offset into the part's data region (it is checked to lie there, then shifted).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from betonbuild.atomic import DISK_FULL_ERRNOS, atomic_path
from betonbuild.beton.copy import METHODS, Copier, pwrite_all
from betonbuild.beton.descriptors import field_descriptors, header_record
from betonbuild.beton.format import (
    ALLOC_TABLE_TYPE,
    BUILTIN_POINTER_COLUMNS,
    CUSTOM_TYPE_ID,
    FIELD_DESC_TYPE,
    FORMAT_VERSION,
    HEADER_TYPE,
    METADATA_TYPES,
    TYPE_NAMES,
    WHOLE_COLUMN,
    page_aligned,
)
from betonbuild.beton.merge_tables import Column, Part, check_tables, write_allocations, write_metadata
from betonbuild.errors import MergeError

POINTER_COLUMNS_ATTRIBUTE = "betonbuild_pointer_columns"


def merge_betons(
    parts: Sequence[str | os.PathLike],
    target: str | os.PathLike,
    custom_handlers: Mapping[str, type] | None = None,
    method: str = "auto",
) -> dict[str, Any]:
    """Merges ``parts`` (in this order) into one .beton at ``target``; returns a record of the merge.

    Sample i of part k becomes sample ``sum(num_samples of parts before k) + i``. ``target`` appears
    only when the merge succeeded (temp file + rename). ``custom_handlers`` maps the name of each
    custom (type 255) field to its Field class, which must declare ``betonbuild_pointer_columns``.
    ``method``: "auto" (copy_file_range; the buffered loop from where the kernel refuses it),
    "copy_file_range" (no fallback) or "buffered".

    The record: num_samples, samples_per_part, page_size, size, bytes_copied, seconds, method
    ("copy_file_range", "buffered" or "copy_file_range+buffered"), method_reason, filesystem, and
    per part its path, first_sample, source_data_start, data_bytes, used_bytes (what is copied: up to its
    last allocation's end; ffcv writes each worker's last page whole), target_offset and shift.
    """
    started = time.monotonic()
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, not {method!r}")
    if not parts:
        raise MergeError("nothing to merge: no part files were given")
    custom_handlers = dict(custom_handlers or {})
    paths = [str(p) for p in parts]
    target = Path(target)
    for i, path in enumerate(paths):
        if os.path.exists(target) and os.path.exists(path) and os.path.samefile(path, target):
            raise MergeError(f"part {i} ({path}) is the merge target itself")

    headed = [_read_header(i, path) for i, path in enumerate(paths)]
    first = headed[0]
    for part in headed:
        _check_against_first(part, first)
    columns = _columns(first, custom_handlers)
    record_type = np.dtype([(f"f{i}", c.dtype) for i, c in enumerate(columns)], align=True)
    for part in headed:
        check_tables(part, record_type, columns)

    page_size = first.page_size
    num_fields = first.num_fields
    num_samples = sum(p.num_samples for p in headed)
    metadata_start = HEADER_TYPE.itemsize + FIELD_DESC_TYPE.itemsize * num_fields
    metadata_end = metadata_start + record_type.itemsize * num_samples
    data_start = page_aligned(metadata_end, page_size)
    padded = [page_aligned(p.data_bytes, page_size) for p in headed]
    total_data = sum(padded)
    alloc_table_ptr = data_start + total_data if total_data else metadata_end
    num_allocations = sum(p.num_allocations for p in headed)
    final_size = alloc_table_ptr + ALLOC_TABLE_TYPE.itemsize * num_allocations
    part_records = _placed(headed, data_start, padded)

    header = np.zeros(1, dtype=HEADER_TYPE)
    header["version"] = FORMAT_VERSION
    header["num_fields"] = num_fields
    header["page_size"] = page_size
    header["num_samples"] = num_samples
    header["alloc_table_ptr"] = alloc_table_ptr
    tables = _Tables(record_type, columns, metadata_end, alloc_table_ptr)
    copier = _write_merged(
        target, method, header.tobytes() + first.descriptors, headed, part_records, tables, final_size
    )

    return {
        "target": str(target),
        "num_parts": len(headed),
        "num_samples": num_samples,
        "samples_per_part": [p.num_samples for p in headed],
        "page_size": page_size,
        "num_fields": num_fields,
        "data_start": data_start,
        "alloc_table_ptr": alloc_table_ptr,
        "size": final_size,
        "bytes_copied": copier.bytes_copied,
        "method": copier.method_used,
        "method_reason": copier.fallback_reason,
        "filesystem": copier.filesystem,
        "seconds": round(time.monotonic() - started, 3),
        "parts": part_records,
    }


def _placed(headed: list[Part], data_start: int, padded: list[int]) -> list[dict[str, Any]]:
    """Where each part's region and samples land: its first sample, target offset and pointer shift."""
    part_records = []
    region_offset, sample_offset = data_start, 0
    for part, region in zip(headed, padded):
        part_records.append(
            {
                "path": part.path,
                "num_samples": part.num_samples,
                "first_sample": sample_offset,
                "source_data_start": part.data_start,
                "data_bytes": part.data_bytes,
                "used_bytes": part.used_bytes,
                "target_offset": region_offset,
                "shift": region_offset - part.data_start,  # >= 0 and a multiple of page_size
                "allocations": part.num_allocations,
            }
        )
        region_offset += region
        sample_offset += part.num_samples
    return part_records


@dataclass(frozen=True)
class _Tables:
    """What the parts' tables are written with: the record layout, where the metadata ends and the table starts."""

    record_type: np.dtype
    columns: list[Column]
    metadata_end: int
    alloc_table_ptr: int


def _write_merged(
    target: Path,
    method: str,
    head: bytes,
    headed: list[Part],
    part_records: list[dict[str, Any]],
    tables: _Tables,
    final_size: int,
) -> Copier:
    """Writes header + descriptors (``head``), every part's metadata, data region and table at ``target``
    (temp + rename); the tables in blocks (``merge_tables``)."""
    with atomic_path(target) as tmp:
        copier = Copier(method, target.parent)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
            try:
                # Written in file order, as appends; page padding is skipped and stays a hole (zeros).
                offset = _pwrite_block(fd, head, 0)
                for part, record in zip(headed, part_records):
                    offset += write_metadata(fd, part, tables.record_type, tables.columns, offset, record["shift"])
                assert offset == tables.metadata_end
                for part, record in zip(headed, part_records):
                    if part.used_bytes:  # the unused rest of ffcv's last page stays a hole (zeros)
                        copier.copy(
                            part.label, part.path, part.data_start, part.used_bytes, fd, record["target_offset"]
                        )
                offset = tables.alloc_table_ptr
                for part, record in zip(headed, part_records):
                    offset += write_allocations(fd, part, offset, record["shift"], record["first_sample"])
                if os.fstat(fd).st_size < final_size:  # an empty table after a padded last page
                    os.ftruncate(fd, final_size)
            finally:
                os.close(fd)
        except OSError as exc:
            if exc.errno in DISK_FULL_ERRNOS:
                raise MergeError(
                    f"cannot write {target}: {os.strerror(exc.errno)} (the merged file needs {final_size} bytes)"
                ) from exc
            raise
        if os.path.getsize(tmp) != final_size:
            raise MergeError(f"{target}: wrote {os.path.getsize(tmp)} bytes, expected {final_size}")
    return copier


def _pwrite_block(fd: int, block: bytes | np.ndarray, offset: int) -> int:
    pwrite_all(fd, memoryview(block).cast("B"), offset)  # arrays written from their own buffer
    return memoryview(block).nbytes


def _read_header(index: int, path: str) -> Part:
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            raw = fh.read(HEADER_TYPE.itemsize)
    except OSError as exc:
        raise MergeError(f"part {index} ({path}): cannot read it: {exc.strerror or exc}") from exc
    if len(raw) < HEADER_TYPE.itemsize:
        raise MergeError(f"part {index} ({path}): {size} bytes is too small for a .beton header")
    header = np.frombuffer(raw, dtype=HEADER_TYPE)[0]
    return Part(
        index=index,
        path=path,
        size=size,
        version=int(header["version"]),
        num_fields=int(header["num_fields"]),
        page_size=int(header["page_size"]),
        num_samples=int(header["num_samples"]),
        alloc_table_ptr=int(header["alloc_table_ptr"]),
    )


def _check_against_first(part: Part, first: Part) -> None:
    """Version, completeness, page size and descriptors: refused with the exact difference."""
    if part.version != first.version:
        raise MergeError(
            f"{part.label}: format version {part.version} differs from {first.label}: version {first.version}"
        )
    if part.version != FORMAT_VERSION:
        raise MergeError(f"{part.label}: format version {part.version}; only version {FORMAT_VERSION} can be merged")
    if part.alloc_table_ptr == 0:
        raise MergeError(
            f"{part.label}: allocation table pointer is 0: the writer of this part never finished "
            "(crashed or killed mid-write); write the part again"
        )
    if part.page_size == 0 or part.page_size & (part.page_size - 1):
        raise MergeError(f"{part.label}: page size {part.page_size} is not a power of two")
    if part.page_size != first.page_size:
        raise MergeError(
            f"{part.label}: page size {part.page_size} differs from {first.label}: page size {first.page_size}; "
            "write every part with the same writer.page_size"
        )
    if part.num_fields != first.num_fields:
        raise MergeError(f"{part.label}: {part.num_fields} fields differ from {first.label}: {first.num_fields} fields")
    end = HEADER_TYPE.itemsize + FIELD_DESC_TYPE.itemsize * part.num_fields
    if part.num_fields == 0 or end > part.size:
        raise MergeError(f"{part.label}: {part.num_fields} field descriptors do not fit in its {part.size} bytes")
    with open(part.path, "rb") as fh:
        fh.seek(HEADER_TYPE.itemsize)
        part.descriptors = fh.read(end - HEADER_TYPE.itemsize)
    if part is first or part.descriptors == first.descriptors:
        return
    mine = np.frombuffer(part.descriptors, dtype=FIELD_DESC_TYPE)
    theirs = np.frombuffer(first.descriptors, dtype=FIELD_DESC_TYPE)
    for j, (a, b) in enumerate(zip(mine, theirs)):
        if bytes(a["name"]) != bytes(b["name"]):
            what = f"is named {_field_name(a)!r} where {first.label} has {_field_name(b)!r}"
        elif a["type_id"] != b["type_id"]:
            what = f"{_field_name(a)!r} has type {_type_name(a)} where {first.label} has type {_type_name(b)}"
        elif bytes(a["arguments"]) != bytes(b["arguments"]):
            what = (
                f"{_field_name(a)!r} ({_type_name(a)}) has different arguments from {first.label} "
                "(for ndarray/torch_tensor: a different dtype or shape)"
            )
        else:
            continue
        raise MergeError(f"{part.label}: field {j} {what}; every part must be written with the same fields")
    raise MergeError(f"{part.label}: field descriptors differ from {first.label}")  # pragma: no cover


def _field_name(desc) -> str:
    raw = bytes(desc["name"]).split(b"\0", 1)[0]
    return raw.decode("ascii", errors="backslashreplace")


def _type_name(desc) -> str:
    type_id = int(desc["type_id"])
    return f"{TYPE_NAMES.get(type_id, 'unknown')} ({type_id})"


def _columns(first: Part, custom_handlers: Mapping[str, type]) -> list[Column]:
    columns = []
    for j, desc in enumerate(np.frombuffer(first.descriptors, dtype=FIELD_DESC_TYPE)):
        name, type_id = _field_name(desc), int(desc["type_id"])
        if type_id in METADATA_TYPES:
            columns.append(Column(name, type_id, METADATA_TYPES[type_id], BUILTIN_POINTER_COLUMNS[type_id]))
        elif type_id == CUSTOM_TYPE_ID:
            columns.append(_custom_column(first, j, name, desc, custom_handlers))
        else:
            raise MergeError(f"{first.label}: field {j} {name!r} has unknown type id {type_id}")
    return columns


def _custom_column(first: Part, j: int, name: str, desc, custom_handlers: Mapping[str, type]) -> Column:
    where = f"custom field {j} {name!r} (type id {CUSTOM_TYPE_ID})"
    cls = custom_handlers.get(name)
    if cls is None:
        raise MergeError(
            f"{first.label}: {where}: pass its Field class as custom_handlers={{{name!r}: YourField}}; "
            "the merge must know its metadata layout and which columns are file offsets"
        )
    declared = getattr(cls, POINTER_COLUMNS_ATTRIBUTE, None)
    if declared is None:
        raise MergeError(
            f"{first.label}: {where}: {cls.__name__} does not declare which metadata columns are file "
            f'offsets, so they cannot be shifted; add `{POINTER_COLUMNS_ATTRIBUTE} = ("ptr",)` '
            '(the column names of its metadata_type, "" for the whole column, () for none) to the class'
        )
    try:
        dtype = np.dtype(cls.from_binary(desc["arguments"]).metadata_type)
    except Exception as exc:  # noqa: BLE001 - a user's class: report whatever it raised
        raise MergeError(
            f"{first.label}: {where}: {cls.__name__}.from_binary(...).metadata_type failed: {exc}"
        ) from exc
    if isinstance(declared, str) or not all(isinstance(c, str) for c in declared):
        raise MergeError(f"{where}: {cls.__name__}.{POINTER_COLUMNS_ATTRIBUTE} must be a tuple of column names")
    for sub in declared:
        if sub == WHOLE_COLUMN:
            if dtype.names is not None:
                raise MergeError(f'{where}: "" (whole column) declared but its metadata_type has columns {dtype.names}')
            column_type = dtype
        elif dtype.names is None or sub not in dtype.names:
            raise MergeError(f"{where}: declared pointer column {sub!r} is not in its metadata_type {dtype}")
        else:
            column_type = dtype[sub]
        if column_type.kind not in "ui" or column_type.itemsize != 8 or column_type.shape:
            raise MergeError(
                f"{where}: pointer column {sub!r} has type {column_type}; file offsets must be 8-byte integers"
            )
    return Column(name, CUSTOM_TYPE_ID, dtype, tuple(declared))


def write_empty_beton(target: str | os.PathLike, fields: Mapping[str, Any], page_size: int) -> dict[str, Any]:
    """A valid 0-sample .beton with these ffcv fields: what DatasetWriter would write if it could.

    Plain ffcv cannot write 0 samples (it asks for a 0-byte shared memory block and fails), but a
    partition may be empty (more partitions than samples); its file then merges as contributing nothing.
    """
    try:
        descriptors = field_descriptors(fields)
    except ValueError as exc:
        raise MergeError(str(exc)) from None
    header = header_record(len(fields), page_size, 0, HEADER_TYPE.itemsize + descriptors.nbytes)
    with atomic_path(target) as tmp, open(tmp, "wb") as fh:
        fh.write(header.tobytes())
        fh.write(descriptors.tobytes())
    return {"num_samples": 0, "page_size": page_size, "size": int(header["alloc_table_ptr"])}
