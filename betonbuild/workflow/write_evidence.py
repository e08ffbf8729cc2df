"""What the write job learned about the file it wrote, which the full verification then need not
learn again, and the conditions under which it still describes that file.

- ``measured_images`` (``betonbuild.write.image_measure``): the JPEG error and CRC-32 of every
  re-encoded image, as written. Used only while the source is the one the write read (the same
  fingerprint of its files, and no code of the user's, which could read data no fingerprint covers);
  ``betonbuild.verify.measured`` then checks the stored payloads against the CRCs.
- ``loader_batch``: the batch through the real ``ffcv.Loader``, run by the write job after the
  file's structural checks passed, in a child process it started before the write (ffcv's import,
  torch's, 2-3 s of a core, then overlaps the write; betonbuild's writer imports no ffcv). The
  verification would otherwise import ffcv after the write, for this batch alone. Used only
  for the same file: the verification's SHA-256 of the file (which it computes anyway) must equal
  the one the write job took after the batch. (Snakemake touches every output after its job, so
  size, inode and mtime cannot tell.)
"""

from __future__ import annotations

import sys
from typing import Any

from betonbuild.beton.format import BetonFile
from betonbuild.config.spec import DatasetSpec
from betonbuild.fields.custom import custom_handlers
from betonbuild.sources import sha256_file, source_class
from betonbuild.verify.loader import LoaderProcess, check_loader_batch, content_without_ffcv
from betonbuild.verify.structure import allowed_empty, check_structure


def source_state(manifest: dict[str, Any], part: int | None) -> str | None:
    """The fingerprint of the source content a write read: its part's, or the whole manifest's inputs."""
    if part is not None:
        return manifest["partitions"][part]["fingerprint"]
    return (manifest.get("inputs") or {}).get("sha256")


def measured_for(spec: DatasetSpec, record: dict[str, Any], manifest: dict[str, Any], part: int | None):
    """The record's ``measured_images`` where they were taken from the source as it is now, else None."""
    state = source_state(manifest, part)
    if state is None or record.get("source_state") != state or source_class(spec).adapter_references(spec):
        return None
    return record.get("measured_images")


def loader_batch_after_write(spec: DatasetSpec, path: str, child: LoaderProcess | None) -> dict[str, Any] | None:
    """The Loader batch of the file just written at ``path``, for its record: run by ``child`` (a
    ``start_loader_process`` the write job started before its write, so that ffcv's import ran on
    another core meanwhile), or here where this process imported ffcv already. None where the
    verification needs ffcv's modules anyway (``content_without_ffcv``), so it gains nothing, or
    where neither can run it: the verification then does."""
    if not content_without_ffcv(spec) or (child is None and "ffcv.loader" not in sys.modules):
        return None
    try:
        beton = BetonFile(path, custom_handlers=custom_handlers(spec))
        structure_ok, detail, _ = check_structure(beton, allowed_empty(spec))
        # ffcv's Loader reads pointers unchecked: a file that fails these is left to the verification
        if not structure_ok:
            ok, detail = False, f"not run: {detail}"
        else:
            ok, detail = child.request(path, spec).result() if child else check_loader_batch(beton, spec)
    except Exception as exc:  # noqa: BLE001 - the verification then runs the batch itself, and reports
        ok, detail = False, f"{type(exc).__name__}: {exc}"
    return {"ok": bool(ok), "detail": detail, "sha256": sha256_file(path) if ok else None}


def written_loader_batch(record: dict[str, Any]) -> dict[str, Any] | None:
    """The write job's passed Loader batch ({ok, detail, sha256}), or None: the verification then
    runs the batch itself (a failed one too, to report it in its own words)."""
    batch = record.get("loader_batch")
    return batch if batch and batch.get("ok") and batch.get("sha256") else None
