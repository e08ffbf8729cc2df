"""``huggingface``: a directory written by ``datasets``' ``save_to_disk`` (Arrow files), checked with
``datasets.load_from_disk`` offline (no network: ``HF_DATASETS_OFFLINE``/``HF_HUB_OFFLINE`` set).

Features map to fields by name (or ``columns``), under the column rules of ``arrow_columns`` (an
``Image`` feature is a struct of bytes and path: an ``rgb_image`` field, its bytes kept as
``encoded_image``); the Arrow files' record batches are the row groups (``row_groups``). The
files tracked and fingerprinted are the split's ``state.json``, ``dataset_info.json`` and the
data files it lists, found from ``state.json`` without importing ``datasets`` (the DAG does not).

The record batches are read with pyarrow (memory-mapped Arrow IPC streams, the files ``state.json``
lists, in order), as ``load_from_disk`` itself reads them, so that the write, verify and smoke jobs
need not import ``datasets`` (0.5 s or more per job). The manifest job, the one caller of
``inputs_fingerprint``, also loads the split with ``datasets`` and refuses a directory that it reads
otherwise (a DatasetDict, an indices mapping, features in ``dataset_info.json`` that change the
Arrow files' column types or their record batches); ``save_to_disk`` writes the indices flattened.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from betonbuild.config.spec import DatasetSpec, FieldSpec
from betonbuild.errors import ConfigError, SourceError
from betonbuild.sources.arrow_columns import decode_column, plan_columns, storage_type
from betonbuild.sources.row_groups import (
    NULL_CHECKED_ROLES,
    RowGroupSource,
    check_columns_config,
    columns_schema,
    raise_first_problem,
)

HASH_CACHE = ".huggingface-cache.json"
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


class HuggingFaceSource(RowGroupSource):
    kind = "huggingface"
    group_word = "record batch"
    hash_cache = HASH_CACHE
    config_schema = {
        "additionalProperties": False,
        # `path` is required (check_config): not in the schema, where the arrays kind's `path` is optional
        "properties": {
            "kind": {},
            "path": {"type": "string", "description": "A directory written by datasets' save_to_disk."},
            "split": {
                "type": ["string", "null"],
                "default": None,
                "description": "The split of a saved DatasetDict (a directory with dataset_dict.json).",
            },
            "columns": columns_schema("feature (column)"),
        },
    }

    def __init__(self, spec: DatasetSpec, cache_dir: str | os.PathLike | None = None):
        import pyarrow as pa

        check_split(spec)
        self._open_files(spec, self.input_files(spec), cache_dir)
        if len(self.files) < 3:  # state.json lists no data file, or is not one: not a saved dataset
            raise not_a_saved_dataset(spec, "its state.json lists no Arrow data files (_data_files)")
        self.batches, counts, groups = [], [], []
        for number, path in enumerate(self.files[2:], start=2):
            schema, batches = read_stream(spec.name, path, pa)
            if number == 2:
                self.schema = schema
            elif column_types(schema) != column_types(self.schema):
                raise not_a_saved_dataset(spec, f"{path} holds other columns than {self.files[2]}")
            self.batches += batches
            counts += [batch.num_rows for batch in batches]
            groups += [(number, in_file) for in_file in range(len(batches))]
        self.plans = plan_columns(
            spec.name, spec.fields, spec.source.get("columns") or {}, self.schema, f"dataset {split_dir(spec)}"
        )
        self._index_files(counts, groups)
        self._start()
        if not spec.bad_samples.skip:  # under skip, a null row is a bad sample of its own (its read raises)
            self._check_nulls()

    def _check_nulls(self) -> None:
        for group, batch in enumerate(self.batches):  # null counts are in the batches' headers: free to ask
            for plan in self.plans:
                if plan.role in NULL_CHECKED_ROLES and batch.column(plan.top).null_count + _child_nulls(batch, plan):
                    raise_first_problem(self, group, plan)

    def inputs_fingerprint(self, read_files: bool = True) -> dict[str, Any]:
        """The files' digests; first, since only the manifest job asks, the check that ``datasets``
        reads the directory as the other jobs do (see the module docstring)."""
        check_with_datasets(self)
        return super().inputs_fingerprint(read_files)

    @classmethod
    def check_config(
        cls, where: str, source: dict[str, Any], fields: tuple[FieldSpec, ...], writer: dict[str, Any]
    ) -> None:
        if "path" not in source:
            raise ConfigError(f"{where}.path", "is required: the save_to_disk directory to read")
        check_columns_config(where, source, fields, writer)

    @classmethod
    def input_files(cls, spec: DatasetSpec) -> list[str]:
        """state.json, dataset_info.json and the Arrow files state.json lists (the directory itself
        if it is not a saved dataset: Snakemake then names it as missing)."""
        folder = split_dir(spec)
        if not spec.source.get("split") and (folder / "dataset_dict.json").exists():
            return [str(folder / "dataset_dict.json")]  # its job then says to name a split
        try:
            state = json.loads((folder / "state.json").read_text())
            data = [str(folder / entry["filename"]) for entry in state["_data_files"]]
        except (OSError, ValueError, KeyError, TypeError):
            return [str(folder / "state.json")]
        return [str(folder / "state.json"), str(folder / "dataset_info.json"), *data]

    @classmethod
    def missing_package(cls, spec: DatasetSpec) -> bool:
        return importlib.util.find_spec("datasets") is None

    def _read_batch(self, group: int, columns: list[str]):
        return self.batches[group].select(columns)

    def sample_sizes(self) -> np.ndarray:
        """Bytes of each row's binary and image values, from the memory-mapped Arrow offsets (no value
        is read): the smoke stage's pre-flight inspects the largest images."""
        sizes = np.zeros(len(self), dtype=np.int64)
        for group, batch in enumerate(self.batches):
            start = int(self.offsets[group])
            for plan in (p for p in self.plans if p.role in ("binary", "image")):
                sizes[start : start + batch.num_rows] += np.diff(decode_column(plan, batch.column(plan.top)).offsets)
        return sizes


def split_dir(spec: DatasetSpec) -> Path:
    """The directory of the split read: ``path``, or ``path/<split>`` of a saved DatasetDict."""
    root = Path(spec.source["path"])
    split = spec.source.get("split")
    return root / split if split else root


def check_split(spec: DatasetSpec) -> None:
    """A saved DatasetDict is read one split at a time: SourceError naming its splits if none is given."""
    root, split = Path(spec.source["path"]), spec.source.get("split")
    if not split and (root / "dataset_dict.json").exists():
        splits = sorted(p.name for p in root.iterdir() if (p / "state.json").exists())
        raise SourceError(
            spec.name, f"{root} is a saved DatasetDict of splits {splits}: name the one to read with source.split"
        )


def load_dataset(spec: DatasetSpec):
    """``datasets.load_from_disk`` of the split's directory, offline; SourceError if it is not one."""
    for key, value in OFFLINE.items():
        os.environ.setdefault(key, value)
    try:
        import datasets
    except ImportError as exc:
        raise SourceError(
            spec.name,
            f"this dataset reads a Hugging Face datasets directory, but the optional package `datasets` cannot be "
            f"imported ({exc}) (pip install betonbuild[huggingface], as pinned in requirements.lock)",
        ) from None
    try:
        dataset = datasets.load_from_disk(str(split_dir(spec)))
    except Exception as exc:  # noqa: BLE001 - FileNotFoundError, ArrowInvalid, json errors...: not a saved dataset
        raise SourceError(
            spec.name,
            f"{split_dir(spec)} is not a readable datasets directory (written by save_to_disk): "
            f"{type(exc).__name__}: {exc}; save it again",
        ) from None
    if not isinstance(dataset, datasets.Dataset):
        raise SourceError(
            spec.name, f"{split_dir(spec)} holds a {type(dataset).__name__}; name a split with source.split"
        )
    if dataset._indices is not None:  # a selection or shuffle not written out: rows would be read out of order
        raise SourceError(
            spec.name, f"{split_dir(spec)} holds an indices mapping; save dataset.flatten_indices() instead"
        )
    return dataset


def read_stream(dataset: str, path: str, pa) -> tuple[Any, list]:
    """(schema, record batches) of one Arrow stream file, memory-mapped (no value is read)."""
    try:
        reader = pa.ipc.open_stream(pa.memory_map(path))  # the map lives as long as its batches
        return reader.schema, list(reader)
    except Exception as exc:  # noqa: BLE001 - ArrowInvalid, OSError: a damaged file
        raise SourceError(
            dataset, f"{path} is not a readable Arrow file (truncated?): {type(exc).__name__}: {exc}; save it again"
        ) from None


def column_types(schema) -> list[tuple[str, Any]]:
    """(name, type) of every column, an extension type (``Array2D``, registered only once ``datasets``
    is imported) as its storage type."""
    return [(f.name, storage_type(f.type)) for f in schema]


def not_a_saved_dataset(spec: DatasetSpec, why: str) -> SourceError:
    return SourceError(
        spec.name,
        f"{split_dir(spec)} is not a readable datasets directory (written by save_to_disk): {why}; save it again",
    )


def check_with_datasets(source: HuggingFaceSource) -> None:
    """``load_from_disk`` gives the record batches read directly (column types, rows per batch), or
    SourceError: ``datasets`` casts the files' columns to ``dataset_info.json``'s features when they
    differ, which the direct read would not."""
    spec = source.spec
    table = load_dataset(spec).data.table
    theirs, ours = column_types(table.schema), column_types(source.schema)
    if theirs != ours:
        raise SourceError(
            spec.name,
            f"{split_dir(spec)}: datasets reads the columns {theirs} (its dataset_info.json's features), but the "
            f"Arrow files hold {ours}; save the dataset again with save_to_disk",
        )
    if [b.num_rows for b in table.to_batches()] != np.diff(source.offsets).tolist():
        raise SourceError(
            spec.name,
            f"{split_dir(spec)}: datasets reads {table.num_rows} rows in other record batches than its Arrow files "
            f"hold ({len(source)} rows); save it again with save_to_disk",
        )


def _child_nulls(batch, plan) -> int:
    """Nulls of the struct members on the plan's path (and an image's bytes)."""
    array, nulls = batch.column(plan.top), 0
    for name in (*plan.path, *(("bytes",) if plan.role == "image" else ())):
        array = array.field(name)
        nulls += array.null_count
    return nulls
