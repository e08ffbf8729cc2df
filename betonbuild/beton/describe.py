"""The description of any .beton behind ``betonbuild inspect``: a JSON-able dict, and its text rendering.

``describe`` reports the header, the fields with their decoded arguments, the layout, page usage,
bytes per field, the structural checks and a short summary of the first samples; ``as_text``
renders that dict (or ``describe_incomplete``'s, for a file whose custom fields have no class) for
a terminal. Nothing here raises on a corrupt value: it is described instead.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from betonbuild.beton.checks import structural_checks
from betonbuild.beton.digest import content_digest
from betonbuild.beton.format import (
    CUSTOM_TYPE_ID,
    HEADER_TYPE,
    IMAGE_MODE_JPEG,
    IMAGE_MODE_RAW,
    BetonFile,
    FieldInfo,
    UnregisteredCustomField,
)
from betonbuild.beton.payloads import decode_json
from betonbuild.errors import BetonFormatError


def describe(beton: BetonFile, samples: int = 3, digest: bool = False) -> dict[str, Any]:
    """Header, fields with decoded arguments, layout, pages, bytes per field, structure, first samples."""
    per_field = bytes_per_field(beton)
    n = beton.num_samples
    fields = []
    for info in beton.fields:
        stored = per_field[info.name]
        fields.append(
            {
                "name": info.name,
                "type": info.type_name,
                "type_id": info.type_id,
                "arguments": info.describe_arguments(),
                "metadata_bytes": stored["metadata"],
                "data_bytes": stored["data"],
                "data_bytes_per_sample": round(stored["data"] / n, 1) if n else 0.0,
                **({"image_modes": _image_modes(beton, info)} if info.type_id == 2 else {}),
            }
        )
    checks = structural_checks(beton)
    out = {
        "file": beton.path,
        "bytes": beton.size,
        "header": {
            "version": beton.version,
            "page_size": beton.page_size,
            "num_samples": n,
            "num_fields": beton.num_fields,
            "alloc_table_ptr": beton.alloc_table_ptr,
        },
        "layout": {
            "descriptors": [HEADER_TYPE.itemsize, beton.metadata_start],
            "metadata": [beton.metadata_start, beton.metadata_end],
            "metadata_record_bytes": beton.metadata_type.itemsize,
            "data_region": [min(beton.data_start, beton.alloc_table_ptr), beton.alloc_table_ptr],
            "allocation_table": [beton.alloc_table_ptr, beton.size],
            **page_usage(beton),
        },
        "fields": fields,
        "structure_ok": all(c["ok"] for c in checks),
        "structure": checks,
        "samples": [
            {"index": row, "fields": {info.name: summarise(beton, info, row) for info in beton.fields}}
            for row in range(min(max(samples, 0), n))
        ],
    }
    if digest:
        out["content_digest"] = content_digest(beton)
    return out


def describe_incomplete(path: str, error: UnregisteredCustomField) -> dict[str, Any]:
    """What can be told of a file whose custom fields have no registered class: header and fields."""
    return {
        "file": path,
        "header": error.header,
        "fields": [
            {
                "name": f.name,
                "type": f.type_name,
                "type_id": f.type_id,
                **({"arguments": f.describe_arguments()} if f.type_id != CUSTOM_TYPE_ID else {}),
            }
            for f in error.fields
        ],
        "incomplete": str(error),
    }


def page_usage(beton: BetonFile) -> dict[str, Any]:
    """Pages of the data region, how many hold allocations, and how full they are."""
    table = beton.alloc_table
    pages = (
        (beton.alloc_table_ptr - beton.data_start) // beton.page_size if beton.alloc_table_ptr > beton.data_start else 0
    )
    used = int(np.unique(table["ptr"] >> np.uint64(beton.page_shift)).size) if len(table) else 0
    stored = int(table["size"].sum(dtype=np.uint64)) if len(table) else 0
    return {
        "pages": int(pages),
        "pages_used": used,
        "allocations": int(len(table)),
        "allocated_bytes": stored,
        "fill_ratio": round(stored / (pages * beton.page_size), 4) if pages else 0.0,
    }


def bytes_per_field(beton: BetonFile) -> dict[str, dict[str, int]]:
    """Per field: bytes in the metadata table and in the data pages."""
    n = beton.num_samples
    out = {}
    rows = np.arange(n, dtype=np.uint64)
    for info in beton.fields:
        meta = info.metadata_type.itemsize * n
        if info.type_id in (4, 6):
            data = info.payload_bytes * n
        elif info.type_id in (3, 5):
            data = int(beton.metadata[info.name]["size"].sum(dtype=np.uint64))
        elif info.type_id == 2:
            sizes = beton.image_sizes(info.name, rows.astype(np.int64))
            data = int(np.maximum(sizes, 0).sum())
        else:
            data = 0
        out[info.name] = {"metadata": int(meta), "data": int(data)}
    if any(f.type_id == CUSTOM_TYPE_ID for f in beton.fields):
        custom = int(beton._custom_allocations[2].sum(dtype=np.uint64))
        out["(custom allocations)"] = {"metadata": 0, "data": custom}
    return out


def _image_modes(beton: BetonFile, info: FieldInfo) -> dict[str, int]:
    modes = beton.metadata[info.name]["mode"]
    jpeg, raw = int((modes == IMAGE_MODE_JPEG).sum()), int((modes == IMAGE_MODE_RAW).sum())
    return {"jpeg": jpeg, "raw": raw, **({"unknown": len(modes) - jpeg - raw} if len(modes) - jpeg - raw else {})}


def summarise(beton: BetonFile, info: FieldInfo, row: int) -> Any:
    """A short, JSON-able summary of one stored value; a corrupt value is described, not raised."""
    try:
        return _summary(beton, info, row)
    except BetonFormatError as exc:
        return f"unreadable: {str(exc).removeprefix(beton.path + ': ')}"


def _summary(beton: BetonFile, info: FieldInfo, row: int) -> Any:
    record = beton.metadata[info.name][row]
    if info.type_id == 1:
        return int(record)
    if info.type_id == 0:
        value = float(record)
        return value if np.isfinite(value) else str(value)
    if info.type_id in (4, 6):
        array = beton.ndarray_column(info.name, np.array([row]))[0]
        text = f"{array.dtype}{list(array.shape)}"
        if array.dtype.kind in "biuf" and array.size:
            with np.errstate(all="ignore"):
                flat = array.astype(np.float64).reshape(-1)
            text += (
                f" min={np.nanmin(flat):.6g} max={np.nanmax(flat):.6g} mean={np.nanmean(flat):.6g}"
                if not np.isnan(flat).all()
                else " all NaN"
            )
        return text
    if info.type_id == 3:
        payload = bytes(beton.variable_payload(info.name, row))
        return f"{len(payload)} bytes: {payload[:16].hex(' ')}{' ...' if len(payload) > 16 else ''}"
    if info.type_id == 5:
        text = json.dumps(decode_json(beton.variable_payload(info.name, row)), separators=(",", ":"))
        return text if len(text) <= 80 else text[:77] + "..."
    if info.type_id == 2:
        mode = int(record["mode"])
        kind = {IMAGE_MODE_JPEG: "jpeg", IMAGE_MODE_RAW: "raw"}.get(mode, f"mode {mode}")
        size = len(beton.variable_payload(info.name, row))
        return f"{kind} {int(record['width'])}x{int(record['height'])}, {size} bytes"
    handler = info.handler
    if handler is not None and hasattr(handler, "decode"):
        payloads = [np.asarray(beton.read(p, s)) for p, s in beton.custom_allocations(row)]
        try:
            value = handler.decode(record, payloads)
        except Exception as exc:  # noqa: BLE001 - the class's own decode of hostile bytes
            return f"unreadable: {type(handler).__name__}.decode raised {type(exc).__name__}: {exc}"
        text = repr(value)
        return text if len(text) <= 80 else text[:77] + "..."
    raw = beton.record_bytes(info.name, row)
    return f"record {raw[:16].hex(' ')}{' ...' if len(raw) > 16 else ''}"


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def as_text(info: dict[str, Any]) -> str:
    """The description (``describe`` or ``describe_incomplete``) as the lines ``betonbuild inspect`` prints."""
    header = info["header"]
    lines = [
        f"file          {info['file']} ({_human(header.get('bytes', info.get('bytes', 0)))})",
        f"format        version {header['version']}, page size {_human(header['page_size'])} "
        f"({header['page_size']} bytes)",
        f"samples       {header['num_samples']}",
    ]
    if "incomplete" in info:
        lines.append("fields")
        lines += [
            f"  {i:>2}  {f['name']:<16} {f['type']:<12} type id {f['type_id']}" for i, f in enumerate(info["fields"])
        ]
        lines.append(f"incomplete    {info['incomplete']}")
        return "\n".join(lines)
    layout = info["layout"]
    lines.append(
        f"data region   bytes [{layout['data_region'][0]}, {layout['data_region'][1]}): {layout['pages']} pages, "
        f"{layout['pages_used']} used, fill ratio {layout['fill_ratio']:.1%}"
    )
    lines.append(
        f"allocations   {layout['allocations']} ({_human(layout['allocated_bytes'])}); metadata "
        f"{layout['metadata_record_bytes']} bytes per sample"
    )
    lines.append("fields")
    lines.append(f"  {'#':>2}  {'name':<16} {'type':<12} {'stored':>10} {'per sample':>11}  arguments")
    for i, f in enumerate(info["fields"]):
        stored = f["metadata_bytes"] + f["data_bytes"]
        per = stored / header["num_samples"] if header["num_samples"] else 0
        arguments = ", ".join(f"{k}={v}" for k, v in f["arguments"].items() if k != "note")
        if "image_modes" in f:
            arguments = ", ".join(f"{k} {v}" for k, v in f["image_modes"].items())
        lines.append(f"  {i:>2}  {f['name']:<16} {f['type']:<12} {_human(stored):>10} {_human(per):>11}  {arguments}")
    failed = [c for c in info["structure"] if not c["ok"]]
    flagged = [c for c in info["structure"] if c["ok"] and c.get("flagged")]
    lines.append(
        "structure     "
        + (
            "ok: aligned pages, allocations in the file and on one page each, no overlap, "
            "every metadata pointer an allocation of its sample"
            if not failed
            else "PROBLEMS"
        )
    )
    lines += [f"  - {c['name']}: {c['detail']}" for c in failed + flagged]
    if "content_digest" in info:
        lines.append(f"content       sha256 {info['content_digest']}")
    if info["samples"]:
        lines.append(f"first {len(info['samples'])} samples")
        for sample in info["samples"]:
            lines.append(f"  [{sample['index']}]")
            lines += [f"      {name:<16} {value}" for name, value in sample["fields"].items()]
    return "\n".join(lines)
