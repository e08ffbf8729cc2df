"""Single members of uncompressed WebDataset shards, read by their offsets: the verification reads
a sample's label without reading (let alone decoding) the image beside it.

A shard's index, per sample its key and each member's offset and size, comes from the tar headers
(``tar.sample_members``, which groups members the way webdataset's ``group_by_keys`` does, with
extensions lowercased as it lowercases them). The shard list already refused shards whose keys
repeat or whose members collide, so the index holds the samples webdataset yields. It is built once
per shard and kept for the last few shards read; payloads are read with ``os.pread`` on the shared
descriptor, under the lock that also evicts indexes (and closes their descriptors). A compressed
shard (no offsets into the file), one whose size or sample count is not the listed one, or one
whose headers no longer parse has no index: the caller then reads it through webdataset, which
reports what is wrong in its own words.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict

from betonbuild.sources.tar import TarDamage, open_shard, sample_members

KEEP = 4  # shard indexes (and open descriptors) kept: the verification reads shards in order


class ShardMembers:
    def __init__(self):
        self._lock = threading.Lock()
        self._indexes: OrderedDict[str, tuple[int, list] | None] = OrderedDict()
        weakref.finalize(self, _close_all, self._indexes)

    def sample(self, path: str, size: int, count: int, local: int, alternatives: list[tuple[str, ...]]):
        """(key, {extension: (offset, bytes)}, {extension: payload}) of sample ``local`` of the shard
        at ``path`` (listed with ``size`` bytes and ``count`` samples): the payload of the first
        present extension of each of ``alternatives``; None where the shard has no index.

        The payloads are read under the lock: another thread may otherwise evict this shard's index
        and close its descriptor between the lookup and the read, and the next shard opened may get
        the same descriptor number: the read would return another shard's bytes at that offset."""
        with self._lock:
            if path not in self._indexes:
                self._indexes[path] = _index(path, size, count)
                while len(self._indexes) > KEEP:
                    _close(self._indexes.popitem(last=False)[1])
            self._indexes.move_to_end(path)
            found = self._indexes[path]
            if found is None:
                return None
            fd, samples = found
            key, members = samples[local]
            wanted = (next((ext for ext in choice if ext in members), None) for choice in alternatives)
            payloads = {ext: _read(fd, *members[ext]) for ext in wanted if ext is not None}
        return key, members, payloads


def _index(path: str, size: int, count: int) -> tuple[int, list] | None:
    samples: list[tuple[str, dict[str, tuple[int, int]]]] = []
    try:
        with open_shard(path) as (fh, file_size):
            if file_size is None or file_size != size:
                return None  # compressed, or not the shard that was listed
            for position, key, ext, nbytes, offset in sample_members(fh, file_size):
                if position == len(samples):
                    samples.append((key, {}))
                samples[-1][1][ext.lower()] = (offset, nbytes)
    except (OSError, TarDamage):
        return None
    if len(samples) != count:
        return None
    return os.open(path, os.O_RDONLY), samples


def _read(fd: int, offset: int, nbytes: int) -> bytes:
    data = os.pread(fd, nbytes, offset)
    if len(data) != nbytes:
        raise OSError(f"the shard ended {nbytes - len(data)} bytes into a member at offset {offset}")
    return data


def _close(found: tuple[int, list] | None) -> None:
    if found is not None:
        os.close(found[0])


def _close_all(indexes: OrderedDict) -> None:
    while indexes:
        _close(indexes.popitem()[1])
