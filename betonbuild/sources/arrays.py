"""``arrays``: columns of an .npz file, or one .npy file per column (memory-mapped)."""

from __future__ import annotations

import math
import zipfile
from typing import Any

import blake3
import numpy as np

from betonbuild.config.spec import DatasetSpec, FieldSpec
from betonbuild.errors import ConfigError, SourceError
from betonbuild.fields import field_kind
from betonbuild.sources.base import Source
from betonbuild.sources.files import require_files

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
            with np.load(src["path"], allow_pickle=False) as npz:
                missing = [k for k in src["columns"].values() if k not in npz.files]
                if missing:
                    raise SourceError(spec.name, f"{src['path']} has no array {missing[0]!r} (it has {npz.files})")
                self.columns = [npz[src["columns"][n]] for n in spec.field_names]
        else:
            self.columns = [np.load(src["columns"][n], mmap_mode="r", allow_pickle=False) for n in spec.field_names]
        lengths = {name: len(col) for name, col in zip(spec.field_names, self.columns)}
        if len(set(lengths.values())) != 1:
            raise SourceError(spec.name, f"columns have different lengths: {lengths}")
        self.length = next(iter(lengths.values()))

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
        return tuple(col[index] for col in self.columns)

    def sample_sizes(self) -> np.ndarray:
        """Bytes per row: every row of an array source has the same size."""
        per_row = sum(col[0:1].nbytes for col in self.columns)
        return np.full(self.length, per_row, dtype=np.int64)

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
        return digest.hexdigest()


def array_headers(path: str) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """(shape, dtype) of every array of an .npy or .npz file, from its header alone."""
    if path.endswith(".npy"):
        array = np.load(path, mmap_mode="r", allow_pickle=False)
        return {"": (array.shape, array.dtype)}
    headers = {}
    with zipfile.ZipFile(path) as archive:
        for member in archive.namelist():
            with archive.open(member) as fh:
                version = np.lib.format.read_magic(fh)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, _, dtype = read(fh)
            headers[member.removesuffix(".npy")] = (shape, dtype)
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
