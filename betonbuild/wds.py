"""Local WebDataset shards as a source: a derived shard list, then every sample decoded once.

``shard_list`` counts each shard's samples from its tar member HEADERS (grouped by sample key the
way webdataset groups them), without decoding a payload, and caches the result per shard (keyed
by path, size and mtime), so adding or changing one shard of a thousand recounts one shard.

``WebDatasetSource`` gives the shards an index: sample i is sample ``i - offset[s]`` of shard s.
It reads each shard through webdataset's own pipeline, sequentially, decoding only the samples it
is asked for, and checks every shard against the count in the shard list: a shard that changed
underneath (or a pipeline that is not deterministic) fails the build, naming the shard and both
counts; it never silently yields zero rows or overruns into the next shard.
"""

from __future__ import annotations

import glob
import json
import os
import re
import tarfile
import threading
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .errors import SampleError, SourceError
from .spec import DatasetSpec

META_MEMBER = re.compile(r"__[^/]*__($|/)")  # webdataset's skip_meta


def require_webdataset(dataset: str):
    try:
        import webdataset
    except ImportError:
        raise SourceError(
            dataset,
            "this dataset reads WebDataset shards, but the optional package `webdataset` is not installed "
            "(pip install webdataset, as pinned in requirements.lock)",
        ) from None
    return webdataset


def expand_shards(spec: DatasetSpec) -> list[str]:
    """The shard paths of a webdataset source: brace patterns and globs expanded, in order."""
    require_webdataset(spec.name)  # braceexpand comes with it
    from braceexpand import braceexpand

    patterns = spec.source["shards"]
    patterns = [patterns] if isinstance(patterns, str) else patterns
    paths: list[str] = []
    for pattern in patterns:
        for expanded in braceexpand(pattern):
            if glob.has_magic(expanded):
                matched = sorted(glob.glob(expanded))
                if not matched:
                    raise SourceError(spec.name, f"shard pattern {expanded!r} matches no file")
                paths.extend(matched)
            else:
                paths.append(expanded)
    duplicates = sorted({p for p in paths if paths.count(p) > 1})
    if duplicates:
        raise SourceError(spec.name, f"shard {duplicates[0]} is listed twice")
    return paths


def field_keys(spec: DatasetSpec) -> list[list[str]]:
    """For each field, the webdataset extensions that may hold it, in order of preference."""
    keys = spec.source.get("keys") or {}
    return [[k.strip().lower() for k in keys.get(f.name, f.name).split(";") if k.strip()] for f in spec.fields]


def split_key(name: str) -> tuple[str | None, str | None]:
    """webdataset's base_plus_ext: 'dir/000123.seg.png' -> ('dir/000123', 'seg.png')."""
    match = re.match(r"^((?:.*/|)[^.]+)[.]([^/]*)$", name)
    return (match.group(1), match.group(2)) if match else (None, None)


def count_shard(spec: DatasetSpec, path: str) -> dict[str, Any]:
    """Samples and extensions of one shard, read from tar headers only; checks required keys."""
    required = None if spec.source.get("pipeline") else field_keys(spec)
    samples, extensions, seen = 0, set(), set()
    current_key, current_exts = None, set()

    def close_sample():
        if current_key is None:
            return
        if required:
            for field, alternatives in zip(spec.fields, required):
                if not current_exts & set(alternatives):
                    raise SampleError(
                        spec.name, field.name, None,
                        f"sample has no {' or '.join(alternatives)} member (it has {sorted(current_exts)})",
                        "add the member to the shard, or map the field to the right key with source.keys",
                        location=f"shard {path}, key {current_key}",
                    )

    try:
        with tarfile.open(path, mode="r:*") as tar:
            for member in tar:
                if not member.isfile() or META_MEMBER.match(member.name):
                    continue
                key, ext = split_key(member.name)
                if key is None:
                    continue
                ext = ext.lower()
                if key != current_key:
                    close_sample()
                    if key in seen:
                        raise SourceError(spec.name, f"shard {path}: sample key {key!r} appears twice (not adjacent)")
                    seen.add(key)
                    current_key, current_exts = key, set()
                    samples += 1
                if ext in current_exts:
                    raise SourceError(spec.name, f"shard {path}: sample key {key!r} has two {ext!r} members")
                current_exts.add(ext)
                extensions.add(ext)
            close_sample()
            end = tar.offset
        # tarfile ends its iteration silently at a cut or a garbage header: only the zero block
        # that closes every complete archive proves no sample was lost.
        with open(path, "rb") as fh:
            fh.seek(end)
            if fh.read(512) != bytes(512):
                raise SourceError(spec.name, f"shard {path} is truncated or corrupt at byte {end}: "
                                  "no end-of-archive block follows its last readable member")
    except FileNotFoundError:
        raise SourceError(spec.name, f"shard {path} does not exist (working directory {os.getcwd()})") from None
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise SourceError(spec.name, f"shard {path} is not a readable tar file (corrupt or truncated?): {exc}") from None
    if samples == 0:
        raise SourceError(spec.name, f"shard {path} holds no sample")
    return {"samples": samples, "keys": sorted(extensions)}


def shard_list(spec: DatasetSpec, cache_path: str | os.PathLike) -> dict[str, Any]:
    """The derived shard list: path, size, mtime, sha256, sample count and keys of every shard."""
    from .sources import sha256_file

    require_webdataset(spec.name)
    cache_path = Path(cache_path)
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    entries = []
    for path in expand_shards(spec):
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            raise SourceError(spec.name, f"shard {path} does not exist (working directory {os.getcwd()})") from None
        cached = cache.get(path)
        if not (cached and cached["size"] == stat.st_size and cached["mtime_ns"] == stat.st_mtime_ns):
            cached = {"path": path, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                      "sha256": sha256_file(path), **count_shard(spec, path)}
        entries.append(cached)
    from .atomic import write_json

    write_json(cache_path, {e["path"]: e for e in entries})
    return {"dataset": spec.name, "samples": sum(e["samples"] for e in entries), "shards": entries}


class WebDatasetSource:
    """Indexed view of the shards listed in ``shards.json`` (see the module docstring)."""

    def __init__(self, spec: DatasetSpec, shard_list_path: str | os.PathLike):
        self.spec = spec
        self.wds = require_webdataset(spec.name)
        with open(shard_list_path) as fh:
            self.entries = json.load(fh)["shards"]
        paths = [e["path"] for e in self.entries]
        if paths != expand_shards(spec):
            raise SourceError(spec.name, f"{shard_list_path} lists other shards than the config; run snakemake again")
        self.counts = np.array([e["samples"] for e in self.entries], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.counts)])
        self.files = paths
        self.keys = field_keys(spec)
        self._decoder = self.wds.autodecode.Decoder([self.wds.autodecode.imagehandler(spec.source["decode"])])
        self._pipeline = None
        if spec.source.get("pipeline"):
            from .sources import import_factory

            self._pipeline = import_factory(spec.name, spec.source["pipeline"])
        self._local = threading.local()  # each thread (and forked worker) reads with its own cursor
        self._pid = os.getpid()

    @property
    def _cursor(self) -> tuple[int, int, Iterator] | None:
        """(shard, next local index, samples) of this thread's open shard."""
        return getattr(self._local, "cursor", None)

    @_cursor.setter
    def _cursor(self, value) -> None:
        self._local.cursor = value

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def sample_sizes(self) -> None:
        return None

    def location(self, index: int) -> tuple[int, int]:
        shard = int(np.searchsorted(self.offsets, index, side="right") - 1)
        return shard, int(index - self.offsets[shard])

    def _samples(self, shard: int) -> Iterator:
        dataset = self.wds.WebDataset(self.entries[shard]["path"], shardshuffle=False, empty_check=False,
                                      nodesplitter=None, workersplitter=None)
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
            raise SampleError(self.spec.name, None, index, f"reading the shard failed: {type(exc).__name__}: {exc}",
                              location=f"shard {path}, sample {local}") from exc

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
        return SampleError(
            self.spec.name, None, index,
            f"shard {path} yields {found} samples, but the shard list counted {self.counts[shard]}; "
            "it changed since it was listed, or the pipeline is not deterministic",
            "run snakemake again (the shard list is derived again when a shard changes)",
            location=f"shard {path}",
        )

    def __getitem__(self, index: int):
        sample = self.raw(int(index))
        if self._pipeline:
            return sample
        return self.decode(sample, int(index))

    def decode(self, sample: dict, index: int) -> tuple:
        """Decodes just the members the fields need, naming shard, key and field on failure."""
        where = f"shard {sample.get('__url__')}, key {sample.get('__key__')}"
        values = []
        for field, alternatives in zip(self.spec.fields, self.keys):
            ext = next((k for k in alternatives if k in sample), None)
            if ext is None:
                present = sorted(k for k in sample if not k.startswith("__"))
                raise SampleError(self.spec.name, field.name, index,
                                  f"sample has no {' or '.join(alternatives)} member (it has {present})",
                                  location=where)
            try:
                values.append(self._decoder.decode1(ext, sample[ext]))
            except Exception as exc:
                raise SampleError(self.spec.name, field.name, index,
                                  f"cannot decode its {ext!r} member: {type(exc).__name__}: {exc}",
                                  location=where) from None
        return tuple(values)
