"""Indexed sources: objects with ``__len__`` and ``__getitem__(int) -> sample``.

- ``arrays``: columns of an .npz file, or one .npy file per column (memory-mapped);
- ``image_folder``: ``root/<class>/<file>`` -> (PIL image, class index), classes = sorted folder names;
- ``python``: the user's ``module:factory(**args)``, imported with the working directory on sys.path;
- ``webdataset``: local .tar shards, indexed through their derived shard list (see ``wds``).

Paths are relative to the working directory (Snakemake's ``--directory``), so users keep data and
config outside this repository.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from betonbuild.config.spec import DatasetSpec
from betonbuild.errors import SampleError, SourceError
from betonbuild.fields import field_kind


class ArraysSource:
    may_import_ffcv = False  # reading the source needs neither ffcv nor torch

    def __init__(self, spec: DatasetSpec):
        self.spec = spec
        src = spec.source
        self.files = [src["path"]] if "path" in src else [src["columns"][n] for n in spec.field_names]
        _require_files(spec.name, self.files)
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

    def encoded_image(self, index: int) -> None:
        return None


class ImageFolderSource:
    may_import_ffcv = False

    def __init__(self, spec: DatasetSpec):
        self.spec = spec
        self.root = Path(spec.source["root"])
        if not self.root.is_dir():
            raise SourceError(spec.name, f"image folder {self.root} does not exist (working directory {os.getcwd()})")
        self.classes, self.items = list_image_folder(self.root, spec.source["extensions"])
        if not self.items:
            raise SourceError(spec.name, f"image folder {self.root} has no images in class sub-folders")
        self.files = [str(self.root / rel) for rel, _ in self.items]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple:
        from PIL import Image, UnidentifiedImageError

        rel, label = self.items[index]
        path = self.root / rel
        try:
            image = Image.open(path)
            image.load()
        except (OSError, UnidentifiedImageError) as exc:
            raise SampleError(self.spec.name, self.spec.field_names[0], index, f"cannot decode {path}: {exc}") from None
        return image, label

    def sample_sizes(self) -> np.ndarray:
        return np.array([os.path.getsize(f) for f in self.files], dtype=np.int64)

    def fixed_columns(self) -> dict[str, Any]:
        """The labels (the second field), indexed by source index."""
        labels = np.array([label for _, label in self.items], dtype=np.int64)
        return {self.spec.fields[1].name: labels}

    def encoded_image(self, index: int) -> np.ndarray | None:
        """The image file's bytes as they are on disk (None if it cannot be read)."""
        try:
            with open(self.files[index], "rb") as fh:
                return np.frombuffer(fh.read(), dtype=np.uint8)
        except OSError:
            return None


def list_image_folder(root: Path, extensions: list[str]) -> tuple[list[str], list[tuple[str, int]]]:
    """(classes, [(relative path, class index)]) in a stable, sorted order."""
    wanted = {e.lower() for e in extensions}
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    items = []
    for label, name in enumerate(classes):
        for dirpath, dirnames, filenames in os.walk(root / name):
            dirnames.sort()
            for filename in sorted(filenames):
                if Path(filename).suffix.lower() in wanted and not filename.startswith("."):
                    items.append((os.path.relpath(os.path.join(dirpath, filename), root), label))
    return classes, items


class PythonSource:
    # The user's code may import anything (ffcv, torch): verification then keeps the Loader batch in-process.
    may_import_ffcv = True

    def __init__(self, spec: DatasetSpec):
        self.spec = spec
        factory = import_factory(spec.name, spec.source["factory"])
        try:
            self.dataset = factory(**spec.source.get("args", {}))
        except Exception as exc:
            raise SourceError(
                spec.name, f"factory {spec.source['factory']} raised {type(exc).__name__}: {exc}"
            ) from exc
        if not (hasattr(self.dataset, "__len__") and hasattr(self.dataset, "__getitem__")):
            raise SourceError(
                spec.name,
                f"factory {spec.source['factory']} returned a {type(self.dataset).__name__}, "
                "which lacks __len__ and __getitem__",
            )

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def sample_sizes(self) -> None:
        return None  # unknown without reading every sample

    def fixed_columns(self) -> dict[str, Any]:
        return {}

    def encoded_image(self, index: int) -> None:
        return None


def import_factory(dataset: str, factory: str):
    module_name, attr = factory.split(":")
    _ensure_workdir_importable()
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise SourceError(
            dataset, f"cannot import module {module_name!r} of factory {factory}: {type(exc).__name__}: {exc}"
        ) from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise SourceError(dataset, f"module {module_name!r} has no attribute {attr!r}") from None


def adapter_files(spec: DatasetSpec) -> list[str]:
    """The user's Python files a dataset depends on: editing them must rebuild it.

    The module of a ``python`` factory or a webdataset ``pipeline``, and of every custom field's
    ``class``. Found without importing the modules themselves (parent packages are imported by
    find_spec). Installed packages and betonbuild's own modules are not the user's adapter code.
    """
    references = [spec.source.get("factory"), spec.source.get("pipeline")]
    references += [f.options["class"] for f in spec.fields if f.type == "custom"]
    files = []
    for reference in filter(None, references):
        path = _module_file(reference.split(":")[0])
        if path and path not in files:
            files.append(path)
    return files


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # betonbuild/


def _module_file(module_name: str) -> str | None:
    _ensure_workdir_importable()
    try:
        found = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        found = None
    if found is None or not found.origin or not os.path.isfile(found.origin):
        return None
    origin = os.path.realpath(found.origin)
    if "site-packages" in origin.split(os.sep) or os.path.dirname(origin) == _PACKAGE_DIR:
        return None
    cwd = os.path.realpath(os.getcwd())
    return os.path.relpath(origin, cwd) if origin.startswith(cwd + os.sep) else origin


def _ensure_workdir_importable() -> None:
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)


SHARD_LIST = "shards.json"


def source_class(spec: DatasetSpec) -> type:
    """The class that reads the dataset's source kind (not opened: no file is read)."""
    kind = spec.source["kind"]
    if kind == "webdataset":
        from betonbuild.sources.webdataset import WebDatasetSource

        return WebDatasetSource
    return {"arrays": ArraysSource, "image_folder": ImageFolderSource, "python": PythonSource}[kind]


def open_source(spec: DatasetSpec, dataset_dir: str | os.PathLike | None = None):
    """The dataset's source; a webdataset source also needs the shard list in ``dataset_dir``."""
    cls = source_class(spec)
    if spec.source["kind"] == "webdataset":
        if dataset_dir is None:
            raise ValueError("a webdataset source is opened from its shard list: give dataset_dir")
        return cls(spec, Path(dataset_dir) / SHARD_LIST)
    return cls(spec)


def source_fingerprint(spec: DatasetSpec, source, read_files: bool = True) -> dict[str, Any]:
    """What the manifest records of the inputs: a content digest that changes when any input does,
    the user's adapter code included (``adapters_sha256``, also part of each part's fingerprint).

    ``read_files=False``: the input files are only counted; the caller derives ``sha256`` from
    digests of their content it makes anyway (a partitioned arrays source: its parts' rows)."""
    adapters = fingerprint_files(adapter_files(spec))
    kind = spec.source["kind"]
    if kind == "webdataset":
        # The shard list already holds every shard's sha256: no need to read the shards again.
        data = hashlib.sha256()
        for entry in source.entries:
            data.update(f"{entry['path']}\0{entry['size']}\0{entry['sha256']}\n".encode())
        found = {
            "files": len(source.entries),
            "bytes": int(sum(e["size"] for e in source.entries)),
            "sha256": data.hexdigest(),
        }
    elif kind == "python":
        found = {"files": 0, "bytes": 0, "sha256": ""}  # the factory's module is an adapter file
    elif not read_files:
        found = {"files": len(source.files), "bytes": sum(os.path.getsize(f) for f in source.files), "sha256": None}
    else:
        found = fingerprint_files(source.files)
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


def input_files(spec: DatasetSpec) -> list[str]:
    """Files whose change must rebuild the dataset, listed cheaply (for Snakemake's DAG)."""
    src = spec.source
    adapters = adapter_files(spec)
    if src["kind"] == "arrays":
        return ([src["path"]] if "path" in src else [src["columns"][n] for n in spec.field_names]) + adapters
    if src["kind"] == "image_folder":
        root = Path(src["root"])
        if not root.is_dir():
            return [str(root)] + adapters  # missing: Snakemake reports it as a missing input
        return [str(root / rel) for rel, _ in list_image_folder(root, src["extensions"])[1]] + adapters
    return adapters  # python; webdataset shards are inputs of the shard list, which the manifest reads


def _require_files(dataset: str, files: list[str]) -> None:
    for path in files:
        if not os.path.isfile(path):
            raise SourceError(dataset, f"source file {path} does not exist (working directory {os.getcwd()})")


def sha256_file(path: str | os.PathLike) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def fingerprint_files(files: list[str]) -> dict[str, Any]:
    """sha256 of every input file (``file_sha256``, in order), and one digest over (path, size,
    sha256) of them all."""
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        digests = list(pool.map(sha256_file, files))
    combined = hashlib.sha256()
    total = 0
    for path, digest in zip(files, digests):
        size = os.path.getsize(path)
        total += size
        combined.update(f"{path}\0{size}\0{digest}\n".encode())
    return {"files": len(files), "bytes": total, "sha256": combined.hexdigest(), "file_sha256": digests}
