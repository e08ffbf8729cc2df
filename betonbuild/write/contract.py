"""The strict per-field sample contract, checked BEFORE a value reaches ffcv.

ffcv silently stores wrong data for many inputs (int32 into a float32 field, a short tuple, an
empty bytes value...). Every check here turns such a value into a ``SampleError`` naming the
dataset, the field and the source index; nothing is coerced silently. The few explicit
conversions (``image_mode: convert``, ``json_numpy: convert``, bytes objects -> uint8 arrays,
non-contiguous -> contiguous) change representation, never values, and so do the lossless ones
(a 0-d array or tensor -> its number, a whole float -> int, an int8 array -> its bytes, a bool
array -> uint8): a value that would change (3.5 into an int field, float64 into float32) is
refused. The value a check returns is what verification compares. Each field kind holds its
own check (``FieldKind.check``, ``betonbuild.fields``); this module maps a sample onto the fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from betonbuild.config.spec import DatasetSpec, FieldSpec
from betonbuild.errors import SampleError
from betonbuild.fields import field_kind
from betonbuild.fields.kind import describe

__all__ = ["SampleContract", "check_sample", "check_value", "describe", "sample_to_tuple"]


def sample_to_tuple(spec: DatasetSpec, sample: Any, index: int) -> tuple:
    """Map one source sample onto the field order: tuples by position, dicts by name (never by iteration)."""
    names = spec.field_names
    if type(sample) is tuple and len(sample) == len(names):
        return sample  # the common case, before the slower isinstance of an ABC (a sample each)
    if isinstance(sample, Mapping):
        keys = list(spec.sample_keys) if spec.sample_keys is not None else names
        missing = [k for k in keys if k not in sample]
        if missing:
            raise SampleError(
                spec.name,
                None,
                index,
                f"dict sample has no key {missing[0]!r} (keys present: {sorted(map(str, sample))})",
                "return every field's key, or set sample_keys to name the key of each field in order",
            )
        unexpected = [k for k in sample if k not in keys]
        if unexpected:
            raise SampleError(
                spec.name,
                None,
                index,
                f"dict sample has unexpected key {unexpected[0]!r}; fields are {names}",
                "add a field for it or drop it in your dataset's __getitem__",
            )
        return tuple(sample[k] for k in keys)
    if isinstance(sample, (tuple, list)):
        if len(sample) != len(names):
            raise SampleError(
                spec.name,
                None,
                index,
                f"sample has {len(sample)} values but {len(names)} fields are configured {names}; "
                "ffcv would silently zero missing trailing fields or drop extra values",
                "return exactly one value per field, in field order",
            )
        return tuple(sample)
    raise SampleError(
        spec.name,
        None,
        index,
        f"sample is a {type(sample).__name__}, not a tuple, list or dict",
        "return a tuple with one value per field, or a dict keyed by field name",
    )


def check_sample(spec: DatasetSpec, sample: Any, index: int) -> tuple:
    """Map and check a whole sample; returns the values ffcv will encode, in field order."""
    return SampleContract(spec)(sample, index)


class SampleContract:
    """``check_sample`` of one dataset with each field's check looked up once: the write and the
    verification call it once a sample."""

    def __init__(self, spec: DatasetSpec):
        self.spec = spec
        self.checks = tuple((field, field_kind(field).check) for field in spec.fields)

    def __call__(self, sample: Any, index: int) -> tuple:
        values = sample_to_tuple(self.spec, sample, index)
        dataset = self.spec.name
        return tuple(
            [
                check(field, value, _failing(dataset, field.name, index))
                for (field, check), value in zip(self.checks, values)
            ]
        )


def _failing(dataset: str, field: str, index: int):
    def fail(why: str, fix: str = "") -> SampleError:
        return SampleError(dataset, field, index, why, fix)

    return fail


def check_value(dataset: str, field: FieldSpec, value: Any, index: int) -> Any:
    return field_kind(field).check(field, value, _failing(dataset, field.name, index))
