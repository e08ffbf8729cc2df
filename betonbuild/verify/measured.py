"""The write's measurements of its images (``betonbuild.write.image_measure``), used by
the verification in place of decoding every source image again, when they provably describe this
file: every row measured, none above the tolerance, and the CRC-32s of the payloads read back from
the file, in file order, hash to the digest the write recorded. Otherwise the field is compared
image by image with its source, as without them, and the report says why.
"""

from __future__ import annotations

import hashlib
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from betonbuild.beton.format import BetonFile
from betonbuild.errors import BetonFormatError
from betonbuild.mapped_pages import RELEASE_EVERY_BYTES, release_mapped
from betonbuild.verify.images import DecoderCount

CRC_BLOCK = 16384  # payloads per pool task (zlib releases the GIL while it sums a payload)


def accepted_measurements(
    beton: BetonFile, measured: dict[str, Any] | None, rows: int, tolerance: float, pool: ThreadPoolExecutor
) -> tuple[dict[str, dict], dict[str, str]]:
    """(field -> the measured statistics, as ``FieldKind.compare`` would have counted them) for the
    fields whose measurements describe this file; (field -> why not) for the others."""
    accepted, refused = {}, {}
    for name, entry in (measured or {}).items():
        reason = _unusable(entry, rows, tolerance)
        if reason is None and stored_crc_digest(beton, name, rows, pool) != entry["payload_crc32_sha256"]:
            reason = "the payloads read back differ from the bytes the write measured (CRC-32 digest)"
        if reason is None:
            accepted[name] = _as_compared(entry)
        else:
            refused[name] = reason
    return accepted, refused


def _unusable(entry: dict[str, Any], rows: int, tolerance: float) -> str | None:
    measured = entry.get("jpeg", 0) + entry.get("raw", 0) + entry.get("kept", 0)
    if entry.get("samples") != rows or measured != rows:
        return f"the write measured {measured} of the file's {rows} images"
    if entry["jpeg_mean_abs_error_max"] > tolerance:
        return "an image's JPEG error exceeds the tolerance: each is compared to name it"
    return None


def _as_compared(entry: dict[str, Any]) -> dict[str, Any]:
    stats = {"compared": entry["samples"], "mismatches": 0, "measured_at_write": entry["samples"]}
    for key in ("raw", "kept", "reduced_decode"):  # counted as the image-by-image comparison counts them
        if entry.get(key):
            stats[key] = entry[key]
    if entry["jpeg"]:
        stats.update(
            jpeg=entry["jpeg"],
            jpeg_mean_abs_error_sum=entry["jpeg_mean_abs_error_sum"],
            jpeg_mean_abs_error_max=round(entry["jpeg_mean_abs_error_max"], 3),
            jpeg_max_abs_error_max=entry["jpeg_max_abs_error_max"],
        )
    return stats


def decoder_count(stats: dict[str, Any]) -> DecoderCount:
    """The ``image_decoder`` check's count of a measured field: the write decoded every stored JPEG,
    re-encoded or kept, with ffcv's own imdecode (one it refused would have left the field unmeasured)."""
    return DecoderCount(ffcv_imdecode=stats.get("jpeg", 0) + stats.get("kept", 0))


def stored_crc_digest(beton: BetonFile, name: str, rows: int, pool: ThreadPoolExecutor) -> str | None:
    """SHA-256 over the little-endian CRC-32 of each row's stored image, in file order; None where
    a row's payload cannot be located in the file."""
    blocks = [
        pool.submit(_block_crcs, beton, name, start, min(start + CRC_BLOCK, rows))
        for start in range(0, rows, CRC_BLOCK)
    ]
    digest = hashlib.sha256()
    for block in blocks:
        crcs = block.result()
        if crcs is None:
            return None
        digest.update(crcs.tobytes())
    return digest.hexdigest()


def _block_crcs(beton: BetonFile, name: str, start: int, stop: int) -> np.ndarray | None:
    """The block's CRCs; the file's pages read are unmapped every ``RELEASE_EVERY_BYTES`` and at the end
    (mapped, every payload read stays in the job's RSS: 1.7 GB for 1.28M tiny JPEGs; they stay in
    the page cache). The other threads' reads just map theirs again."""
    rows = np.arange(start, stop)
    sizes = beton.image_sizes(name, rows).tolist()
    pointers = beton.metadata[name]["data_ptr"][start:stop].tolist()
    crcs = np.empty(len(rows), dtype="<u4")
    read = 0
    try:
        for k, (pointer, size) in enumerate(zip(pointers, sizes)):
            if size < 0:
                return None
            crcs[k] = zlib.crc32(beton.read(pointer, size))
            read += size
            if read >= RELEASE_EVERY_BYTES:
                release_mapped(beton.mm)
                read = 0
    except BetonFormatError:
        return None
    finally:
        release_mapped(beton.mm)
    return crcs
