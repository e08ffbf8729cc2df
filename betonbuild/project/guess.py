"""``betonbuild init DIR --from PATH``: a first config guessed from what is at PATH.

A few samples are inspected (never the whole data set) and each guess is said in words, so the user
knows what to check: an image folder, .npy/.npz arrays, .tar shards (WebDataset), Parquet files, a
Hugging Face ``save_to_disk`` directory.
"""

from __future__ import annotations

import json
import os
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from betonbuild.errors import BetonbuildError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".ppm", ".tif", ".tiff")
WDS_IMAGE_KEYS = ("jpg", "jpeg", "png", "webp")
SAMPLES = 5  # how many samples each guess looks at


@dataclass
class Guess:
    """One dataset entry for config.yaml, and what was guessed, in words."""

    name: str
    source: dict
    fields: dict
    notes: list[str] = field(default_factory=list)

    def entry(self) -> str:
        """The dataset's entry, indented under ``datasets:``, each note a comment above it."""
        body = yaml.safe_dump({self.name: {"source": self.source, "fields": self.fields}}, sort_keys=False)
        comments = "".join(f"  # {note}\n" for note in self.notes)
        return comments + "".join(f"  {line}\n" for line in body.splitlines())


def guess(path: Path, project: Path) -> Guess:
    """The guess for ``path``; paths in it are relative to ``project`` when inside it."""
    if not path.exists():
        raise BetonbuildError(f"--from {path}: no such file or directory")
    name = dataset_name(path)
    where = config_path(path, project)
    for matches, make in GUESSERS:
        if matches(path):
            return make(path, name, where)
    raise BetonbuildError(
        f"--from {path}: cannot tell what this is (looked for an image folder root/<class>/<image>, "
        ".npy/.npz arrays, .tar shards, .parquet files and a Hugging Face save_to_disk directory); "
        "run `betonbuild init` without --from and edit config.yaml"
    )


def dataset_name(path: Path) -> str:
    stem = path.resolve().name
    stem = stem[: -len(path.suffix)] if path.is_file() and path.suffix else stem
    return re.sub(r"[^A-Za-z0-9_-]+", "_", stem).strip("_") or "data"


def config_path(path: Path, project: Path) -> str:
    """How the config names ``path``: relative to the project (the working directory) when inside it."""
    path, project = path.resolve(), project.resolve()
    return os.path.relpath(path, project) if project in path.parents or path == project else str(path)


def _files(path: Path, suffixes: tuple[str, ...]) -> list[Path]:
    if path.is_file():
        return [path] if path.suffix.lower() in suffixes else []
    return sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in suffixes)


# --- arrays --------------------------------------------------------------------------------------------


def array_field(name: str, array) -> tuple[dict, str]:
    """The field for one column (rows along axis 0), and how it was decided."""
    import numpy as np  # why local: `betonbuild --help` does not import numpy

    row_shape = list(array.shape[1:])
    if not row_shape and np.issubdtype(array.dtype, np.integer):
        return {"type": "int"}, f"{name}: {array.dtype} scalars -> int"
    if not row_shape and np.issubdtype(array.dtype, np.floating):
        return {"type": "float"}, f"{name}: {array.dtype} scalars -> float"
    spec = {"type": "ndarray", "dtype": str(array.dtype), "shape": row_shape}
    return spec, f"{name}: {array.dtype} rows of shape {tuple(row_shape)} -> ndarray"


def guess_arrays(path: Path, name: str, where: str) -> Guess:
    import numpy as np  # why local: see array_field

    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as npz:
            columns = {key: npz[key] for key in npz.files}
        source = {"kind": "arrays", "path": where, "columns": {key: key for key in columns}}
    else:
        files = _files(path, (".npy",))
        columns = {f.stem: np.load(f, mmap_mode="r", allow_pickle=False) for f in files}
        source = {"kind": "arrays", "columns": {f.stem: os.path.join(where, f.name) for f in files}}
    lengths = {key: len(col) for key, col in columns.items()}
    fields, notes = {}, [f"guessed from {len(columns)} NumPy array(s) of {sorted(set(lengths.values()))} rows:"]
    for key, col in columns.items():
        fields[key], note = array_field(key, col)
        notes.append("  " + note)
    if len(set(lengths.values())) > 1:
        notes.append(f"CHECK: the arrays differ in length ({lengths}); every column needs one row per sample")
    return Guess(name, source, fields, notes)


def is_arrays(path: Path) -> bool:
    return path.suffix in (".npz", ".npy") or (path.is_dir() and bool(_files(path, (".npy",))))


# --- image folder --------------------------------------------------------------------------------------


def is_image_folder(path: Path) -> bool:
    return path.is_dir() and any(_files(d, IMAGE_EXTENSIONS) for d in path.iterdir() if d.is_dir())


def guess_image_folder(path: Path, name: str, where: str) -> Guess:
    from PIL import Image  # why local: PIL is not needed by the other guesses

    classes = sorted(d for d in path.iterdir() if d.is_dir() and _files(d, IMAGE_EXTENSIONS))
    sample = [f for d in classes for f in _files(d, IMAGE_EXTENSIONS)[:SAMPLES]][: 4 * SAMPLES]
    modes, sizes = set(), []
    for f in sample:
        with Image.open(f) as image:
            modes.add(image.mode)
            sizes.append(image.size)
    image = {"type": "rgb_image", "write_mode": "jpg", "max_resolution": 256}
    notes = [
        f"guessed: an image folder of {len(classes)} classes ({', '.join(d.name for d in classes[:5])}"
        f"{', ...' if len(classes) > 5 else ''}); label = the class folder's position in sorted order",
        f"looked at {len(sample)} images: modes {sorted(modes)}, sizes {sorted(set(sizes))[:5]}; stored as JPEG"
        " at most 256 px on a side (write_mode: raw keeps them exact)",
    ]
    if modes - {"RGB"}:
        image["image_mode"] = "convert"
        notes.append("not every image is RGB: image_mode: convert converts them with PIL's .convert('RGB')")
    return Guess(name, {"kind": "image_folder", "root": where}, {"image": image, "label": {"type": "int"}}, notes)


# --- webdataset shards ---------------------------------------------------------------------------------


def is_shards(path: Path) -> bool:
    return bool(_files(path, (".tar",)))


def guess_shards(path: Path, name: str, where: str) -> Guess:
    shards = _files(path, (".tar",))
    keys: dict[str, list[str]] = {}
    with tarfile.open(shards[0]) as tar:
        for member in tar:
            if not member.isfile():
                continue
            stem, _, ext = member.name.partition(".")
            keys.setdefault(stem, []).append(ext)
            if len(keys) > SAMPLES:
                break
    exts = sorted({e for found in list(keys.values())[:SAMPLES] for e in found})
    fields, mapping, unmapped = {}, {}, []
    images = [e for e in exts if e in WDS_IMAGE_KEYS]
    if images:
        fields["image"], mapping["image"] = {"type": "rgb_image", "write_mode": "jpg"}, ";".join(images)
    for ext, field_name, spec in (("cls", "label", {"type": "int"}), ("json", "meta", {"type": "json"})):
        if ext in exts:
            fields[field_name], mapping[field_name] = spec, ext
    unmapped = [e for e in exts if e not in images and e not in ("cls", "json")]
    pattern = str(Path(where) / "*.tar") if path.is_dir() else where
    notes = [f"guessed: {len(shards)} WebDataset shard(s); members of the first samples of {shards[0].name}: {exts}"]
    if unmapped:
        notes.append(f"not mapped to a field: {unmapped} (add a field and a `keys` entry for each you want)")
    source = {"kind": "webdataset", "shards": pattern, "keys": mapping}
    return Guess(name, source, fields or {"label": {"type": "int"}}, notes)


# --- parquet and huggingface (columnar: the features decide the fields) --------------------------------

ARROW_NOTE = "the source kind `{kind}` (betonbuild's parquet/huggingface kinds): check `betonbuild schema` for its keys"


def is_parquet(path: Path) -> bool:
    return bool(_files(path, (".parquet",)))


def guess_parquet(path: Path, name: str, where: str) -> Guess:
    import pyarrow.parquet as pq  # why local: an optional package (extra `parquet`)

    files = _files(path, (".parquet",))
    schema = pq.read_schema(files[0])
    fields, notes = {}, [f"guessed: {len(files)} Parquet file(s); columns of {files[0].name}:"]
    for column in schema:
        fields[column.name], note = arrow_field(column.name, str(column.type))
        notes.append("  " + note)
    notes.append(ARROW_NOTE.format(kind="parquet"))
    return Guess(name, {"kind": "parquet", "path": where}, fields, notes)


def arrow_field(name: str, type_name: str) -> tuple[dict, str]:
    if re.fullmatch(r"u?int\d+", type_name):
        return {"type": "int"}, f"{name}: {type_name} -> int"
    if re.fullmatch(r"float\d*|double|halffloat", type_name):
        return {"type": "float"}, f"{name}: {type_name} -> float"
    if type_name in ("binary", "large_binary", "string", "large_string"):
        return {"type": "bytes"}, f"{name}: {type_name} -> bytes"
    return {"type": "json"}, f"{name}: {type_name} -> json (CHECK: an array column may fit ndarray better)"


def is_hf_saved(path: Path) -> bool:
    return path.is_dir() and ((path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file())


def guess_huggingface(path: Path, name: str, where: str) -> Guess:
    notes = []
    if (path / "dataset_dict.json").is_file():
        splits = json.loads((path / "dataset_dict.json").read_text())["splits"]
        notes.append(f"a DatasetDict of splits {splits}: the fields are read from split {splits[0]!r}")
        info_dir, source = path / splits[0], {"kind": "huggingface", "path": str(Path(where) / splits[0])}
    else:
        info_dir, source = path, {"kind": "huggingface", "path": where}
    features = json.loads((info_dir / "dataset_info.json").read_text()).get("features", {})
    fields = {}
    notes.insert(0, f"guessed: a Hugging Face save_to_disk directory; its features ({len(features)}):")
    for feature_name, feature in features.items():
        fields[feature_name], note = hf_field(feature_name, feature)
        notes.append("  " + note)
    notes.append(ARROW_NOTE.format(kind="huggingface"))
    return Guess(name, source, fields, notes)


def hf_field(name: str, feature: dict) -> tuple[dict, str]:
    kind = feature.get("_type")
    if kind == "Image":
        return {"type": "rgb_image", "write_mode": "jpg"}, f"{name}: Image -> rgb_image (JPEG)"
    if kind == "ClassLabel":
        return {"type": "int"}, f"{name}: ClassLabel -> int"
    if kind == "Value":
        return arrow_field(name, feature.get("dtype", ""))
    return {"type": "json"}, f"{name}: {kind} -> json (CHECK: a fixed-size array fits ndarray better)"


GUESSERS = (
    (is_hf_saved, guess_huggingface),
    (is_image_folder, guess_image_folder),
    (is_arrays, guess_arrays),
    (is_shards, guess_shards),
    (is_parquet, guess_parquet),
)
