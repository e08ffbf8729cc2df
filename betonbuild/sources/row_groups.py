"""What the ``parquet`` and ``huggingface`` kinds share: samples that are rows of row groups (a
Parquet file's row groups, a ``datasets`` Arrow file's record batches), read by decoding one row
group's mapped columns at a time (``arrow_columns``) and keeping that one decoded row group per
thread, so that reading in order costs one decode per row group and memory stays at one row
group's columns per reader. Parts of a partitioned build are groups of whole row groups
(``shard_counts``), one work item per row group (``work_items``); a part's fingerprint names
its files' sha256s (cached per file, ``cached_hashes``) and which of their row groups it reads.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from betonbuild.config.spec import DatasetSpec, FieldSpec
from betonbuild.errors import ConfigError, SampleError, SourceError
from betonbuild.sources.arrow_columns import Column, ColumnPlan, decode_column, image_error
from betonbuild.sources.base import Source
from betonbuild.sources.cached_hashes import cached_file_hashes
from betonbuild.sources.files import count_files, require_files

# Roles whose nulls are found when the source opens (a list column's, as its row groups are read)
NULL_CHECKED_ROLES = ("scalar", "binary", "image", "string")


class RowGroupSource(Source):
    """Sample i is a row of one of ``row_groups`` (an Arrow table read in batches); the subclass
    says where the batches come from (``_read_batch``) and which file each belongs to."""

    gives_fixed_columns = True  # the int, float and ndarray fields, read a row group at a time

    group_word: ClassVar[str] = "row group"  # what a batch of rows is called in the files (messages)
    hash_cache: ClassVar[str]  # the file of cached digests, beside the manifest
    plans: list[ColumnPlan]
    offsets: np.ndarray  # row group g holds samples offsets[g]:offsets[g + 1]
    groups: list[tuple[int, int]]  # (file number in ``files``, its row group) of every row group
    cache_path: Path | None  # the cached file digests (beside the manifest)

    @classmethod
    def open(cls, spec: DatasetSpec, dataset_dir: str | os.PathLike | None = None) -> RowGroupSource:
        return cls(spec, dataset_dir)

    def _open_files(self, spec: DatasetSpec, files: list[str], cache_dir: str | os.PathLike | None) -> None:
        """What opening either kind starts with: its files (SourceError naming a missing one) and
        where their digests are cached (``cache_dir``: the manifest's directory, None for none)."""
        self.spec, self.files = spec, files
        require_files(spec.name, files)
        self.cache_path = Path(cache_dir) / self.hash_cache if cache_dir is not None else None

    def _index_files(self, counts: list[int], groups: list[tuple[int, int]]) -> None:
        """The row groups' offsets, and where each file's first row group is."""
        self.groups = groups
        self.offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)
        self._first_group = {number: g for g, (number, in_file) in enumerate(groups) if in_file == 0}
        if not len(self):
            raise SourceError(self.spec.name, f"the files {self.files} hold no row")

    def _start(self) -> None:
        self._local = threading.local()  # each thread (and forked worker) decodes its own row group
        self._pid = os.getpid()

    def _read_batch(self, group: int, columns: list[str]):
        """The top-level ``columns`` of row group ``group``, as a pyarrow Table."""
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

    def group_index(self, number: int, in_file: int) -> int:
        return self._first_group[number] + in_file

    def location(self, group: int, local: int) -> str:
        """Where a row is, for error messages: its file, row group and row in the file."""
        number, in_file = self.groups[group]
        first_in_file = self._first_group[number]
        row = int(self.offsets[group] - self.offsets[first_in_file]) + local
        return f"file {self.files[number]}, {self.group_word} {in_file}, row {row} of the file"

    def inputs_fingerprint(self, read_files: bool = True) -> dict[str, Any]:
        """Every file's sha256, read only for files new or changed since the cached digest
        (``read_files=False``: only counted)."""
        return cached_file_hashes(self.files, self.cache_path) if read_files else count_files(self.files)

    def part_fingerprint(self, rows: np.ndarray, inputs: dict[str, Any]) -> str:
        """The files the rows are read from (path, size, sha256) and which of their row groups."""
        groups = np.unique(np.searchsorted(self.offsets, rows, side="right") - 1)
        digest = hashlib.sha256()
        for group in groups.tolist():
            number, in_file = self.groups[group]
            digest.update(f"{self.files[number]}\0{inputs['file_sha256'][number]}\0{in_file}\n".encode())
        return digest.hexdigest()


class FixedColumn:
    """A fixed-size field's values indexed by an array of source indices, read one row group at a
    time (verification compares thousands of rows at once without a Python object per row)."""

    def __init__(self, source: RowGroupSource, plan: ColumnPlan):
        self.source, self.plan = source, plan
        self._lock = threading.Lock()
        self._cache: dict[int, np.ndarray] = {}  # the last two row groups (verification's threads)

    def _group(self, group: int) -> tuple[Column, np.ndarray | None]:
        """The row group's decoded column and, when no row of it has a problem, all its values at once."""
        with self._lock:
            found = self._cache.get(group)
        if found is None:
            column = self.source.decoded(group, [self.plan])[0]
            found = (column, None if column.problems else column.array())
            with self._lock:
                if len(self._cache) >= 2:
                    self._cache.pop(next(iter(self._cache)))
                self._cache[group] = found
        return found

    def _values(self, group: int, local: np.ndarray) -> np.ndarray:
        """The values of rows ``local`` of a row group. A row group with a problem row (kept by
        ``bad_samples: skip``, which then leaves that row out) gives its other rows one by one; a
        problem row asked for is raised."""
        column, whole = self._group(group)
        if whole is not None:
            return whole[local]
        asked = [int(i) for i in local.tolist()]
        bad = [i for i in asked if i in column.problems]
        if bad:
            raise_first_problem(self.source, group, self.plan, column, row=bad[0])
        return np.stack([np.asarray(column.value(i)) for i in asked])

    def __getitem__(self, indices) -> np.ndarray:
        indices = np.atleast_1d(np.asarray(indices, dtype=np.int64))
        groups = np.searchsorted(self.source.offsets, indices, side="right") - 1
        parts, order = [], np.argsort(groups, kind="stable")
        for group in np.unique(groups):
            mine = order[groups[order] == group]
            parts.append((mine, self._values(int(group), indices[mine] - self.source.offsets[group])))
        if not parts:
            return np.zeros(0)
        out = np.empty((len(indices), *parts[0][1].shape[1:]), dtype=parts[0][1].dtype)
        for where, values in parts:
            out[where] = values
        return out


def columns_schema(what: str) -> dict[str, Any]:
    """The config schema of ``columns`` (``what``: what a field maps to, e.g. "column")."""
    return {
        "type": ["object", "null"],
        "additionalProperties": {"type": "string"},
        "default": None,
        "description": f"field -> {what}, a dotted path into structs (image.bytes). Default: the field name.",
    }


def check_columns_config(
    where: str, source: dict[str, Any], fields: tuple[FieldSpec, ...], writer: dict[str, Any]
) -> None:
    """``columns`` names only fields, and the writer keeps the source's order (``check_in_order``)."""
    names = [f.name for f in fields]
    unknown = [k for k in (source.get("columns") or {}) if k not in names]
    if unknown:
        raise ConfigError(f"{where}.columns", f"names {unknown}, which are not fields {names}")
    check_in_order(where, writer)


def check_in_order(where: str, writer: dict[str, Any]) -> None:
    """A row-group source is written in its own order: a shuffled order would decode a row group per sample."""
    if writer["shuffle"] or writer["indices"] is not None:
        raise ConfigError(
            f"{where.rsplit('.', 1)[0]}.writer",
            "a parquet or huggingface source is written in row order: shuffle and indices are not supported "
            "(shuffle at load time with ffcv's Loader, order=RANDOM)",
        )


def raise_first_problem(
    source: RowGroupSource, group: int, plan: ColumnPlan, column: Column | None = None, row: int | None = None
) -> None:
    """The first row of a row group (or row ``row``) that cannot be a value of the plan's field (a
    null, a list of another length), as a SampleError; ``column``: the plan's column of that row
    group, if decoded."""
    column = column or source.decoded(group, [plan])[0]
    if column.problems:
        row = min(column.problems) if row is None else row
        raise SampleError(
            source.spec.name,
            plan.field.name,
            int(source.offsets[group]) + row,
            column.problems[row],
            ""
            if "Fix:" in column.problems[row]
            else "fill or drop the null rows (pyarrow.compute.fill_null, "
            "Table.drop_null, datasets' filter), or map the field to another column",
            location=source.location(group, row),
        )
