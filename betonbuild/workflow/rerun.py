"""Which spec keys rerun which rule: each rule's ``spec`` parameter holds exactly those keys.

Snakemake reruns a job when one of its parameters changes, so a rule's ``params: spec=`` is the
part of the dataset's spec its output depends on, and nothing more: e.g. editing
``verify.samples`` reruns the full verification alone, not the write job (whose smoke gate uses
only the JPEG tolerance of the verify settings).
"""

from __future__ import annotations

from typing import Any

from betonbuild.config.spec import DatasetSpec
from betonbuild.sources import source_class

# What every stage depends on: the samples and how they are laid out in the file.
CONTENT_KEYS = ("name", "source", "fields", "sample_keys", "writer")


def _spec_parts(spec: DatasetSpec, *parts: str) -> dict[str, Any]:
    full = spec.to_dict()
    # bad_samples is in the dict only when not the default (skip): what to write depends on it
    return {key: full[key] for key in CONTENT_KEYS + ("bad_samples",) + parts if key in full}


def write_spec(spec: DatasetSpec) -> dict[str, Any]:
    """What determines the full file's bytes (also of its parts, its merge and its report). A one-pass
    (iterable) source's write cuts its parts itself: their size and whether they are kept are its own."""
    if source_class(spec).one_pass:
        return _spec_parts(spec, "samples_per_partition", "keep_parts")
    return _spec_parts(spec)


def manifest_spec(spec: DatasetSpec) -> dict[str, Any]:
    """The source manifest also plans the partitions and the smoke samples."""
    return _spec_parts(spec, "partitions", "samples_per_partition", "smoke")


def smoke_spec(spec: DatasetSpec) -> dict[str, Any]:
    return _spec_parts(spec, "smoke")


def verify_spec(spec: DatasetSpec) -> dict[str, Any]:
    return _spec_parts(spec, "verify")


def smoke_verify_spec(spec: DatasetSpec) -> dict[str, Any]:
    """The smoke gate checks all its samples: of the verify settings only the JPEG tolerance applies.

    Leaving out the rest keeps a change of e.g. verify.samples from rerunning the gate, and with
    it the full write (in the same job for a dataset without partitions).
    """
    params = _spec_parts(spec, "smoke", "verify")
    params["verify"] = {"jpeg_mean_abs_error": params["verify"]["jpeg_mean_abs_error"]}
    return params


def gate_and_write_spec(spec: DatasetSpec) -> dict[str, Any]:
    """The write job of a dataset without partitions, which gates on its smoke file first: what the
    full file's bytes depend on and what its smoke gate does."""
    return {**smoke_verify_spec(spec), **write_spec(spec)}


def part_verify_spec(spec: DatasetSpec) -> dict[str, Any]:
    """A part is verified in full: of the verify settings the JPEG tolerance and the Loader batch apply."""
    params = _spec_parts(spec, "verify")
    params["verify"] = {key: params["verify"][key] for key in ("jpeg_mean_abs_error", "loader_batch")}
    return params
