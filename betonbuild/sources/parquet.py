"""``parquet``: local .parquet files (one, a list, globs or directories), read in row groups.

Sample i is row ``i - offset[g]`` of row group g, counting the row groups of every file in order
(the offsets come from the footers, read when the source is opened). A sample is read by
decoding its row group's mapped columns once (``arrow_columns``) and keeping that one decoded
row group per thread: reading in order costs one decode per row group, and memory stays at one
row group's columns per reader, never the whole table. A part of a partitioned build is a group
of whole row groups (``shard_counts``), read by one worker per row group (``work_items``).

Nulls are found from the footer's statistics when the source opens (the rows named by decoding
just that column chunk), so a null stops the build at its first job; a list whose length does
not fit an ``ndarray`` field, or bytes that do not decode, when its row group is read. Under
``bad_samples: {policy: skip}`` the open-time null check is left out: a null row's own read raises
(a SampleError naming field and row), so the write skips and records it like any bad sample.
Fingerprints: every file's sha256, cached beside the manifest by path, size, mtime and inode
(``.parquet-cache.json``), so one changed file of many is read again alone. pyarrow is imported
by the functions that read: the DAG lists the files (``input_files``) without it.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import threading
from pathlib import Path
from typing import Any

import numpy as np

from betonbuild.config.spec import LARGEST_SAMPLES, DatasetSpec, FieldSpec
from betonbuild.errors import ConfigError, SampleError, SourceError
from betonbuild.sources.arrow_columns import plan_columns
from betonbuild.sources.row_groups import (
    NULL_CHECKED_ROLES,
    RowGroupSource,
    check_columns_config,
    columns_schema,
    raise_first_problem,
)

_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # http:, s3:, hf:, gs: ...
HASH_CACHE = ".parquet-cache.json"


class ParquetSource(RowGroupSource):
    kind = "parquet"
    hash_cache = HASH_CACHE
    config_schema = {
        "additionalProperties": False,
        # `path` is required (check_config): not in the schema, where the arrays kind's `path` is optional
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
            "columns": columns_schema("column"),
        },
    }

    def __init__(self, spec: DatasetSpec, cache_dir: str | os.PathLike | None = None):
        import pyarrow.parquet as pq

        self._open_files(spec, expand_paths(spec), cache_dir)
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
        self.footers = footers
        self._index_files(counts, self.groups)
        self._start()
        if not spec.bad_samples.skip:  # under skip, a null row is a bad sample of its own (read fails)
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
        if "path" not in source:
            raise ConfigError(f"{where}.path", "is required: the Parquet files to read")
        for pattern in [source["path"]] if isinstance(source["path"], str) else source["path"]:
            if _URL_RE.match(pattern):
                raise ConfigError(
                    f"{where}.path",
                    f"{pattern!r} is a URL; betonbuild reads local Parquet files only (download them first)",
                )
        check_columns_config(where, source, fields, writer)

    @classmethod
    def input_files(cls, spec: DatasetSpec) -> list[str]:
        return expand_paths(spec)

    @classmethod
    def missing_package(cls, spec: DatasetSpec) -> bool:
        return importlib.util.find_spec("pyarrow") is None

    def _read_batch(self, group: int, columns: list[str]):
        number, in_file = self.groups[group]
        return self._file(number).read_row_group(in_file, columns=columns, use_threads=False)

    def sample_sizes(self) -> np.ndarray:
        """Bytes per row of the binary and image columns (the pre-flight inspects the largest), found
        cheaply: the rows' own lengths in the LARGEST_SAMPLES row groups heaviest per row by their
        footer (just those columns read); elsewhere each row group's uncompressed column chunks spread
        over its rows, scaled to the bytes the groups read held (chunks count page headers too)."""
        plans = [p for p in self.plans if p.role in ("binary", "image")]
        counts = np.diff(self.offsets)
        totals = np.zeros(len(counts), dtype=np.int64)
        for number, metadata in enumerate(self.footers):
            leaves = {metadata.schema.column(j).path: j for j in range(metadata.num_columns)}
            wanted = [leaves[p.column + (".bytes" if p.role == "image" else "")] for p in plans]
            for in_file in range(metadata.num_row_groups):
                chunks = metadata.row_group(in_file)
                totals[self.group_index(number, in_file)] = sum(
                    chunks.column(j).total_uncompressed_size for j in wanted
                )
        per_row = totals / np.maximum(counts, 1)
        exact: dict[int, np.ndarray] = {}
        for group in np.argsort(per_row, kind="stable")[::-1][:LARGEST_SAMPLES] if plans else []:
            try:
                exact[int(group)] = sum(np.diff(c.offsets) for c in self.decoded(int(group), plans))
            except SampleError:  # a damaged row group: its estimate stays, the write names it
                continue
        read = sum(int(totals[g]) for g in exact)
        scale = sum(int(v.sum()) for v in exact.values()) / read if read else 1.0
        sizes = np.repeat((per_row * scale).astype(np.int64), counts)
        for group, lengths in exact.items():
            sizes[self.offsets[group] : self.offsets[group + 1]] = lengths
        return sizes

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
        if plan.role not in NULL_CHECKED_ROLES or leaf not in leaves:
            continue
        for in_file in range(metadata.num_row_groups):
            stats = metadata.row_group(in_file).column(leaves[leaf]).statistics
            if stats is not None and stats.has_null_count and stats.null_count == 0:
                continue
            raise_first_problem(source, source.group_index(number, in_file), plan)
