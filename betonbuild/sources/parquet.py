"""``parquet``: local .parquet files (one, a list, globs or directories), read in row groups.

Sample i is row ``i - offset[g]`` of row group g, counting the row groups of every file in order
(the offsets come from the footers, read when the source is opened). A sample is read by
decoding its row group's mapped columns once (``arrow_columns``) and keeping that one decoded
row group per thread: reading in order costs one decode per row group, and memory stays at one
row group's columns per reader, never the whole table. A part of a partitioned build is a group
of whole row groups (``shard_counts``), read by one worker per row group (``work_items``).

Nulls are found from the footer's statistics when the source opens (the rows named by decoding
just that column chunk), so a null stops the build at its first job; a list whose length does
not fit an ``ndarray`` field, or bytes that do not decode, when its row group is read.
Fingerprints: every file's sha256, cached beside the manifest by path, size, mtime and inode
(``.parquet-cache.json``), so one changed file of many is read again alone. pyarrow is imported
by the functions that read: the DAG lists the files (``input_files``) without it.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import os
import re
import threading
from pathlib import Path
from typing import Any

import numpy as np

from betonbuild.config.spec import DatasetSpec, FieldSpec
from betonbuild.errors import ConfigError, SampleError, SourceError
from betonbuild.sources.arrow_columns import Column, ColumnPlan, decode_column, image_error, plan_columns
from betonbuild.sources.base import Source
from betonbuild.sources.cached_hashes import cached_file_hashes
from betonbuild.sources.files import require_files

_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # http:, s3:, hf:, gs: ...
HASH_CACHE = ".parquet-cache.json"


class RowGroupSource(Source):
    """Sample i is a row of one of ``row_groups`` (an Arrow table read in batches); the subclass
    says where the batches come from (``_read_batch``) and which file each belongs to."""

    gives_fixed_columns = True  # the int, float and ndarray fields, read a row group at a time

    plans: list[ColumnPlan]
    offsets: np.ndarray  # row group g holds samples offsets[g]:offsets[g + 1]

    def _start(self) -> None:
        self._local = threading.local()  # each thread (and forked worker) decodes its own row group
        self._pid = os.getpid()

    def _read_batch(self, group: int, columns: list[str]):
        """The top-level ``columns`` of row group ``group``, as a pyarrow Table."""
        raise NotImplementedError

    def location(self, group: int, local: int) -> str:
        """Where a row is, for error messages."""
        raise NotImplementedError

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def group_of(self, index: int) -> int:
        return int(np.searchsorted(self.offsets, index, side="right") - 1)

    def shard_counts(self) -> list[int]:
        """Rows per row group: a part is a group of whole row groups."""
        return np.diff(self.offsets).tolist()

    def work_items(self, rows: np.ndarray) -> list:
        """One work item per row group, so each row group is decoded once, by one worker."""
        groups = np.searchsorted(self.offsets, rows, side="right") - 1
        pairs = np.stack([np.arange(len(rows), dtype=np.int64), np.asarray(rows, dtype=np.int64)], axis=1)
        cuts = np.flatnonzero(np.diff(groups)) + 1
        return np.split(pairs, cuts) if len(rows) else []

    def decoded(self, group: int, plans: list[ColumnPlan] | None = None) -> list[Column]:
        """The mapped columns of one row group, decoded (``plans``: a subset, not cached)."""
        wanted = self.plans if plans is None else plans
        try:
            table = self._read_batch(group, sorted({p.top for p in wanted}))
            return [decode_column(p, table.column(p.top)) for p in wanted]
        except SampleError:
            raise
        except Exception as exc:  # noqa: BLE001 - pyarrow's errors of a damaged file have many types
            raise SampleError(
                self.spec.name,
                None,
                int(self.offsets[group]),
                f"cannot read the row group: {type(exc).__name__}: {exc}",
                "write the file again, or copy it again if it was cut",
                location=self.location(group, 0),
            ) from None

    def _row_group(self, group: int) -> list[Column]:
        if os.getpid() != self._pid:  # a forked writer worker must not share its parent's cache
            self._local, self._pid = threading.local(), os.getpid()
        cached = getattr(self._local, "cached", None)
        if cached is None or cached[0] != group:
            cached = self._local.cached = (group, self.decoded(group))
        return cached[1]

    def __getitem__(self, index: int) -> tuple:
        index = int(index)
        if not 0 <= index < len(self):
            raise IndexError(index)
        group = self.group_of(index)
        local = index - int(self.offsets[group])
        values = []
        for column in self._row_group(group):
            field = column.plan.field.name
            problem = column.problem(local)
            if problem:
                raise SampleError(self.spec.name, field, index, problem, location=self.location(group, local))
            try:
                values.append(column.value(local))
            except Exception as exc:  # noqa: BLE001 - an image that does not decode is this row's error
                why, fix = image_error(exc)
                raise SampleError(
                    self.spec.name, field, index, why, fix, location=self.location(group, local)
                ) from None
        return tuple(values)

    def encoded_image(self, index: int) -> np.ndarray | None:
        """The image bytes of the first image field, as stored (for ``source_jpeg: keep`` and the
        verifier's direct decode, which take the first variable-size field to be the image)."""
        variable = [c for c in self._row_group(self.group_of(int(index))) if not c.plan.fixed]
        if (
            not variable
            or variable[0].plan.role not in ("image", "binary")
            or variable[0].plan.field.type != "rgb_image"
        ):
            return None
        local = int(index) - int(self.offsets[self.group_of(int(index))])
        if variable[0].problem(local):
            return None
        return np.array(variable[0].encoded(local))

    def fixed_columns(self) -> dict[str, Any]:
        return {p.field.name: FixedColumn(self, p) for p in self.plans if p.fixed}


class FixedColumn:
    """A fixed-size field's values indexed by an array of source indices, read one row group at a
    time (verification compares thousands of rows at once without a Python object per row)."""

    def __init__(self, source: RowGroupSource, plan: ColumnPlan):
        self.source, self.plan = source, plan
        self._lock = threading.Lock()
        self._cache: dict[int, np.ndarray] = {}  # the last two row groups (verification's threads)

    def _group(self, group: int) -> np.ndarray:
        with self._lock:
            found = self._cache.get(group)
        if found is None:
            column = self.source.decoded(group, [self.plan])[0]
            try:
                found = column.array()
            except ValueError as exc:
                raise SourceError(self.source.spec.name, f"field '{self.plan.field.name}', {exc}") from None
            with self._lock:
                if len(self._cache) >= 2:
                    self._cache.pop(next(iter(self._cache)))
                self._cache[group] = found
        return found

    def __getitem__(self, indices) -> np.ndarray:
        indices = np.atleast_1d(np.asarray(indices, dtype=np.int64))
        groups = np.searchsorted(self.source.offsets, indices, side="right") - 1
        parts, order = [], np.argsort(groups, kind="stable")
        for group in np.unique(groups):
            mine = order[groups[order] == group]
            parts.append((mine, self._group(int(group))[indices[mine] - self.source.offsets[group]]))
        if not parts:
            return np.zeros(0)
        out = np.empty((len(indices), *parts[0][1].shape[1:]), dtype=parts[0][1].dtype)
        for where, values in parts:
            out[where] = values
        return out


class ParquetSource(RowGroupSource):
    kind = "parquet"
    config_schema = {
        "additionalProperties": False,
        "required": ["path"],
        "properties": {
            "kind": {},
            "path": {
                "type": ["string", "array"],
                "items": {"type": "string"},
                "minItems": 1,
                "description": (
                    "Local .parquet files: a file, a glob, a directory (its *.parquet, recursively), or a list."
                ),
            },
            "columns": {
                "type": ["object", "null"],
                "additionalProperties": {"type": "string"},
                "default": None,
                "description": "field -> column, a dotted path into structs (image.bytes). Default: the field name.",
            },
        },
    }

    def __init__(self, spec: DatasetSpec, cache_dir: str | os.PathLike | None = None):
        import pyarrow.parquet as pq

        self.spec = spec
        self.files = expand_paths(spec)
        require_files(spec.name, self.files)
        self.cache_path = Path(cache_dir) / HASH_CACHE if cache_dir is not None else None
        counts: list[int] = []
        self.groups: list[tuple[int, int]] = []  # (file, row group in the file) of every row group
        footers = []
        for number, path in enumerate(self.files):
            metadata = footer(spec.name, path, pq)
            schema = metadata.schema.to_arrow_schema()
            plans = plan_columns(spec.name, spec.fields, spec.source.get("columns") or {}, schema, f"file {path}")
            if number == 0:
                self.plans, self.schema = plans, schema
            else:
                self._check_same_types(path, schema)
            counts += [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)]
            self.groups += [(number, g) for g in range(metadata.num_row_groups)]
            footers.append(metadata)
        self.offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)
        self._first_group = {number: g for g, (number, in_file) in enumerate(self.groups) if in_file == 0}
        if not len(self):
            raise SourceError(spec.name, f"the Parquet files {self.files} hold no row")
        self._start()
        for number, metadata in enumerate(footers):
            check_nulls_from_statistics(self, number, metadata)

    def _check_same_types(self, path: str, schema) -> None:
        for plan in self.plans:
            first, here = self.schema.field(plan.top).type, schema.field(plan.top).type
            if first != here:
                raise SourceError(
                    self.spec.name,
                    f"field '{plan.field.name}': column {plan.top!r} is {here} in {path} but {first} in "
                    f"{self.files[0]}; every file must give a column one type (cast them to one schema)",
                )

    @classmethod
    def check_config(
        cls, where: str, source: dict[str, Any], fields: tuple[FieldSpec, ...], writer: dict[str, Any]
    ) -> None:
        names = [f.name for f in fields]
        for pattern in [source["path"]] if isinstance(source["path"], str) else source["path"]:
            if _URL_RE.match(pattern):
                raise ConfigError(
                    f"{where}.path",
                    f"{pattern!r} is a URL; betonbuild reads local Parquet files only (download them first)",
                )
        unknown = [k for k in (source.get("columns") or {}) if k not in names]
        if unknown:
            raise ConfigError(f"{where}.columns", f"names {unknown}, which are not fields {names}")
        check_in_order(where, writer)

    @classmethod
    def input_files(cls, spec: DatasetSpec) -> list[str]:
        return expand_paths(spec)

    @classmethod
    def open(cls, spec: DatasetSpec, dataset_dir: str | os.PathLike | None = None) -> ParquetSource:
        return cls(spec, dataset_dir)

    @classmethod
    def missing_package(cls, spec: DatasetSpec) -> bool:
        return importlib.util.find_spec("pyarrow") is None

    def _read_batch(self, group: int, columns: list[str]):
        number, in_file = self.groups[group]
        return self._file(number).read_row_group(in_file, columns=columns, use_threads=False)

    def _file(self, number: int):
        """This thread's open ParquetFile of file ``number`` (reopened in a forked worker)."""
        import pyarrow.parquet as pq

        if os.getpid() != self._pid:
            self._local, self._pid = threading.local(), os.getpid()
        opened = self._local.__dict__.setdefault("files", {})
        if number not in opened:
            opened.clear()  # one file open per thread: sequential reading moves from file to file
            opened[number] = pq.ParquetFile(self.files[number])
        return opened[number]

    def group_index(self, number: int, in_file: int) -> int:
        return self._first_group[number] + in_file

    def location(self, group: int, local: int) -> str:
        number, in_file = self.groups[group]
        first_in_file = self._first_group[number]
        row = int(self.offsets[group] - self.offsets[first_in_file]) + local
        return f"file {self.files[number]}, row group {in_file}, row {row} of the file"

    def inputs_fingerprint(self, read_files: bool = True) -> dict[str, Any]:
        """Every file's sha256, read only for files new or changed since the cached digest."""
        return cached_file_hashes(self.files, self.cache_path)

    def part_fingerprint(self, rows: np.ndarray, inputs: dict[str, Any]) -> str:
        """The files the rows are read from (path, size, sha256) and which of their row groups."""
        groups = np.unique(np.searchsorted(self.offsets, rows, side="right") - 1)
        digest = hashlib.sha256()
        for group in groups.tolist():
            number, in_file = self.groups[group]
            digest.update(f"{self.files[number]}\0{inputs['file_sha256'][number]}\0{in_file}\n".encode())
        return digest.hexdigest()


def check_in_order(where: str, writer: dict[str, Any]) -> None:
    """A row-group source is written in its own order: a shuffled order would decode a row group per sample."""
    if writer["shuffle"] or writer["indices"] is not None:
        raise ConfigError(
            f"{where.rsplit('.', 1)[0]}.writer",
            "a parquet or huggingface source is written in row order: shuffle and indices are not supported "
            "(shuffle at load time with ffcv's Loader, order=RANDOM)",
        )


def expand_paths(spec: DatasetSpec) -> list[str]:
    """The .parquet files of the source, in order: globs and directories expanded (sorted)."""
    patterns = spec.source["path"]
    paths: list[str] = []
    for pattern in [patterns] if isinstance(patterns, str) else patterns:
        if glob.has_magic(pattern):
            matched = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
            if not matched:
                raise SourceError(spec.name, f"Parquet pattern {pattern!r} matches no file")
            paths += matched
        elif os.path.isdir(pattern):
            found = sorted(str(p) for p in Path(pattern).rglob("*.parquet") if p.is_file())
            if not found:
                raise SourceError(spec.name, f"directory {pattern} holds no .parquet file")
            paths += found
        else:
            paths.append(pattern)
    duplicates = sorted({p for p in paths if paths.count(p) > 1})
    if duplicates:
        raise SourceError(spec.name, f"Parquet file {duplicates[0]} is listed twice")
    return paths


def footer(dataset: str, path: str, pq):
    """The file's footer metadata; SourceError if it is not a (whole) Parquet file."""
    try:
        return pq.ParquetFile(path).metadata
    except Exception as exc:  # noqa: BLE001 - ArrowInvalid, OSError...: the file is not what it should be
        raise SourceError(
            dataset,
            f"{path} is not a readable Parquet file (truncated, or not Parquet): {type(exc).__name__}: {exc}; "
            "write it again, or copy it again if it was cut",
        ) from None


def check_nulls_from_statistics(source: ParquetSource, number: int, metadata) -> None:
    """A null in a scalar, binary, string or image column, found from the footer's null counts and
    named by row (just that column chunk decoded); list columns are checked as their row groups are
    read (their statistics count empty lists as nulls)."""
    leaves = {metadata.schema.column(j).path: j for j in range(metadata.num_columns)}
    for plan in source.plans:
        leaf = plan.column + (".bytes" if plan.role == "image" else "")
        if plan.role not in ("scalar", "binary", "image", "string") or leaf not in leaves:
            continue
        for in_file in range(metadata.num_row_groups):
            stats = metadata.row_group(in_file).column(leaves[leaf]).statistics
            if stats is not None and stats.has_null_count and stats.null_count == 0:
                continue
            group = source.group_index(number, in_file)
            column = source.decoded(group, [plan])[0]
            if column.problems:
                row = min(column.problems)
                raise SampleError(
                    source.spec.name,
                    plan.field.name,
                    int(source.offsets[group]) + row,
                    column.problems[row],
                    "fill or drop the null rows (pyarrow.compute.fill_null, Table.drop_null), or map the field "
                    "to another column",
                    location=source.location(group, row),
                )
