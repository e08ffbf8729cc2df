"""The shard list of a webdataset source (``results/{ds}/shards.json``) and what is derived from it.

``shard_list`` counts each shard's samples from its tar member HEADERS (grouped by sample key the
way webdataset groups them), without decoding a payload, and caches the result per shard (keyed
by path, size and mtime), so adding or changing one shard of a thousand recounts one shard. The
fingerprints of whole shards and of chosen samples read the list and the members' bytes.
Neither imports webdataset (which imports torch): the DAG, the shard list and the manifest jobs
do without it.
"""

from __future__ import annotations

import glob
import hashlib
import json
import lzma
import os
import zlib
from pathlib import Path
from typing import Any

from betonbuild.atomic import write_json
from betonbuild.config.spec import LARGEST_SAMPLES, DatasetSpec
from betonbuild.errors import SampleError, SourceError
from betonbuild.sources.files import sha256_file
from betonbuild.sources.tar import TarDamage, open_shard, sample_members, split_key
from betonbuild.sources.wds_package import require_webdataset_installed

SHARD_LIST = "shards.json"


def expand_shards(spec: DatasetSpec) -> list[str]:
    """The shard paths of a webdataset source: brace patterns and globs expanded, in order."""
    require_webdataset_installed(spec.name)  # braceexpand comes with it
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


def samples_fingerprint(entries: list[dict[str, Any]], wanted: dict[int, set[int]], by_members: bool) -> str:
    """A fingerprint of exactly these samples (``wanted``: shard index -> positions in the shard):
    their members' names and bytes, read at their offsets in the shards. A compressed shard (no
    offsets to read at) and, without ``by_members`` (a source with a pipeline, which may combine
    samples), every shard count as a whole, by their sha256."""
    digest = hashlib.sha256()
    for shard in sorted(wanted):
        entry = entries[shard]
        found = _shard_samples_fingerprint(entry["path"], wanted[shard]) if by_members else None
        digest.update(f"{entry['path']}\0{found or ('shard ' + entry['sha256'])}\n".encode())
    return digest.hexdigest()


def shards_fingerprint(entries: list[dict[str, Any]]) -> str:
    """A fingerprint of whole shards: one digest over their (path, size, sha256) in the shard list."""
    digest = hashlib.sha256()
    for entry in entries:
        digest.update(f"{entry['path']}\0{entry['size']}\0{entry['sha256']}\n".encode())
    return digest.hexdigest()


def _shard_samples_fingerprint(path: str, positions: set[int]) -> str | None:
    """A digest of the members of the samples at ``positions`` of an uncompressed shard; None if
    the shard cannot be read that way."""
    digest, last = hashlib.sha256(), max(positions)
    try:
        with open_shard(path) as (fh, size):
            if size is None:
                return None
            for position, key, ext, nbytes, offset in sample_members(fh, size):
                if position > last:
                    break
                if position in positions:
                    digest.update(f"{position}\0{key}\0{ext}\0{nbytes}\n".encode())
                    for start in range(offset, offset + nbytes, READ_CHUNK):
                        data = os.pread(fh.fileno(), min(READ_CHUNK, offset + nbytes - start), start)
                        if not data:
                            return None  # cut since it was listed
                        digest.update(data)
    except (OSError, TarDamage):
        return None
    return digest.hexdigest()


READ_CHUNK = 8 << 20


def count_shard(spec: DatasetSpec, path: str) -> dict[str, Any]:
    """Samples and extensions of one shard, from its tar headers only, grouped into samples the way
    webdataset's group_by_keys groups them; checks the required keys and that no key repeats."""
    required = None if spec.source.get("pipeline") else field_keys(spec)
    extensions, seen = set(), set()
    current_key, current_exts = None, set()
    sample_bytes: list[int] = []  # payload bytes per sample: the pre-flight inspects the largest

    def close_sample():
        if current_key is None or not required:
            return
        for field, alternatives in zip(spec.fields, required):
            if not current_exts & set(alternatives):
                raise SampleError(
                    spec.name,
                    field.name,
                    None,
                    f"sample has no {' or '.join(alternatives)} member (it has {sorted(current_exts)})",
                    "add the member to the shard, or map the field to the right key with source.keys",
                    location=f"shard {path}, key {current_key}",
                )

    try:
        with open_shard(path) as (fh, size):
            for position, key, ext, member_bytes, _ in sample_members(fh, size):
                ext = ext.lower()
                if position == len(sample_bytes):  # the first member of the next sample
                    close_sample()
                    if key in seen:
                        raise SourceError(spec.name, f"shard {path}: sample key {key!r} appears twice (not adjacent)")
                    seen.add(key)
                    current_key, current_exts = key, set()
                    sample_bytes.append(0)
                if ext in current_exts:
                    raise SourceError(spec.name, f"shard {path}: sample key {key!r} has two {ext!r} members")
                current_exts.add(ext)
                extensions.add(ext)
                sample_bytes[-1] += member_bytes
        close_sample()
    except FileNotFoundError:
        raise SourceError(spec.name, f"shard {path} does not exist (working directory {os.getcwd()})") from None
    except TarDamage as damage:
        raise SourceError(spec.name, _damage_message(path, damage)) from None
    except (OSError, EOFError, zlib.error, lzma.LZMAError) as exc:  # a compressed shard that is cut or damaged
        raise SourceError(
            spec.name, f"shard {path} is not a readable tar file (corrupt or truncated?): {type(exc).__name__}: {exc}"
        ) from None
    samples = len(sample_bytes)
    if samples == 0:
        raise SourceError(spec.name, f"shard {path} holds no sample")
    largest = sorted(range(samples), key=lambda i: -sample_bytes[i])[:LARGEST_SAMPLES]
    return {
        "samples": samples,
        "keys": sorted(extensions),
        "largest": [[i, sample_bytes[i]] for i in sorted(largest)],
    }  # [position in shard, bytes]


def _damage_message(path: str, damage: TarDamage) -> str:
    where = f"at byte {damage.offset}"
    if damage.member is not None:
        key = split_key(damage.member)[0]
        where += f", {'inside' if damage.inside else 'after'} member {damage.member!r}"
        where += f" (sample key {key})" if key else ""
    if damage.truncated:
        return f"shard {path} is truncated {where}: {damage.what}"
    if damage.offset == 0:
        return f"shard {path} is not a readable tar file (corrupt, or not a tar) {where}: {damage.what}"
    return f"shard {path} is corrupt {where}: {damage.what}"


def shard_list(spec: DatasetSpec, cache_path: str | os.PathLike) -> dict[str, Any]:
    """The derived shard list: path, size, mtime, sha256, sample count and keys of every shard."""
    require_webdataset_installed(spec.name)
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
            cached = {
                "path": path,
                "size": stat.st_size,
                "mtime_ns": stat.st_mtime_ns,
                "sha256": sha256_file(path),
                **count_shard(spec, path),
            }
        entries.append(cached)
    write_json(cache_path, {e["path"]: e for e in entries})
    return {"dataset": spec.name, "samples": sum(e["samples"] for e in entries), "shards": entries}
