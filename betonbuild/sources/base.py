"""What every source kind implements: one subclass of ``Source`` per kind, registered in
``betonbuild.sources.SOURCE_KINDS``.

A kind answers two kinds of question. From the config alone (class methods, nothing opened):
its config checks, the files Snakemake must track, the user's code it imports, how it is opened,
and the cheap estimates the resource functions use. From an opened source (instance members):
its samples, their sizes for the smoke survey, fixed-size columns for fast verification, raw
encoded images, and the fingerprints of its inputs, of a part's content and of the smoke samples'.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import numpy as np

from betonbuild.config.spec import DatasetSpec, FieldSpec
from betonbuild.sources.files import count_files, fingerprint_files, stat_signature


class Source:
    kind: ClassVar[str]
    # The source's entry in the config, as JSON Schema (``betonbuild.config.load.schema`` assembles the
    # whole schema from the kinds')
    config_schema: ClassVar[dict[str, Any]] = {"additionalProperties": False, "properties": {"kind": {}}}
    # Reading the source may import ffcv or torch (verification then keeps the Loader batch in-process)
    may_import_ffcv: ClassVar[bool] = False
    # Read through results/{ds}/shards.json, a listing derived from the source's files first
    needs_shard_list: ClassVar[bool] = False
    # Read through results/{ds}/files.npz, the listing of its many files (none of them a Snakemake input)
    needs_file_list: ClassVar[bool] = False
    # fixed_columns() holds every fixed-size field: verification need not gather values one by one
    gives_fixed_columns: ClassVar[bool] = False
    # A part's fingerprint hashes every byte of its content: a partitioned source's fingerprint is
    # derived from its parts' (hashing the files as well would read every byte twice)
    fingerprint_from_parts: ClassVar[bool] = False
    # Cannot be indexed: read once, in its own order, by the one-pass write (``workflow.onepass``);
    # an opened instance holds only the first samples, for the manifest and the smoke stage
    one_pass: ClassVar[bool] = False

    spec: DatasetSpec
    files: list[str]  # the input files read, in order (fingerprinted by ``inputs_fingerprint``)

    # -- from the config alone --------------------------------------------------------------------

    @classmethod
    def check_config(
        cls, where: str, source: dict[str, Any], fields: tuple[FieldSpec, ...], writer: dict[str, Any]
    ) -> None:
        """Raises a ConfigError for what the schema cannot say; ``where`` is ``datasets.<name>.source``."""

    @classmethod
    def check_spec(cls, spec: DatasetSpec) -> None:
        """Raises a ConfigError for what the kind cannot do with the dataset's other keys (e.g. partitions)."""

    @classmethod
    def input_files(cls, spec: DatasetSpec) -> list[str]:
        """The source's own files Snakemake must track (adapter code aside), listed cheaply."""
        return []

    @classmethod
    def adapter_references(cls, spec: DatasetSpec) -> list[str]:
        """The user's ``module:attribute`` the source imports (its module is an adapter file)."""
        return []

    @classmethod
    def open(cls, spec: DatasetSpec, dataset_dir: str | os.PathLike | None = None) -> Source:
        """The opened source; ``dataset_dir`` holds a shard list, for the kinds that need one."""
        return cls(spec)

    @classmethod
    def shard_files(cls, spec: DatasetSpec) -> list[str]:
        """The files the shard list is derived from (none for a kind without a shard list)."""
        return []

    @classmethod
    def listed_files_signature(cls, spec: DatasetSpec) -> str:
        """A digest of the name, size, mtime and inode of every file the source's listing (shard list,
        file list) is derived from, no file opened: the listing rule's parameter, so that its job
        reruns exactly when one of them changes, however many files there are. Empty without a listing."""
        return stat_signature(cls.shard_files(spec)) if cls.needs_shard_list else ""

    @classmethod
    def missing_listed_files(cls, spec: DatasetSpec) -> list[str]:
        """Those of the listing's files that do not exist: the inputs of its rule, so that Snakemake
        names them before any job runs (every file that exists is tracked by the signature)."""
        return [f for f in cls.shard_files(spec) if not os.path.exists(f)] if cls.needs_shard_list else []

    @classmethod
    def missing_package(cls, spec: DatasetSpec) -> bool:
        """An optional package the kind needs is not installed (asked without importing it)."""
        return False

    @classmethod
    def estimated_length(cls, spec: DatasetSpec) -> int | None:
        """The source's length from the config and file headers alone, or None if unknown."""
        return None

    @classmethod
    def estimated_bytes(cls, spec: DatasetSpec) -> int:
        """Bytes of the source's input files, from the file system alone (for time estimates)."""
        return sum(os.path.getsize(f) for f in cls.input_files(spec) if os.path.isfile(f))

    @classmethod
    def resident_bytes(cls, spec: DatasetSpec) -> int:
        """Bytes the opened source holds in memory (beyond what it memory-maps or reads per sample)."""
        return 0

    # -- an opened source -------------------------------------------------------------------------

    def __len__(self) -> int:
        raise NotImplementedError

    def __getitem__(self, index: int) -> Any:
        raise NotImplementedError

    def sample_sizes(self) -> np.ndarray | None:
        """Bytes per sample (the pre-flight inspects the largest); None if unknown without reading them."""
        return None

    def fixed_columns(self) -> dict[str, Any]:
        """Values of fixed-size fields for many rows at once, indexed by source index."""
        return {}

    def some_fields(self, index: int, columns: list[int]) -> dict[int, Any] | None:
        """Just these fields (by column) of sample ``index``, for a verification that compares no
        other; None where only whole samples can be read (then ``self[index]`` is)."""
        return None

    def encoded_image(self, index: int) -> np.ndarray | None:
        """The image of sample ``index`` as it is encoded in the source, if it is kept encoded."""
        return None

    def sample_location(self, index: int) -> str | None:
        """Where sample ``index`` lives (its file, its shard member), for a skipped sample's record."""
        return None

    def shard_counts(self) -> list[int] | None:
        """Samples per shard, for a source whose parts are groups of whole shards."""
        return None

    def work_items(self, rows: np.ndarray) -> list | None:
        """Groups of (destination, source index) a writer worker reads together; None: any split."""
        return None

    def inputs_fingerprint(self, read_files: bool = True) -> dict[str, Any]:
        """``files``, ``bytes`` and ``sha256`` of the source's inputs (adapter code aside), and
        ``file_sha256`` per file where the files were read. ``read_files=False``: only counted
        (``sha256`` None; see ``fingerprint_from_parts``)."""
        return fingerprint_files(self.files) if read_files else count_files(self.files)

    def part_fingerprint(self, rows: np.ndarray, inputs: dict[str, Any]) -> str:
        """A digest of exactly the source content of these rows (a part's, in the final order)."""
        return ""

    def smoke_fingerprint(self, rows: np.ndarray, inputs: dict[str, Any]) -> str:
        """A digest of exactly the source content of the smoke stage's rows (spread over the source)."""
        return self.part_fingerprint(rows, inputs)
