"""The description of any .beton behind ``betonbuild inspect``: a JSON-able dict, and its text rendering.

``describe`` reports the header, the fields with their decoded arguments, the layout, page usage,
bytes per field, the structural checks and a short summary of the first samples; ``as_text``
renders that dict (or ``describe_incomplete``'s, for a file whose custom fields have no class) for
a terminal. Nothing here raises on a corrupt value: it is described instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from betonbuild.beton.checks import structural_checks
from betonbuild.beton.digest import content_digest
from betonbuild.beton.format import HEADER_TYPE, BetonFile, FieldInfo, UnregisteredCustomField
from betonbuild.errors import BetonFormatError
from betonbuild.fields import field_kind, stored_kind


def describe(beton: BetonFile, samples: int = 3, digest: bool = False) -> dict[str, Any]:
    """Header, fields with decoded arguments, layout, pages, bytes per field, structure, first samples."""
    per_field = bytes_per_field(beton)
    n = beton.num_samples
    fields = []
    for info in beton.fields:
        kind = stored_kind(info, beton.path)
        stored = per_field[info.name]
        fields.append(
            {
                "name": info.name,
                "type": kind.name,  # a type-255 field read by betonbuild's own class: its kind (ragged_ndarray...)
                "type_id": info.type_id,
                "arguments": kind.describe_arguments(info),
                "metadata_bytes": stored["metadata"],
                "data_bytes": stored["data"],
                "data_bytes_per_sample": round(stored["data"] / n, 1) if n else 0.0,
                **kind.describe_stored(beton, info),
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
            {"index": position, "fields": {info.name: summarise(beton, info, position) for info in beton.fields}}
            for position in range(min(max(samples, 0), n))
        ],
    }
    if digest:
        out["content_digest"] = content_digest(beton)
    return out


def describe_incomplete(path: str, error: UnregisteredCustomField) -> dict[str, Any]:
    """What can be told of a file whose custom fields have no registered class: header and fields."""
    fields = []
    for f in error.fields:
        kind = stored_kind(f, path)
        arguments = {} if kind.class_decodes_arguments else {"arguments": kind.describe_arguments(f)}
        fields.append({"name": f.name, "type": f.type_name, "type_id": f.type_id, **arguments})
    return {"file": path, "header": error.header, "fields": fields, "incomplete": str(error)}


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
    for info in beton.fields:
        data = stored_kind(info, beton.path).data_bytes(beton, info)
        out[info.name] = {"metadata": int(info.metadata_type.itemsize * n), "data": int(data)}
    if any(stored_kind(f, beton.path).custom_allocations for f in beton.fields):
        custom = int(beton._custom_allocations[2].sum(dtype=np.uint64))
        out["(custom allocations)"] = {"metadata": 0, "data": custom}
    return out


def summarise(beton: BetonFile, info: FieldInfo, position: int) -> Any:
    """A short, JSON-able summary of one stored value (its kind's); a corrupt value is described, not raised."""
    try:
        return stored_kind(info, beton.path).summarise(beton, info, position)
    except BetonFormatError as exc:
        return f"unreadable: {str(exc).removeprefix(beton.path + ': ')}"


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
    lines.append(f"  {'#':>2}  {'name':<16} {'type':<14} {'stored':>10} {'per sample':>11}  arguments")
    for i, f in enumerate(info["fields"]):
        stored = f["metadata_bytes"] + f["data_bytes"]
        per = stored / header["num_samples"] if header["num_samples"] else 0
        arguments = field_kind(f["type"]).arguments_text(f)
        lines.append(f"  {i:>2}  {f['name']:<16} {f['type']:<14} {_human(stored):>10} {_human(per):>11}  {arguments}")
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
