"""``image_folder``: ``root/<class>/<file>`` -> (PIL image, class index), classes = sorted folder names."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from betonbuild.config.spec import DatasetSpec, FieldSpec
from betonbuild.errors import ConfigError, SampleError, SourceError
from betonbuild.fields.kept_jpeg import KeptJPEG, Reencode, keep_or_reason, keeps_source_jpeg
from betonbuild.fields.reduced_decode import load_reduced, reduces
from betonbuild.sources.base import Source
from betonbuild.sources.files import count_files
from betonbuild.sources.folder_listing import (
    LISTING,
    FolderListing,
    FolderStat,
    folder_stat,
    hash_files,
    read_listing,
    scan_folder,
)
from betonbuild.sources.image_limits import decompression_bomb
from betonbuild.sources.jpeg import decode_rgb8

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
    needs_file_list = True
    gives_fixed_columns = True  # the labels; the image is the one variable-size field

    def __init__(self, spec: DatasetSpec, listing: FolderListing | None = None):
        """From the file_list job's ``listing`` (every job of a workflow run), else scanned now (the CLI)."""
        self.spec = spec
        self.root = Path(spec.source["root"])
        self.from_listing = listing is not None
        self.listing = listing if listing is not None else self.scan(spec)
        self.classes = self.listing.classes

    @classmethod
    def scan(cls, spec: DatasetSpec) -> FolderListing:
        """The folder's files, stat only (the file_list job's listing; the CLI's source); a missing
        folder or one without images is a SourceError."""
        root = Path(spec.source["root"])
        if not root.is_dir():
            raise SourceError(spec.name, f"image folder {root} does not exist (working directory {os.getcwd()})")
        listing = scan_folder(spec.name, root, spec.source["extensions"])
        if not len(listing):
            raise SourceError(spec.name, f"image folder {root} has no images in class sub-folders")
        return listing

    @classmethod
    def open(cls, spec: DatasetSpec, dataset_dir: str | os.PathLike | None = None) -> ImageFolderSource:
        listed = Path(dataset_dir) / LISTING if dataset_dir is not None else None
        return cls(spec, read_listing(spec.name, listed) if listed and listed.exists() else None)

    @property
    def items(self) -> list[tuple[str, int]]:
        """(relative path, class index) of every image, in order."""
        return list(zip(self.listing.rels, self.listing.labels.tolist(), strict=True))

    @property
    def files(self) -> list[str]:
        return self.listing.paths(range(len(self.listing)))

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
        """None of the images: the folder is tracked through its file list (``listed_files_signature``)."""
        return []

    @classmethod
    def listed_files_signature(cls, spec: DatasetSpec) -> str:
        return cls._stat(spec).signature

    @classmethod
    def missing_listed_files(cls, spec: DatasetSpec) -> list[str]:
        return [] if os.path.isdir(spec.source["root"]) else [spec.source["root"]]

    @classmethod
    def estimated_length(cls, spec: DatasetSpec) -> int | None:
        return cls._stat(spec).files

    @classmethod
    def estimated_bytes(cls, spec: DatasetSpec) -> int:
        return cls._stat(spec).bytes

    @classmethod
    def _stat(cls, spec: DatasetSpec) -> FolderStat:
        return folder_stat(spec.name, spec.source["root"], tuple(spec.source["extensions"]))

    def __len__(self) -> int:
        return len(self.listing)

    def __getitem__(self, index: int) -> tuple:
        field, label = self.spec.fields[0], int(self.listing.labels[index])
        path = self.listing.path(index)
        data = self._read(index)
        if keeps_source_jpeg(field):
            kept = keep_or_reason(field, data, path)
            return (kept if isinstance(kept, KeptJPEG) else Reencode(self._decoded(index, path, data), kept)), label
        return self._decoded(index, path, data), label

    def _decoded(self, index: int, path: str, data: bytes):
        """The file's pixels: libjpeg-turbo directly where it gives PIL's pixels (sources.jpeg), a
        quarter faster than PIL's image and its array; a grey JPEG stays PIL's "L" image, which the
        field refuses or converts as ``image_mode`` says. ``decode: reduced``: a JPEG that
        ``max_resolution`` shrinks 2x or more at libjpeg's reduced scale (``fields.reduced_decode``)."""
        if reduces(self.spec.fields[0], data):
            return self._pil_image(index, path, data)
        return decode_rgb8(data, lambda _: self._pil_image(index, path, data), components=(3,))

    def _pil_image(self, index: int, path: str, data: bytes):
        """The file's bytes (read and checked) decoded by PIL; ``decode: reduced`` at the reduced scale."""
        import io

        from PIL import Image, UnidentifiedImageError

        try:
            image = Image.open(io.BytesIO(data))
            image.filename = path  # the field's messages name the file
            return load_reduced(self.spec.fields[0], image)
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:  # the warning: if made an error
            raise self._bomb_error(index, path, exc) from None
        except (OSError, UnidentifiedImageError) as exc:
            raise SampleError(self.spec.name, self.spec.field_names[0], index, f"cannot decode {path}: {exc}") from None

    def _read(self, index: int) -> bytes:
        """The image file's bytes; read from a listing, a file changed since is refused (one open:
        its stat is the open file's)."""
        path = self.listing.path(index)
        try:
            with open(path, "rb", buffering=0) as fh:  # unbuffered: one read of the whole file
                if self.from_listing:
                    self._refuse_changed(index, os.fstat(fh.fileno()))
                return fh.readall()
        except OSError as exc:
            raise SampleError(
                self.spec.name, self.spec.field_names[0], index, f"cannot read {path}: {exc.strerror}"
            ) from None

    def _bomb_error(self, index: int, path: str, exc: Exception) -> SampleError:
        message, fix = decompression_bomb(
            exc, f"image file {path}", "read the folder with a python source whose module sets"
        )
        return SampleError(self.spec.name, self.spec.field_names[0], index, message, fix)

    def _refuse_changed(self, index: int, stat: os.stat_result) -> None:
        changed = self.listing.changed_since_listed(index, stat)
        if changed:
            error = SampleError(self.spec.name, self.spec.field_names[0], index, changed, "run snakemake again")
            error.skippable = False  # a changed file, not a bad one
            raise error

    def sample_location(self, index: int) -> str | None:
        return f"file {self.listing.path(index)}"

    def sample_sizes(self) -> np.ndarray:
        return self.listing.sizes

    def fixed_columns(self) -> dict[str, Any]:
        """The labels (the second field), indexed by source index."""
        return {self.spec.fields[1].name: self.listing.labels}

    def encoded_image(self, index: int) -> np.ndarray | None:
        """The image file's bytes as they are on disk (None if it cannot be read)."""
        try:
            return np.frombuffer(self._read(index), dtype=np.uint8)
        except SampleError:
            return None

    def inputs_fingerprint(self, read_files: bool = True) -> dict[str, Any]:
        """From the listing's digests when opened from one (no image is read), else every file hashed now."""
        listing = self.listing
        if listing.sha256 is None:
            if not read_files:
                return count_files(self.files)
            listing.sha256 = hash_files(self.spec.name, self.files, processes=min(4, os.cpu_count() or 1))
        return {
            "files": len(listing),
            "bytes": int(listing.sizes.sum()),
            "sha256": listing.content_digest(),
            "file_sha256": listing.sha256,
        }

    def part_fingerprint(self, rows: np.ndarray, inputs: dict[str, Any]) -> str:
        """The relative path, label and sha256 of every image file of the rows."""
        return self.listing.content_digest(rows)
