"""``webdataset``: local .tar shards, indexed through their derived shard list (``shards``).

``WebDatasetSource`` gives the shards an index: sample i is sample ``i - offset[s]`` of shard s.
It reads each shard through webdataset's own pipeline, sequentially, decoding only the samples it
is asked for, and checks every shard against the count in the shard list: a shard that changed
underneath (or a pipeline that is not deterministic) fails the build, naming the shard and both
counts; it never silently yields zero rows or overruns into the next shard.

The shard list and its tar parser (``shards``, ``tar``) and the cv2 JPEG decode (``jpeg``) live in
modules of their own; importing this one imports neither webdataset nor torch.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from betonbuild.config.spec import DatasetSpec, FieldSpec
from betonbuild.errors import ConfigError, SampleError, SourceError
from betonbuild.fields.kept_jpeg import KeptJPEG, Reencode, keep_or_reason, keeps_source_jpeg
from betonbuild.fields.reduced_decode import decoded_reduced, reduces
from betonbuild.sources.adapters import import_factory
from betonbuild.sources.base import Source
from betonbuild.sources.image_limits import decompression_bomb, is_decompression_bomb
from betonbuild.sources.jpeg import decode_rgb8
from betonbuild.sources.shard_members import ShardMembers
from betonbuild.sources.shards import (
    SHARD_LIST,
    expand_shards,
    field_keys,
    samples_fingerprint,
    shards_fingerprint,
)
from betonbuild.sources.wds_package import require_webdataset, require_webdataset_installed, webdataset_installed
from betonbuild.write.workplan import WorkPlan

_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # http:, s3:, gs:, pipe:, file: ...


class WebDatasetSource(Source):
    """Indexed view of the shards listed in ``shards.json`` (see the module docstring)."""

    kind = "webdataset"
    # The source's entry in the config, as JSON Schema (config.load assembles the whole schema)
    config_schema = {
        "additionalProperties": False,
        "required": ["shards"],
        "properties": {
            "kind": {},
            "shards": {
                "type": ["string", "array"],
                "items": {"type": "string"},
                "description": "Local .tar shards: a brace pattern (train-{0000..0015}.tar), a glob, or a list.",
            },
            "keys": {
                "type": ["object", "null"],
                "additionalProperties": {"type": "string"},
                "default": None,
                "description": (
                    "field -> webdataset key(s), alternatives separated by ';' (jpg;png). Default: the field name."
                ),
            },
            "decode": {
                "type": "string",
                "default": "rgb8",
                "description": (
                    "webdataset image decoder spec (rgb8, pil, l8...); cls, json, txt... decode by extension."
                ),
            },
            "pipeline": {
                "type": ["string", "null"],
                "pattern": "^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$",
                "default": None,
                "description": (
                    "module:function(dataset) -> dataset of samples; replaces keys/decode. Must be deterministic."
                ),
            },
        },
    }
    may_import_ffcv = False  # it imports webdataset (and torch), not ffcv
    needs_shard_list = True

    def __init__(self, spec: DatasetSpec, shard_list_path: str | os.PathLike):
        self.spec = spec
        require_webdataset_installed(spec.name)
        with open(shard_list_path) as fh:
            self.entries = json.load(fh)["shards"]
        paths = [e["path"] for e in self.entries]
        if paths != expand_shards(spec):
            raise SourceError(spec.name, f"{shard_list_path} lists other shards than the config; run snakemake again")
        self.counts = np.array([e["samples"] for e in self.entries], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.counts)])
        self.files = paths
        self.keys = field_keys(spec)
        self._pipeline = None
        if spec.source.get("pipeline"):
            self._pipeline = import_factory(spec.name, spec.source["pipeline"])
        self._local = threading.local()  # each thread (and forked worker) reads with its own cursor
        self._members = ShardMembers()  # some_fields: single members by offset
        self._pid = os.getpid()

    @classmethod
    def check_config(
        cls, where: str, source: dict[str, Any], fields: tuple[FieldSpec, ...], writer: dict[str, Any]
    ) -> None:
        names = [f.name for f in fields]
        shards = [source["shards"]] if isinstance(source["shards"], str) else source["shards"]
        for pattern in shards:
            if _URL_RE.match(pattern):
                raise ConfigError(
                    f"{where}.shards",
                    f"{pattern!r} is a URL; betonbuild reads local shard files only (obtaining shards is not "
                    "its job: download them first, then list the local paths)",
                )
        if not shards:
            raise ConfigError(f"{where}.shards", "lists no shard")
        unknown = [k for k in (source.get("keys") or {}) if k not in names]
        if unknown:
            raise ConfigError(f"{where}.keys", f"names {unknown}, which are not fields {names}")
        if writer["shuffle"] or writer["indices"] is not None:
            raise ConfigError(
                f"{where.rsplit('.', 1)[0]}.writer",
                "a webdataset source is written in shard order: shuffle and indices are not supported "
                "(shuffle at load time with ffcv's Loader, order=RANDOM)",
            )

    @classmethod
    def adapter_references(cls, spec: DatasetSpec) -> list[str]:
        return [spec.source["pipeline"]] if spec.source.get("pipeline") else []

    @classmethod
    def open(cls, spec: DatasetSpec, dataset_dir: str | os.PathLike | None = None) -> WebDatasetSource:
        if dataset_dir is None:
            raise ValueError("a webdataset source is opened from its shard list: give dataset_dir")
        return cls(spec, Path(dataset_dir) / SHARD_LIST)

    @classmethod
    def shard_files(cls, spec: DatasetSpec) -> list[str]:
        """The local shards (brace patterns and globs expanded); none without webdataset, whose
        shard_list job then fails with the clear message."""
        return expand_shards(spec) if webdataset_installed() else []

    @classmethod
    def missing_package(cls, spec: DatasetSpec) -> bool:
        return not webdataset_installed()

    @classmethod
    def estimated_bytes(cls, spec: DatasetSpec) -> int:
        return sum(os.path.getsize(f) for f in cls.shard_files(spec) if os.path.isfile(f))

    # webdataset (which imports torch) only once samples are read: the shard list and the manifest
    # do not need it
    @functools.cached_property
    def wds(self):
        return require_webdataset(self.spec.name)

    @functools.cached_property
    def _images(self):
        return self.wds.autodecode.imagehandler(self.spec.source["decode"])

    @functools.cached_property
    def _decoder(self):
        return self.wds.autodecode.Decoder([self._images])

    @functools.cached_property
    def _rgb8_extensions(self) -> set:
        return self._images.extensions if self.spec.source["decode"] == "rgb8" else set()

    @property
    def _cursor(self) -> tuple[int, int, Iterator] | None:
        """(shard, next local index, samples) of this thread's open shard."""
        return getattr(self._local, "cursor", None)

    @_cursor.setter
    def _cursor(self, value) -> None:
        self._local.cursor = value

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def sample_sizes(self) -> np.ndarray | None:
        """Bytes of each shard's largest samples (from the tar headers; 0 for the others): enough for
        the pre-flight to find the dataset's largest ones. None for shard lists without sizes."""
        if not all("largest" in e for e in self.entries):
            return None
        sizes = np.zeros(len(self), dtype=np.int64)
        for offset, entry in zip(self.offsets, self.entries):
            for position, size in entry["largest"]:
                sizes[offset + position] = size
        return sizes

    def location(self, index: int) -> tuple[int, int]:
        shard = int(np.searchsorted(self.offsets, index, side="right") - 1)
        return shard, int(index - self.offsets[shard])

    def sample_location(self, index: int) -> str | None:
        shard, local = self.location(index)
        return f"shard {self.entries[shard]['path']}, sample {local}"

    def shard_counts(self) -> list[int]:
        return [int(e["samples"]) for e in self.entries]

    def work_items(self, rows: np.ndarray) -> WorkPlan:
        """One work item per shard, so each shard is opened and read once, by one worker (numpy
        arrays: bounded for 10,000 shards of any size)."""
        rows = np.asarray(rows, dtype=np.int64)
        return WorkPlan.by_group(rows, np.searchsorted(self.offsets, rows, side="right") - 1)

    def inputs_fingerprint(self, read_files: bool = True) -> dict[str, Any]:
        """The shard list already holds every shard's sha256: no need to read the shards again."""
        return {
            "files": len(self.entries),
            "bytes": int(sum(e["size"] for e in self.entries)),
            "sha256": shards_fingerprint(self.entries),
        }

    def part_fingerprint(self, rows: np.ndarray, inputs: dict[str, Any]) -> str:
        """A part is a group of whole shards: their sha256s say it all."""
        first, last = self.location(int(rows[0]))[0], self.location(int(rows[-1]))[0]
        return shards_fingerprint(self.entries[first : last + 1])

    def smoke_fingerprint(self, rows: np.ndarray, inputs: dict[str, Any]) -> str:
        """The smoke samples are spread over the shards: fingerprinted sample by sample."""
        return self.samples_fingerprint(rows)

    def samples_fingerprint(self, rows: np.ndarray) -> str:
        """A fingerprint of exactly these samples' members (``shards.samples_fingerprint``)."""
        wanted: dict[int, set[int]] = {}
        for row in rows.tolist():
            shard, local = self.location(row)
            wanted.setdefault(shard, set()).add(local)
        return samples_fingerprint(self.entries, wanted, by_members=not self.spec.source.get("pipeline"))

    def _samples(self, shard: int) -> Iterator:
        dataset = self.wds.WebDataset(
            self.entries[shard]["path"], shardshuffle=False, empty_check=False, nodesplitter=None, workersplitter=None
        )
        return iter(self._pipeline(dataset) if self._pipeline else dataset)

    def _next(self, shard: int, local: int, index: int):
        path = self.entries[shard]["path"]
        try:
            return next(self._cursor[2])
        except StopIteration:
            raise self._count_mismatch(shard, index, found=local) from None
        except SampleError:
            raise
        except Exception as exc:
            raise SampleError(
                self.spec.name,
                None,
                index,
                f"reading the shard failed: {type(exc).__name__}: {exc}",
                location=f"shard {path}, sample {local}",
            ) from exc

    def raw(self, index: int):
        """The undecoded sample (a dict of bytes, or the pipeline's output) at a global index."""
        if os.getpid() != self._pid:  # a forked writer worker must not share its parent's open shard
            self._local, self._pid = threading.local(), os.getpid()
        shard, local = self.location(index)
        if self._cursor is None or self._cursor[0] != shard or self._cursor[1] > local:
            self._cursor = (shard, 0, self._samples(shard))
        while self._cursor[1] <= local:
            sample = self._next(shard, self._cursor[1], index)
            self._cursor = (shard, self._cursor[1] + 1, self._cursor[2])
        if local == self.counts[shard] - 1:
            self._check_exhausted(shard, index)
        return sample

    def _check_exhausted(self, shard: int, index: int) -> None:
        """After a shard's last listed sample there must be no other: never overrun into the next shard."""
        extra = sum(1 for _ in self._cursor[2])
        self._cursor = None
        if extra:
            raise self._count_mismatch(shard, index, found=int(self.counts[shard]) + extra)

    def _count_mismatch(self, shard: int, index: int, found: int) -> SampleError:
        path = self.entries[shard]["path"]
        error = SampleError(
            self.spec.name,
            None,
            index,
            f"shard {path} yields {found} samples, but the shard list counted {self.counts[shard]}; "
            "it changed since it was listed, or the pipeline is not deterministic",
            "run snakemake again (the shard list is derived again when a shard changes)",
            location=f"shard {path}",
        )
        error.skippable = False  # the shard changed: not a bad sample
        return error

    def __getitem__(self, index: int):
        sample = self.raw(int(index))
        if self._pipeline:
            return sample
        return self.decode(sample, int(index))

    def some_fields(self, index: int, columns: list[int]) -> dict[int, Any] | None:
        """Only these members read and decoded: a label without the sample's image. From an
        uncompressed shard, only their bytes are read, by offset (``shard_members``)."""
        if self._pipeline:
            return None  # the user's pipeline yields whole samples
        index = int(index)
        shard, local = self.location(index)
        entry = self.entries[shard]
        alternatives = [tuple(self.keys[column]) for column in columns]
        found = self._members.sample(entry["path"], entry["size"], int(self.counts[shard]), local, alternatives)
        if found is None:
            sample = self.raw(index)  # compressed, or changed since it was listed: through webdataset
        else:  # a member missing from ``payloads``: _member names it
            key, members, payloads = found
            sample = {"__key__": key, "__url__": entry["path"], **dict.fromkeys(members), **payloads}
        where = f"shard {sample.get('__url__')}, key {sample.get('__key__')}"
        return {c: self._member(sample, c, index, where) for c in columns}

    def decode(self, sample: dict, index: int) -> tuple:
        """Decodes just the members the fields need, naming shard, key and field on failure."""
        where = f"shard {sample.get('__url__')}, key {sample.get('__key__')}"
        return tuple(self._member(sample, column, index, where) for column in range(len(self.spec.fields)))

    def _member(self, sample: dict, column: int, index: int, where: str):
        """The value of field ``column`` from its member of ``sample``."""
        field, alternatives = self.spec.fields[column], self.keys[column]
        ext = next((k for k in alternatives if k in sample), None)
        if ext is None:
            present = sorted(k for k in sample if not k.startswith("__"))
            raise SampleError(
                self.spec.name,
                field.name,
                index,
                f"sample has no {' or '.join(alternatives)} member (it has {present})",
                location=where,
            )
        try:
            return self.decode_field(field, ext, sample[ext], where)
        except Exception as exc:  # noqa: BLE001 - any decoder failure is this sample's error
            if is_decompression_bomb(exc):
                set_limit_in = "give the source a `pipeline:` (it then decodes the samples) whose module sets"
                message, fix = decompression_bomb(exc, f"its {ext!r} member", set_limit_in)
                raise SampleError(self.spec.name, field.name, index, message, fix, location=where) from None
            raise SampleError(
                self.spec.name,
                field.name,
                index,
                f"cannot decode its {ext!r} member: {type(exc).__name__}: {exc}",
                location=where,
            ) from None

    def decode_field(self, field: FieldSpec, ext: str, payload: bytes, where: str):
        """A member as the field takes it: a JPEG kept as it is (``source_jpeg: keep``), else decoded."""
        if not keeps_source_jpeg(field) or not isinstance(payload, bytes):
            return self.decode1(ext, payload, field)
        kept = keep_or_reason(field, payload, where)
        return kept if isinstance(kept, KeptJPEG) else Reencode(self.decode1(ext, payload, field), kept)

    def decode1(self, ext: str, payload: bytes, field: FieldSpec | None = None):
        """webdataset's decode of one member; a plain rgb8 JPEG through cv2 (see ``jpeg``), or at
        libjpeg's reduced scale for a field with ``decode: reduced`` (``reduced_decode``; RGB, as rgb8)."""
        if ext.rsplit(".", 1)[-1] not in self._rgb8_extensions:
            return self._decoder.decode1(ext, payload)
        if field is not None and isinstance(payload, bytes) and reduces(field, payload):
            return decoded_reduced(field, payload, convert=True)
        return decode_rgb8(payload, functools.partial(self._decoder.decode1, ext))
