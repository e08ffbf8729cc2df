"""Arrow columns as field values: the column rules the ``parquet`` and ``huggingface`` kinds share
(a Parquet row group and a ``datasets`` Arrow table are the same shape).

``plan_columns`` maps each field to a column of the schema (a dotted path into structs, e.g.
``image.bytes``) and checks, before any row is read, that the column's type can hold the field's
values: an integer column for an ``int`` field, a numeric list of the field's dtype for an
``ndarray`` field, binary for ``bytes``, a HF ``Image`` struct ({bytes, path}) or binary for
``rgb_image``. ``decode_column`` turns one batch of rows (a row group) into a ``Column`` whose
``value(i)`` is what the field kind's check takes, without a Python object per row where the
values are numbers: scalars as a numpy array, lists as flat values and offsets, binary as one
buffer and offsets. Nulls and list lengths that do not fit the field are refused per row
(``Column.problem``), so that the error names the row. pyarrow is imported inside the functions:
the DAG imports this module's callers without it.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from betonbuild.config.spec import FieldSpec
from betonbuild.errors import SourceError
from betonbuild.fields.kept_jpeg import keeps_source_jpeg
from betonbuild.fields.reduced_decode import decoded_reduced, reduces
from betonbuild.sources.image_limits import decompression_bomb, is_decompression_bomb
from betonbuild.sources.jpeg import decode_rgb8

# field type -> what the column must hold (other kinds, e.g. custom or json, take the column's values as they are)
SCALAR_KINDS = ("int", "float")
ARRAY_KINDS = ("ndarray",)
IMAGE_KINDS = ("rgb_image",)


@dataclass(frozen=True)
class ColumnPlan:
    """How one field is read: its column (``top`` and the struct ``path`` below it) and its role."""

    field: FieldSpec
    column: str  # the dotted name, as the config gives it
    top: str
    path: tuple[str, ...]
    role: str  # scalar | list | binary | image | string | other
    fixed: bool  # a fixed-size field read as a numpy array of many rows at once (verification)


def column_names(schema) -> list[str]:
    """Every column and struct member of an Arrow schema, by dotted name (``image``, ``image.bytes``)."""
    import pyarrow as pa

    names: list[str] = []

    def walk(prefix: str, dtype) -> None:
        if pa.types.is_struct(dtype):
            for child in dtype:
                names.append(f"{prefix}.{child.name}")
                walk(f"{prefix}.{child.name}", child.type)

    for field in schema:
        names.append(field.name)
        walk(field.name, field.type)
    return names


def column_type(schema, dotted: str):
    """The Arrow type at a dotted path, or None if the schema has no such column."""
    import pyarrow as pa

    top, *path = dotted.split(".")
    if top not in schema.names:
        return None
    dtype = storage_type(schema.field(top).type)
    for name in path:
        if not pa.types.is_struct(dtype) or dtype.get_field_index(name) < 0:
            return None
        dtype = storage_type(dtype.field(name).type)
    return dtype


def storage_type(dtype):
    """An extension type's storage (e.g. ``datasets``' Array2D: nested lists), else the type itself."""
    import pyarrow as pa

    return dtype.storage_type if isinstance(dtype, pa.ExtensionType) else dtype


def _storage(array):
    import pyarrow as pa

    return array.storage if isinstance(array, pa.ExtensionArray) else array


def plan_columns(
    dataset: str, fields: tuple[FieldSpec, ...], columns: dict[str, str], schema, what: str
) -> list[ColumnPlan]:
    """One plan per field (``columns``: field -> dotted column, the field's name by default);
    SourceError naming the field, the column and ``what`` (the file) if a column is missing or cannot
    hold the field's values."""
    plans = []
    for field in fields:
        dotted = columns.get(field.name, field.name)
        dtype = column_type(schema, dotted)
        if dtype is None:
            raise SourceError(
                dataset,
                f"field '{field.name}' reads column {dotted!r}, which {what} does not have; its columns are "
                f"{column_names(schema)} (map the field to one of them with source.columns.{field.name})",
            )
        top, *path = dotted.split(".")
        role = _check_type(dataset, field, dotted, dtype, what)
        fixed = field.type in SCALAR_KINDS + ARRAY_KINDS
        plans.append(ColumnPlan(field, dotted, top, tuple(path), role, fixed))
    return plans


def _role(dtype) -> str:
    import pyarrow as pa

    t = pa.types
    if t.is_integer(dtype) or t.is_floating(dtype):
        return "scalar"
    if t.is_list(dtype) or t.is_large_list(dtype) or t.is_fixed_size_list(dtype):
        return "list" if _is_numeric(_leaf_type(dtype)) else "other"
    if t.is_binary(dtype) or t.is_large_binary(dtype) or t.is_fixed_size_binary(dtype):
        return "binary"
    if t.is_struct(dtype) and dtype.get_field_index("bytes") >= 0 and _role(dtype.field("bytes").type) == "binary":
        return "image"  # a Hugging Face Image feature: struct<bytes: binary, path: string>
    if t.is_string(dtype) or t.is_large_string(dtype):
        return "string"
    return "other"


def _is_numeric(dtype) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(dtype) or pa.types.is_floating(dtype) or pa.types.is_boolean(dtype)


def _leaf_type(dtype):
    import pyarrow as pa

    while pa.types.is_list(dtype) or pa.types.is_large_list(dtype) or pa.types.is_fixed_size_list(dtype):
        dtype = dtype.value_type
    return dtype


def fixed_list_size(dtype) -> int | None:
    """Elements per row of nested fixed-size lists (None if any level varies)."""
    import pyarrow as pa

    size = 1
    while pa.types.is_list(dtype) or pa.types.is_large_list(dtype) or pa.types.is_fixed_size_list(dtype):
        if not pa.types.is_fixed_size_list(dtype):
            return None
        size *= dtype.list_size
        dtype = dtype.value_type
    return size


def _check_type(dataset: str, field: FieldSpec, dotted: str, dtype, what: str) -> str:
    """The column's role for this field; SourceError if its type cannot hold the field's values."""
    import pyarrow as pa

    role = _role(dtype)

    def refuse(needs: str, fix: str) -> SourceError:
        return SourceError(
            dataset,
            f"field '{field.name}' ({field.type}) reads column {dotted!r} of {what}, which holds {dtype}; "
            f"a {field.type} field needs {needs}. Fix: {fix}",
        )

    if field.type == "int" and not pa.types.is_integer(dtype):
        raise refuse(
            "an integer column",
            "make the field a float, or cast the column to an integer type (pyarrow.compute.cast) "
            "if its values are whole",
        )
    if field.type == "float" and role != "scalar":
        raise refuse("a numeric column", "map the field to a numeric column, or choose the field type for this column")
    if field.type in ARRAY_KINDS:
        want = np.dtype(field.options["dtype"])
        if role != "list":
            raise refuse(f"a list column of {want}", "map the field to a numeric list column")
        found = np.dtype(_leaf_type(dtype).to_pandas_dtype())
        if found != want and not (found == np.bool_ and want.kind in "iu" and want.itemsize == 1):
            raise refuse(f"{want} elements", f"set the field's dtype to {found.name}, or cast the column's elements")
        size, elements = fixed_list_size(dtype), math.prod(field.options["shape"])
        if size is not None and size != elements:
            raise refuse(
                f"{elements} elements per row (shape {field.options['shape']}), not {size}",
                "set the field's shape to the list's size",
            )
    if field.type == "bytes" and role != "binary":
        raise refuse("a binary column", "map the field to a binary column (a string column is a json field)")
    if field.type in IMAGE_KINDS and role not in ("image", "binary"):
        raise refuse("an image column (a Hugging Face Image struct {bytes, path}, or encoded image bytes)", "map it")
    return role


class Column:
    """One field's values of a batch of rows (see the module docstring); ``problem(i)`` says why row
    i cannot be a value of the field (a null, a list of the wrong length), else None."""

    def __init__(self, plan: ColumnPlan, values: Any, offsets: np.ndarray | None, problems: dict[int, str]):
        self.plan, self.values, self.offsets, self.problems = plan, values, offsets, problems
        field = plan.field
        self.shape = tuple(field.options["shape"]) if field.type in ARRAY_KINDS else None

    def problem(self, i: int) -> str | None:
        return self.problems.get(i) if self.problems else None

    def encoded(self, i: int) -> np.ndarray:
        """The row's bytes (binary and image columns), a view of the batch's buffer."""
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    def value(self, i: int) -> Any:
        role = self.plan.role
        if role == "scalar":
            return self.values[i]
        if role == "list":
            row = self.values[self.offsets[i] : self.offsets[i + 1]]
            return row.reshape(self.shape) if self.shape is not None else row
        if role == "binary" and self.plan.field.type not in IMAGE_KINDS:
            return self.encoded(i)
        if role in ("binary", "image"):
            if keeps_source_jpeg(self.plan.field):  # the bytes themselves: a JPEG that fits is stored unchanged
                return bytes(self.encoded(i))
            if self.plan.field.type == "rgb_image":  # libjpeg-turbo directly where it gives PIL's pixels
                data = bytes(self.encoded(i))
                if reduces(self.plan.field, data):  # decode: reduced (fields.reduced_decode)
                    return decoded_reduced(self.plan.field, data)
                return decode_rgb8(data, decode_image, components=(3,))
            return decode_image(self.encoded(i))
        return self.values[i]

    def array(self) -> np.ndarray:
        """Every row at once (a fixed-size field): (rows,) scalars or (rows, *shape) arrays; ValueError
        naming the first row that has none (a null, a list of another length)."""
        if self.problems:
            first = min(self.problems)
            raise ValueError(f"row {first} of the row group: {self.problems[first]}")
        if self.plan.role == "scalar":
            return self.values
        return self.values[self.offsets[0] : self.offsets[-1]].reshape(len(self.offsets) - 1, *self.shape)


def decode_image(data: np.ndarray | bytes):
    """Encoded image bytes as a loaded PIL image (decode errors are the caller's SampleError); a
    grey JPEG stays PIL's "L" image, which the field refuses or converts as ``image_mode`` says."""
    from PIL import Image

    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def image_error(exc: Exception) -> tuple[str, str]:
    """(why, fix) for an image that does not decode."""
    if is_decompression_bomb(exc):
        return decompression_bomb(exc, "its image", "read it with a python source whose module sets")
    return f"cannot decode its image bytes: {type(exc).__name__}: {exc}", "replace or drop the row"


def decode_column(plan: ColumnPlan, chunked) -> Column:
    """One field's column of a batch (a pyarrow ChunkedArray or Array of the top-level column)."""
    import pyarrow as pa

    array = _storage(chunked.combine_chunks() if isinstance(chunked, pa.ChunkedArray) else chunked)
    nulls = np.zeros(len(array), dtype=bool)
    for name in plan.path:  # into the struct, a null parent making the member null
        nulls |= _null_mask(array)
        array = _storage(array.field(name))
    if plan.role == "image":
        nulls |= _null_mask(array)
        array = array.field("bytes")
    nulls |= _null_mask(array)
    problems = {int(i): _null_message(plan) for i in np.flatnonzero(nulls)}
    if plan.role == "scalar":
        return Column(plan, to_numpy(array.fill_null(0) if problems else array), None, problems)
    if plan.role == "list":
        values, offsets = _flat_list(array, problems, plan)
        return Column(plan, values, offsets, problems)
    if plan.role in ("binary", "image"):
        values, offsets = _binary_buffers(array)
        return Column(plan, values, offsets, problems)
    return Column(plan, array.to_pylist(), None, problems)


def _null_mask(array) -> np.ndarray:
    if array.null_count == 0:
        return np.zeros(len(array), dtype=bool)
    return to_numpy(array.is_null())


def to_numpy(array) -> np.ndarray:
    """A numeric or boolean Arrow array without nulls as numpy, read from its buffers (zero-copy but
    for booleans). pyarrow's own ``to_numpy`` imports pandas when it is installed (``datasets``
    needs it): 0.4 s or more in every forked writer worker, more than a small write itself takes."""
    import pyarrow as pa

    data = array.buffers()[1]
    if pa.types.is_boolean(array.type):
        bits = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
        return np.unpackbits(bits, bitorder="little")[array.offset : array.offset + len(array)].astype(bool)
    dtype = np.dtype(array.type.to_pandas_dtype())
    if data is None or not len(array):
        return np.zeros(len(array), dtype=dtype)
    return np.frombuffer(data, dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)


def _null_message(plan: ColumnPlan) -> str:
    if plan.role == "image":
        return (
            f"column {plan.column!r} holds no image bytes in this row (a null, or an image stored only by its "
            "path: betonbuild reads the bytes the file holds; embed the images before saving the dataset)"
        )
    return f"column {plan.column!r} is null in this row"


def _flat_list(array, problems: dict[int, str], plan: ColumnPlan) -> tuple[np.ndarray, np.ndarray]:
    """The leaf values of every row and each row's [start, stop) into them, nested lists flattened;
    rows with a null element, or (an ndarray field) the wrong number of elements, go to ``problems``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    offsets = np.arange(len(array) + 1, dtype=np.int64)
    level = array
    while isinstance(level, (pa.ListArray, pa.LargeListArray, pa.FixedSizeListArray)):
        if isinstance(level, pa.FixedSizeListArray):
            inner = np.arange(len(level) + 1, dtype=np.int64) * level.type.list_size
            child = level.values.slice(level.offset * level.type.list_size, len(level) * level.type.list_size)
        else:
            raw = to_numpy(level.offsets).astype(np.int64)
            inner = raw - raw[0]
            child = level.values.slice(int(raw[0]), int(raw[-1] - raw[0]))
        if child.null_count:  # a null element (or inner list): name the rows it belongs to
            level_rows = np.searchsorted(inner, np.flatnonzero(_null_mask(child)), "right") - 1
            for row in np.unique(np.searchsorted(offsets, level_rows, "right") - 1):
                problems.setdefault(int(row), f"column {plan.column!r} has a null element in this row")
            if _is_numeric(child.type):
                child = pc.fill_null(child, pa.array([0]).cast(child.type)[0])
        offsets = inner[offsets]
        level = child
    values = to_numpy(level)
    if plan.field.type in ARRAY_KINDS:
        elements = math.prod(plan.field.options["shape"])
        lengths = np.diff(offsets)
        for row in np.flatnonzero(lengths != elements):
            problems.setdefault(
                int(row),
                f"column {plan.column!r} holds {int(lengths[row])} elements in this row; the field's shape "
                f"{plan.field.options['shape']} needs {elements} (its lists vary in length). Fix: make the field "
                "variable-length (ragged_ndarray), or pad or cut the lists to one length",
            )
    return values, offsets


def _binary_buffers(array) -> tuple[np.ndarray, np.ndarray]:
    """(all bytes, offsets) of a binary array, zero-copy: row i is ``data[offsets[i]:offsets[i+1]]``."""
    import pyarrow as pa

    buffers = array.buffers()
    if isinstance(array, pa.FixedSizeBinaryArray):
        width = array.type.byte_width
        data = np.frombuffer(buffers[1], dtype=np.uint8) if buffers[1] is not None else np.zeros(0, np.uint8)
        return data[array.offset * width :], np.arange(len(array) + 1, dtype=np.int64) * width
    kind = np.int64 if isinstance(array, pa.LargeBinaryArray) else np.int32
    offsets = np.frombuffer(buffers[1], dtype=kind)[array.offset : array.offset + len(array) + 1].astype(np.int64)
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    return data, offsets
