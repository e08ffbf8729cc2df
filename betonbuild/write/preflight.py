"""The pre-flight survey: what the samples look like, before the full build starts.

Written to ``results/{ds}/inspect.json`` (a file name users already read; "inspect" in the code is
the ``betonbuild inspect`` command, which describes a .beton).

Runs in one process over the smoke samples plus the largest samples that can be found cheaply
(image folders: by file size; array sources: every row has the same size). Every sample goes
through the same contract as the write, and its allocations are measured against page_size, so a
problem found here fails the smoke build in seconds with the same message the full write would give.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import numpy as np

from betonbuild.config.spec import LARGEST_SAMPLES, DatasetSpec
from betonbuild.errors import SampleError, SourceError
from betonbuild.fields import build_fields
from betonbuild.write.contract import sample_to_tuple
from betonbuild.write.writer import CheckedDataset, measure_allocations, page_fit_error


def largest_rows(source, order: np.ndarray, k: int = LARGEST_SAMPLES) -> np.ndarray:
    """Source indices of the k largest samples of ``order``, where the source can tell sizes cheaply."""
    sizes = source.sample_sizes() if hasattr(source, "sample_sizes") else None
    if sizes is None or len(order) == 0 or sizes.min() == sizes.max():
        # all rows equal (every arrays source): the smoke samples already say it all, and no
        # order-sized copy of the sizes is made (16 bytes a sample at 100M rows)
        return np.array([], dtype=np.int64)
    in_order = sizes[order]
    top = np.argsort(in_order, kind="stable")[::-1][:k]
    return order[np.sort(top)]


def survey_samples(spec: DatasetSpec, source, rows: np.ndarray) -> dict[str, Any]:
    """Checks and measures every given sample; raises the first SampleError (smallest index first).

    Under ``bad_samples: {policy: skip}`` a bad sample is listed (``bad_samples``) instead, and the
    smoke write that follows applies the limit to its own samples."""
    bad: list[dict[str, Any]] = []
    if spec.bad_samples.skip:
        rows, bad = _without_bad(spec, source, rows)
    if not len(rows):
        return {"dataset": spec.name, "samples_inspected": 0, "bad_samples": bad, "fields": {}, "largest_sample": None}
    fields = build_fields(spec)
    checked = CheckedDataset(spec, source)
    per_field: dict[str, dict[str, Any]] = {f.name: defaultdict(set) for f in spec.fields}
    sizes: dict[str, list[int]] = {f.name: [] for f in spec.fields}
    largest_total, largest_index = -1, None
    for index in sorted(set(int(i) for i in rows)):
        raw = checked.fetch(index)
        mapped = sample_to_tuple(spec, raw, index)  # before conversion: the types the source returns
        values = checked.check(raw, index)
        allocations = measure_allocations(fields, values)
        total = sum(allocations.values())
        if total > spec.writer.page_size:
            raise page_fit_error(spec, fields, values, index)
        if total > largest_total:
            largest_total, largest_index = total, index
        for field, raw_value, value in zip(spec.fields, mapped, values):
            info = per_field[field.name]
            info["python_types"].add(type(raw_value).__module__ + "." + type(raw_value).__qualname__)
            if hasattr(value, "dtype"):
                info["dtypes"].add(str(value.dtype))
            if hasattr(value, "shape"):
                info["shapes"].add(tuple(int(s) for s in value.shape))
            info["json_encodable"].add(_json_encodable(raw_value))
            sizes[field.name].append(allocations[field.name] + np.dtype(fields[field.name].metadata_type).itemsize)
    summary = {}
    for field in spec.fields:
        info, field_sizes = per_field[field.name], np.array(sizes[field.name])
        shapes = sorted(info["shapes"])
        summary[field.name] = {
            "type": field.type,
            "python_types": sorted(info["python_types"]),
            "dtypes": sorted(info["dtypes"]),
            "shape_min": list(np.min(shapes, axis=0)) if shapes and len({len(s) for s in shapes}) == 1 else None,
            "shape_max": list(np.max(shapes, axis=0)) if shapes and len({len(s) for s in shapes}) == 1 else None,
            "bytes": {
                "min": int(field_sizes.min()),
                "median": float(np.median(field_sizes)),
                "max": int(field_sizes.max()),
            },
            "json_encodable": bool(info["json_encodable"]) and all(info["json_encodable"]),
        }
    return {
        "dataset": spec.name,
        "samples_inspected": len(set(int(i) for i in rows)),
        **({"bad_samples": bad} if spec.bad_samples.skip else {}),
        "fields": summary,
        "largest_sample": {
            "index": largest_index,
            "bytes": int(largest_total),
            "page_size": spec.writer.page_size,
            "fraction_of_page": round(largest_total / spec.writer.page_size, 6),
        },
    }


def _without_bad(spec: DatasetSpec, source, rows: np.ndarray) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """``rows`` without the samples that fail their read or contract, and those samples' records."""
    checked, fields, good, bad = CheckedDataset(spec, source), build_fields(spec), [], []
    for index in sorted(set(int(i) for i in rows)):
        try:
            values = checked[index]
            if sum(measure_allocations(fields, values).values()) > spec.writer.page_size:
                raise page_fit_error(spec, fields, values, index)
            good.append(index)
        except SourceError:
            raise
        except SampleError as exc:
            if not exc.skippable:
                raise
            bad.append({"index": index, "field": exc.field, "message": exc.why})
    return np.array(good, dtype=np.int64), bad


def _json_encodable(value: Any) -> bool:
    """Whether the source's value could be stored as a ``json`` field as it is."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, OverflowError, RecursionError):
        return False
    return True
