"""Indexed sources: objects with ``__len__`` and ``__getitem__(int) -> sample``, one module per kind.

- ``arrays``: columns of an .npz file, or one .npy file per column (memory-mapped);
- ``image_folder``: ``root/<class>/<file>`` -> (PIL image, class index), classes = sorted folder names;
- ``iterable``: the user's ``module:factory(**args)`` returning an iterable, read once (``write.onepass``);
- ``python``: the user's ``module:factory(**args)``, imported with the working directory on sys.path;
- ``webdataset``: local .tar shards, indexed through their derived shard list (``shards``);
- ``parquet``: local .parquet files, read a row group at a time (``arrow_columns`` maps the columns);
- ``huggingface``: a ``datasets`` save_to_disk directory, read offline with ``load_from_disk``.

Every kind implements ``base.Source``; ``SOURCE_KINDS`` maps a config's ``source.kind`` to it, and
the functions here ask the kind, so that no caller branches on the kind's name. Adding a kind is
one module and one entry in ``SOURCE_KINDS``.

Paths are relative to the working directory (Snakemake's ``--directory``), so users keep data and
config outside this repository.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from betonbuild.config.spec import DatasetSpec
from betonbuild.fields import field_kind
from betonbuild.sources.adapters import import_factory, reference_files
from betonbuild.sources.arrays import ArraysSource
from betonbuild.sources.base import Source
from betonbuild.sources.files import fingerprint_files, sha256_file
from betonbuild.sources.huggingface import HuggingFaceSource
from betonbuild.sources.image_folder import ImageFolderSource
from betonbuild.sources.iterable import IterableSource
from betonbuild.sources.parquet import ParquetSource
from betonbuild.sources.python import PythonSource
from betonbuild.sources.shards import SHARD_LIST
from betonbuild.sources.webdataset import WebDatasetSource

SOURCE_KINDS: dict[str, type[Source]] = {
    cls.kind: cls
    for cls in (
        ArraysSource,
        ImageFolderSource,
        IterableSource,
        PythonSource,
        WebDatasetSource,
        ParquetSource,
        HuggingFaceSource,
    )
}

__all__ = [
    "SHARD_LIST",
    "SOURCE_KINDS",
    "ArraysSource",
    "HuggingFaceSource",
    "ImageFolderSource",
    "IterableSource",
    "ParquetSource",
    "PythonSource",
    "Source",
    "WebDatasetSource",
    "adapter_files",
    "fingerprint_files",
    "gathers_fixed_values_one_by_one",
    "import_factory",
    "input_files",
    "listed_files_signature",
    "missing_listed_files",
    "missing_package",
    "needs_file_list",
    "needs_shard_list",
    "one_pass",
    "open_source",
    "sha256_file",
    "shard_files",
    "source_class",
    "source_fingerprint",
]


def source_class(spec: DatasetSpec) -> type[Source]:
    """The class that reads the dataset's source kind (not opened: no file is read)."""
    return SOURCE_KINDS[spec.source["kind"]]


def open_source(spec: DatasetSpec, dataset_dir: str | os.PathLike | None = None) -> Source:
    """The dataset's source; a webdataset source also needs the shard list in ``dataset_dir``."""
    return source_class(spec).open(spec, dataset_dir)


def adapter_files(spec: DatasetSpec) -> list[str]:
    """The user's Python files a dataset depends on: editing them must rebuild it.

    The module of a ``python`` factory or a webdataset ``pipeline``, and of every custom field's
    ``class``. Found without importing the modules themselves (parent packages are imported by
    find_spec). Installed packages and betonbuild's own modules are not the user's adapter code.
    """
    references = source_class(spec).adapter_references(spec)
    references += [ref for f in spec.fields for ref in field_kind(f).adapter_references(f)]
    return reference_files(references)


def input_files(spec: DatasetSpec) -> list[str]:
    """Files whose change must rebuild the dataset, listed cheaply (for Snakemake's DAG). A source
    with a shard list is read through it: its shards are the shard list's inputs (``shard_files``)."""
    return source_class(spec).input_files(spec) + adapter_files(spec)


def needs_shard_list(spec: DatasetSpec) -> bool:
    """The source is read through results/{ds}/shards.json (the shard_list rule's output)."""
    return source_class(spec).needs_shard_list


def one_pass(spec: DatasetSpec) -> bool:
    """The source is read once, in its own order, by the full write (an iterable): it has no part jobs."""
    return source_class(spec).one_pass


def needs_file_list(spec: DatasetSpec) -> bool:
    """The source is read through results/{ds}/files.npz (the file_list rule's output)."""
    return source_class(spec).needs_file_list


def missing_listed_files(spec: DatasetSpec) -> list[str]:
    """The listing's files that do not exist (its rule's inputs: Snakemake names them first)."""
    return source_class(spec).missing_listed_files(spec)


def listed_files_signature(spec: DatasetSpec) -> str:
    """The stat digest of the files the dataset's listing is derived from (its listing rule's parameter)."""
    return source_class(spec).listed_files_signature(spec)


def shard_files(spec: DatasetSpec) -> list[str]:
    """The inputs of the dataset's shard list (none for a source without one)."""
    return source_class(spec).shard_files(spec)


def missing_package(spec: DatasetSpec) -> bool:
    """An optional package the source needs is not installed: its jobs will fail."""
    return source_class(spec).missing_package(spec)


def gathers_fixed_values_one_by_one(spec: DatasetSpec) -> bool:
    """Verification reads fixed-size values sample by sample (no ``fixed_columns`` to slice)."""
    return not source_class(spec).gives_fixed_columns


def source_fingerprint(spec: DatasetSpec, source: Source, read_files: bool = True) -> dict[str, Any]:
    """What the manifest records of the inputs: a content digest that changes when any input does,
    the user's adapter code included (``adapters_sha256``, also part of each part's fingerprint).

    ``read_files=False``: the input files are only counted; the caller derives ``sha256`` from
    digests of their content it makes anyway (a partitioned arrays source: its parts' rows)."""
    adapters = fingerprint_files(adapter_files(spec))
    found = source.inputs_fingerprint(read_files)
    combined = (
        None
        if found["sha256"] is None
        else hashlib.sha256(f"{found['sha256']}\0{adapters['sha256']}".encode()).hexdigest()
    )
    return {
        **found,
        "files": found["files"] + adapters["files"],
        "bytes": found["bytes"] + adapters["bytes"],
        "sha256": combined,
        "adapters_sha256": adapters["sha256"],
    }
