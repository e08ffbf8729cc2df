"""Header-level checks of a .beton against its config: the fields' descriptors, the allocations."""

from __future__ import annotations

from betonbuild.beton.checks import structural_checks
from betonbuild.beton.format import FORMAT_VERSION, BetonFile
from betonbuild.beton.header import read_header
from betonbuild.config.spec import DatasetSpec
from betonbuild.fields import describe_arguments, field_kind


def check_format_version(path: str) -> tuple[bool, str] | None:
    """The header's format version, read from the file's first bytes before the reader (which refuses
    any other version) is built; None for a file too short for a header (the reader says so)."""
    header = read_header(path)
    if header is None:
        return None
    version = int(header["version"])
    if version == FORMAT_VERSION:
        return True, f"format version {version}, the version ffcv 1.0.2 writes and reads"
    return False, (
        f"{path}: the header says format version {version}, expected {FORMAT_VERSION}, the only version "
        "ffcv 1.0.2's reader and Loader accept: the file was not written by this ffcv's DatasetWriter, or its "
        "header is damaged. Fix: rewrite it with betonbuild (delete it and rerun the workflow)"
    )


def check_fields(beton: BetonFile, spec: DatasetSpec) -> tuple[bool, str, dict]:
    """The file's fields are the config's, in order, with the same type ids and descriptor arguments."""
    expected = [(f.name, field_kind(f).type_id) for f in spec.fields]
    found = [(f.name, f.type_id) for f in beton.fields]
    arguments = {f.name: describe_arguments(f) for f in beton.fields if describe_arguments(f)}
    if found != expected:
        i = next(i for i in range(max(len(found), len(expected))) if found[i : i + 1] != expected[i : i + 1])
        return (
            False,
            f"field {i} is {_described(found, i)} in the file, {_described(expected, i)} in the config "
            f"(file has {found}, config says {expected})",
            {"arguments": arguments},
        )
    problems = [field_kind(field).descriptor_problem(field, info) for field, info in zip(spec.fields, beton.fields)]
    problems = [p for p in problems if p]
    detail = "; ".join(problems) or f"{len(found)} fields in config order with ffcv type ids {[t for _, t in found]}"
    return not problems, detail, {"arguments": arguments}


def _described(fields: list[tuple[str, int]], i: int) -> str:
    return f"'{fields[i][0]}' (ffcv type id {fields[i][1]})" if i < len(fields) else "absent"


def allowed_empty(spec: DatasetSpec) -> tuple[str, ...]:
    """The fields whose size-0 allocations are values, not defects."""
    return tuple(f.name for f in spec.fields if field_kind(f).allow_empty(f))


def check_structure(beton: BetonFile, allow_empty: tuple[str, ...]) -> tuple[bool, str, dict]:
    """``beton.structural_checks``: allocations inside the data region, one page each, no overlap..."""
    checks = structural_checks(beton, allow_empty)
    failed = [c for c in checks if not c["ok"]]
    flagged = [c for c in checks if c["ok"] and c.get("flagged")]
    if failed:
        detail = "; ".join(f"{c['name']}: {c['detail']}" for c in failed)
    else:
        detail = (
            f"{len(beton.alloc_table)} allocations inside the page-aligned data region, one page each, "
            "no overlap, each sample on one page, every metadata pointer an allocation of its sample"
        )
        detail += "".join(f"; flagged: {c['detail']}" for c in flagged)
    return not failed, detail, {"structure": checks}
