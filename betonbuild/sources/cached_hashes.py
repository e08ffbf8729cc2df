"""Content digests of a source's input files, cached by path, size, mtime and inode: a build
over many files reads again only those that are new or changed since the last manifest."""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from betonbuild.atomic import write_json
from betonbuild.sources.files import sha256_file


def cached_file_hashes(files: list[str], cache_path: str | os.PathLike | None) -> dict[str, Any]:
    """What ``files.fingerprint_files`` gives (``files``, ``bytes``, ``sha256``, ``file_sha256``),
    hashing only the files whose stat differs from the cache (no cache: every file)."""
    cache: dict[str, Any] = {}
    if cache_path is not None:
        try:
            cache = json.loads(Path(cache_path).read_text())
        except (OSError, ValueError):
            cache = {}
    stats = [os.stat(path) for path in files]
    keys = [[s.st_size, s.st_mtime_ns, s.st_ino] for s in stats]
    stale = [i for i, path in enumerate(files) if (cache.get(path) or {}).get("stat") != keys[i]]
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        for i, digest in zip(stale, pool.map(sha256_file, [files[i] for i in stale])):
            cache[files[i]] = {"stat": keys[i], "sha256": digest}
    if cache_path is not None and stale:
        write_json(cache_path, {path: cache[path] for path in files})
    combined = hashlib.sha256()
    for path, stat in zip(files, stats):
        combined.update(f"{path}\0{stat.st_size}\0{cache[path]['sha256']}\n".encode())
    return {
        "files": len(files),
        "bytes": sum(s.st_size for s in stats),
        "sha256": combined.hexdigest(),
        "file_sha256": [cache[path]["sha256"] for path in files],
    }
