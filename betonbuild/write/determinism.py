"""The source must give the same sample every time an index is read.

Verification re-reads the source in another process and compares it with the file: a dataset
that draws random values without a seed (in ``__getitem__``, or once in ``__init__`` or its
factory) then fails with "differs from the source", which reads like a betonbuild bug, after the
full write. The smoke stage asks first, on a few samples: each is read twice from the opened
source, and once more from a second opening of it when the source runs the user's code; the
values compared are the bytes ffcv would store (``encode_scratch``), so a difference is one the
file would show.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from betonbuild.config.spec import DatasetSpec
from betonbuild.errors import SampleError
from betonbuild.fields import build_fields
from betonbuild.write.writer import CheckedDataset, encode_scratch

REREAD_SAMPLES = 4  # an unseeded random source differs on (nearly) every sample: a few are enough

WHY = "the source returns different values for the same index"
FIX = (
    "seed it or make it deterministic: draw a sample's random values from a generator seeded by its "
    "index (np.random.default_rng(index)) and those of __init__ from a fixed seed"
)


class SourceNotDeterministic(SampleError):
    """A sample read twice differs: nothing for ``betonbuild repro`` to replay (each read passes)."""


def check_deterministic(
    spec: DatasetSpec, source: Any, rows: Sequence[int], reopen: Callable[[], Any] | None = None
) -> None:
    """Reads the first ``REREAD_SAMPLES`` of ``rows`` twice from ``source`` and, if ``reopen`` is given,
    once from the source it opens anew; raises SourceNotDeterministic naming the dataset, the first
    field whose stored bytes would differ and the index."""
    fields = build_fields(spec)
    checked = CheckedDataset(spec, source)
    indices = sorted({int(i) for i in rows})[:REREAD_SAMPLES]
    first = {index: encoded_sample(fields, checked[index]) for index in indices}
    for index in indices:
        _compare(spec, index, first[index], encoded_sample(fields, checked[index]), "two reads of it differ")
    if reopen is None:
        return
    again = CheckedDataset(spec, reopen())
    for index in indices:
        _compare(
            spec,
            index,
            first[index],
            encoded_sample(fields, again[index]),
            "it differs between two openings of the source: values drawn when the dataset is created "
            "(its __init__ or factory)",
        )


def encoded_sample(fields: dict, values: tuple) -> dict[str, bytes]:
    """Per field, the bytes ffcv stores for the checked sample ``values`` (record, then allocations)."""
    encoded = {}
    for (name, field), value in zip(fields.items(), values):
        record, buffers = encode_scratch(field, value)
        encoded[name] = record.tobytes() + b"".join(np.asarray(b).tobytes() for b in buffers)
    return encoded


def _compare(spec: DatasetSpec, index: int, first: dict[str, bytes], second: dict[str, bytes], how: str) -> None:
    for name, data in first.items():
        if second[name] != data:
            raise SourceNotDeterministic(spec.name, name, index, f"{WHY} ({how})", FIX)
