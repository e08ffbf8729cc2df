"""``image_folder``: ``root/<class>/<file>`` -> (PIL image, class index), classes = sorted folder names."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from betonbuild.config.spec import DatasetSpec, FieldSpec
from betonbuild.errors import ConfigError, SampleError, SourceError
from betonbuild.sources.base import Source
from betonbuild.sources.image_limits import decompression_bomb

FIELD_TYPES = ["rgb_image", "int"]  # what a sample is: (image, label)


class ImageFolderSource(Source):
    kind = "image_folder"
    # The source's entry in the config, as JSON Schema (config.load assembles the whole schema)
    config_schema = {
        "additionalProperties": False,
        "required": ["root"],
        "properties": {
            "kind": {},
            "root": {"type": "string"},
            "extensions": {
                "type": "array",
                "items": {"type": "string", "pattern": "^\\.[A-Za-z0-9]+$"},
                "default": [".jpg", ".jpeg", ".png", ".bmp", ".webp", ".ppm", ".tif", ".tiff"],
            },
        },
    }
    may_import_ffcv = False
    gives_fixed_columns = True  # the labels; the image is the one variable-size field

    def __init__(self, spec: DatasetSpec):
        self.spec = spec
        self.root = Path(spec.source["root"])
        if not self.root.is_dir():
            raise SourceError(spec.name, f"image folder {self.root} does not exist (working directory {os.getcwd()})")
        self.classes, self.items = list_image_folder(self.root, spec.source["extensions"])
        if not self.items:
            raise SourceError(spec.name, f"image folder {self.root} has no images in class sub-folders")
        self.files = [str(self.root / rel) for rel, _ in self.items]

    @classmethod
    def check_config(
        cls, where: str, source: dict[str, Any], fields: tuple[FieldSpec, ...], writer: dict[str, Any]
    ) -> None:
        types = [f.type for f in fields]
        if types != FIELD_TYPES:
            raise ConfigError(
                f"{where.rsplit('.', 1)[0]}.fields",
                f"an image_folder yields (image, label): declare an rgb_image field then an int field, not {types}",
            )

    @classmethod
    def input_files(cls, spec: DatasetSpec) -> list[str]:
        root = Path(spec.source["root"])
        if not root.is_dir():
            return [str(root)]  # missing: Snakemake reports it as a missing input
        return [str(root / rel) for rel, _ in list_image_folder(root, spec.source["extensions"])[1]]

    @classmethod
    def estimated_length(cls, spec: DatasetSpec) -> int | None:
        return len(cls.input_files(spec))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple:
        from PIL import Image, UnidentifiedImageError

        rel, label = self.items[index]
        path = self.root / rel
        try:
            image = Image.open(path)
            image.load()
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:  # the warning: if made an error
            raise self._bomb_error(index, path, exc) from None
        except (OSError, UnidentifiedImageError) as exc:
            raise SampleError(self.spec.name, self.spec.field_names[0], index, f"cannot decode {path}: {exc}") from None
        return image, label

    def _bomb_error(self, index: int, path: Path, exc: Exception) -> SampleError:
        message, fix = decompression_bomb(
            exc, f"image file {path}", "read the folder with a python source whose module sets"
        )
        return SampleError(self.spec.name, self.spec.field_names[0], index, message, fix)

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

    def part_fingerprint(self, rows: np.ndarray, inputs: dict[str, Any]) -> str:
        """The relative path, label and sha256 (from ``inputs``) of every image file of the rows."""
        digests = inputs["file_sha256"]
        digest = hashlib.sha256()
        for row in rows.tolist():
            rel, label = self.items[row]
            digest.update(f"{rel}\0{label}\0{digests[row]}\n".encode())
        return digest.hexdigest()


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
