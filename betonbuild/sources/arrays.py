"""``arrays``: columns of an .npz file, or one .npy file per column (memory-mapped)."""

from __future__ import annotations

import math
import os
import zipfile
from typing import Any

import blake3
import numpy as np

from betonbuild.config.spec import DatasetSpec, FieldSpec
from betonbuild.errors import ConfigError, SourceError
from betonbuild.fields import field_kind
from betonbuild.mapped_pages import release_mapped
from betonbuild.sources.base import Source
from betonbuild.sources.files import require_files

# Rows read one by one between unmappings of the .npy columns' pages (mapped, they count in the
# reading process's RSS: 24 bytes a row of float32[4] + int64, 2.4 GB in each writer worker at 100M)
RELEASE_EVERY_READS = 1 << 18
HASH_BLOCK_BYTES = 64 << 20


class ArraysSource(Source):
    kind = "arrays"
    # The source's entry in the config, as JSON Schema (config.load assembles the whole schema)
    config_schema = {
        "additionalProperties": False,
        "required": ["columns"],
        "properties": {
            "kind": {},
            "path": {
                "type": "string",
                "description": "An .npz file; `columns` then names its keys. Without it, columns are .npy paths.",
            },
            "columns": {"type": "object", "minProperties": 1, "additionalProperties": {"type": "string"}},
        },
    }
    may_import_ffcv = False  # reading the source needs neither ffcv nor torch
    gives_fixed_columns = True
    fingerprint_from_parts = True

    def __init__(self, spec: DatasetSpec):
        self.spec = spec
        src = spec.source
        self.files = self.input_files(spec)
        require_files(spec.name, self.files)
        if "path" in src:
            self.columns = load_npz_columns(spec.name, src["path"], [src["columns"][n] for n in spec.field_names])
        else:
            self.columns = [load_npy_column(spec.name, src["columns"][n]) for n in spec.field_names]
        lengths = {name: len(col) for name, col in zip(spec.field_names, self.columns)}
        if len(set(lengths.values())) != 1:
            raise SourceError(spec.name, f"columns have different lengths: {lengths}")
        self.length = next(iter(lengths.values()))
        # Rows are read through plain ndarray views: numpy.memmap's Python __getitem__ and
        # __array_finalize__ cost ~3 us a row each; the views' base is the memmap (release_mapped)
        self._row_views = [column.view(np.ndarray) for column in self.columns]
        self._reads = 0

    @classmethod
    def check_config(
        cls, where: str, source: dict[str, Any], fields: tuple[FieldSpec, ...], writer: dict[str, Any]
    ) -> None:
        names = [f.name for f in fields]
        columns = source["columns"]
        missing = [n for n in names if n not in columns]
        extra = [c for c in columns if c not in names]
        if missing or extra:
            raise ConfigError(
                f"{where}.columns",
                f"must name one array per field; missing {missing}, not a field {extra}",
            )
        if "path" not in source:
            bad = [c for c in columns.values() if not c.endswith(".npy")]
            if bad:
                raise ConfigError(f"{where}.columns", f"without `path` every column is a .npy file; got {bad}")
        elif not source["path"].endswith(".npz"):
            raise ConfigError(f"{where}.path", f"{source['path']!r} must be an .npz file (or give .npy columns)")
        for field in fields:  # options about decoding a source's JPEGs: an array holds pixels
            for option, default in (("decode", "full"), ("source_jpeg", "reencode")):
                if field.options.get(option, default) != default:
                    raise ConfigError(
                        f"{where.rsplit('.', 1)[0]}.fields.{field.name}.{option}",
                        f"an arrays source holds pixels, not JPEGs: `{option}: {field.options[option]}` has "
                        "nothing to act on; remove it",
                    )

    @classmethod
    def input_files(cls, spec: DatasetSpec) -> list[str]:
        src = spec.source
        return [src["path"]] if "path" in src else [src["columns"][n] for n in spec.field_names]

    @classmethod
    def estimated_length(cls, spec: DatasetSpec) -> int | None:
        """The first field's array's length, from its header."""
        arrays = field_array_headers(spec)
        return arrays[0][0][0] if arrays and arrays[0][0] else None

    @classmethod
    def resident_bytes(cls, spec: DatasetSpec) -> int:
        """An .npz source is loaded whole; .npy columns are memory-mapped."""
        arrays = field_array_headers(spec)
        if not arrays or "path" not in spec.source:
            return 0
        return sum(math.prod(shape) * dtype.itemsize for shape, dtype in arrays)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple:
        self._reads += 1
        if self._reads % RELEASE_EVERY_READS == 0:  # a write's worker reads rows across the whole file
            release_mapped(*self.columns)
        return tuple([column[index] for column in self._row_views])

    def sample_sizes(self) -> np.ndarray:
        """Bytes per row: every row of an array source has the same size."""
        per_row = sum(col[0:1].nbytes for col in self.columns)
        return np.broadcast_to(np.int64(per_row), (self.length,))  # read-only, no memory per row

    def fixed_columns(self) -> dict[str, Any]:
        """Values of the fixed-size fields for many rows at once, indexed by source index."""
        by_name = dict(zip(self.spec.field_names, self.columns))
        return {f.name: by_name[f.name] for f in self.spec.fields if field_kind(f).fixed_size}

    def part_fingerprint(self, rows: np.ndarray, inputs: dict[str, Any]) -> str:
        """The rows of every column, as bytes, read in blocks of at most 64 MiB. Rows in ascending
        runs (no shuffle) are hashed straight from the memory map, without a copy.

        BLAKE3, not sha256: it hashes memory-mapped rows at about 7 GiB/s per core, sha256 at 1.5,
        and this is the one digest of a clean partitioned build that reads every byte of the source."""
        digest = blake3.blake3()
        first = int(rows[0]) if len(rows) else 0
        contiguous = bool(np.array_equal(rows, np.arange(first, first + len(rows))))
        for column in self.columns:
            digest.update(f"{column.dtype.str}{column.shape[1:]}\n".encode())
            step = max(1, HASH_BLOCK_BYTES // max(1, column[:1].nbytes))
            for start in range(0, len(rows), step):
                stop = min(start + step, len(rows))
                block = column[first + start : first + stop] if contiguous else column[rows[start:stop]]
                digest.update(memoryview(np.ascontiguousarray(block)).cast("B"))
                release_mapped(column)  # mapped, every page hashed stays in the RSS (24 B a row at 100M rows)
        return digest.hexdigest()


def load_npz_columns(dataset: str, path: str, keys: list[str]) -> list[np.ndarray]:
    """The arrays ``keys`` of an .npz file, loaded whole; a file numpy cannot load safely is a SourceError."""
    try:
        headers = array_headers(path)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise SourceError(dataset, f"{path} is not a readable .npz file: {exc}") from None
    missing = [k for k in keys if k not in headers]
    if missing:
        raise SourceError(dataset, f"{path} has no array {missing[0]!r} (it has {list(headers)})")
    for key in keys:
        _check_array_header(dataset, f"array {key!r} of {path}", *headers[key])
    try:
        with np.load(path, allow_pickle=False) as npz:
            return [npz[key] for key in keys]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:  # e.g. a damaged member (CRC, zlib)
        raise SourceError(dataset, f"cannot read {path}: {type(exc).__name__}: {exc}") from None


def load_npy_column(dataset: str, path: str) -> np.ndarray:
    """One .npy column, memory-mapped, after its header is checked against the file's size."""
    try:
        with open(path, "rb") as fh:
            shape, dtype = _npy_header(fh)
            data_offset = fh.tell()
        size = os.path.getsize(path)
    except (OSError, ValueError, EOFError) as exc:
        raise SourceError(dataset, f"{path} is not a readable .npy file: {exc}") from None
    _check_array_header(dataset, str(path), shape, dtype)
    row_bytes = math.prod(shape[1:]) * dtype.itemsize
    needed = data_offset + shape[0] * row_bytes
    if size < needed:
        whole_rows = (size - data_offset) // row_bytes if row_bytes else 0
        raise SourceError(
            dataset,
            f"{path} is truncated: its header claims {shape[0]:,} rows of {dtype} {list(shape[1:])} "
            f"({needed:,} bytes with the {data_offset}-byte header) but the file holds {size:,} bytes "
            f"({max(whole_rows, 0):,} whole rows); write it again (np.save) or copy it again",
        )
    return np.load(path, mmap_mode="r", allow_pickle=False)


def _check_array_header(dataset: str, what: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
    """Refuses what cannot be a column: Python objects (loading them needs pickle) and a 0-d array."""
    if dtype.hasobject:
        raise SourceError(
            dataset,
            f"{what} holds Python objects (dtype {dtype}), which numpy loads only with pickle (allow_pickle=True "
            "runs code from the file); save it as a numeric or fixed-width array (e.g. np.stack the rows, "
            "or a bytes/str dtype), or read it with a python source",
        )
    if not shape:
        raise SourceError(dataset, f"{what} is a 0-d array (one value); a column needs one row per sample")


def _npy_header(fh) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) from an open .npy stream, leaving it at the first data byte."""
    version = np.lib.format.read_magic(fh)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = read(fh)
    return shape, dtype


def array_headers(path: str) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """(shape, dtype) of every array of an .npy or .npz file, from its header alone."""
    if path.endswith(".npy"):
        with open(path, "rb") as fh:
            return {"": _npy_header(fh)}
    headers = {}
    with zipfile.ZipFile(path) as archive:
        for member in archive.namelist():
            with archive.open(member) as fh:
                headers[member.removesuffix(".npy")] = _npy_header(fh)
    return headers


def field_array_headers(spec: DatasetSpec) -> list[tuple[tuple[int, ...], np.dtype]] | None:
    """(shape, dtype) per field of an arrays source whose files exist, else None."""
    source = spec.source
    try:
        if "path" in source:
            headers = array_headers(source["path"])
            return [headers[source["columns"][name]] for name in spec.field_names]
        return [array_headers(source["columns"][name])[""] for name in spec.field_names]
    except (OSError, KeyError, ValueError):
        return None
