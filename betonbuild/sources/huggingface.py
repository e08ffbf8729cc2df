"""``huggingface``: a directory written by ``datasets``' ``save_to_disk`` (Arrow files), read with
``datasets.load_from_disk`` offline (no network: ``HF_DATASETS_OFFLINE``/``HF_HUB_OFFLINE`` set).

Features map to fields by name (or ``columns``), under the column rules of ``arrow_columns`` (an
``Image`` feature is a struct of bytes and path: an ``rgb_image`` field, its bytes kept as
``encoded_image``); the Arrow files' record batches are the row groups (``row_groups``). The
files tracked and fingerprinted are the split's ``state.json``, ``dataset_info.json`` and the
data files it lists, found from ``state.json`` without importing ``datasets`` (the DAG does not).
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
from betonbuild.sources.arrow_columns import decode_column, plan_columns
from betonbuild.sources.files import require_files
from betonbuild.sources.row_groups import NULL_CHECKED_ROLES, RowGroupSource, check_in_order, raise_first_problem

HASH_CACHE = ".huggingface-cache.json"
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


class HuggingFaceSource(RowGroupSource):
    kind = "huggingface"
    group_word = "record batch"
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
            "columns": {
                "type": ["object", "null"],
                "additionalProperties": {"type": "string"},
                "default": None,
                "description": "field -> feature (column), a dotted path into structs. Default: the field name.",
            },
        },
    }

    def __init__(self, spec: DatasetSpec, cache_dir: str | os.PathLike | None = None):
        import pyarrow as pa

        self.spec = spec
        check_split(spec)
        self.files = self.input_files(spec)
        require_files(spec.name, self.files)
        self.cache_path = Path(cache_dir) / HASH_CACHE if cache_dir is not None else None
        dataset = load_dataset(spec)
        table = dataset.data.table
        self.plans = plan_columns(
            spec.name, spec.fields, spec.source.get("columns") or {}, table.schema, f"dataset {split_dir(spec)}"
        )
        self.batches = table.to_batches()
        data_files = self.files[2:]
        rows_per_file = [count_rows(spec.name, path, pa) for path in data_files]
        counts, groups = [], []
        number, seen, in_file = 0, 0, 0
        for batch in self.batches:  # the record batches of file after file
            while number < len(rows_per_file) - 1 and seen >= rows_per_file[number]:
                number, seen, in_file = number + 1, 0, 0
            groups.append((2 + number, in_file))
            counts.append(batch.num_rows)
            seen, in_file = seen + batch.num_rows, in_file + 1
            if seen > rows_per_file[number]:
                raise SourceError(spec.name, f"{data_files[number]}: a record batch runs past the file's end")
        if sum(counts) != sum(rows_per_file):
            raise SourceError(
                spec.name,
                f"{split_dir(spec)}: datasets read {sum(counts)} rows, its files hold {sum(rows_per_file)}; "
                "save it again with save_to_disk",
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

    @classmethod
    def check_config(
        cls, where: str, source: dict[str, Any], fields: tuple[FieldSpec, ...], writer: dict[str, Any]
    ) -> None:
        if "path" not in source:
            raise ConfigError(f"{where}.path", "is required: the save_to_disk directory to read")
        names = [f.name for f in fields]
        unknown = [k for k in (source.get("columns") or {}) if k not in names]
        if unknown:
            raise ConfigError(f"{where}.columns", f"names {unknown}, which are not fields {names}")
        check_in_order(where, writer)

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
    def open(cls, spec: DatasetSpec, dataset_dir: str | os.PathLike | None = None) -> HuggingFaceSource:
        return cls(spec, dataset_dir)

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


def count_rows(dataset: str, path: str, pa) -> int:
    """Rows of one Arrow stream file, memory-mapped (no value is read)."""
    try:
        with pa.memory_map(path) as source:
            return sum(batch.num_rows for batch in pa.ipc.open_stream(source))
    except Exception as exc:  # noqa: BLE001 - ArrowInvalid, OSError: a damaged file
        raise SourceError(
            dataset, f"{path} is not a readable Arrow file (truncated?): {type(exc).__name__}: {exc}; save it again"
        ) from None


def _child_nulls(batch, plan) -> int:
    """Nulls of the struct members on the plan's path (and an image's bytes)."""
    array, nulls = batch.column(plan.top), 0
    for name in (*plan.path, *(("bytes",) if plan.role == "image" else ())):
        array = array.field(name)
        nulls += array.null_count
    return nulls
