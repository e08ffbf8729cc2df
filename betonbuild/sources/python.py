"""``python``: the user's ``module:factory(**args)``, imported with the working directory on sys.path."""

from __future__ import annotations

import os
from typing import Any

from betonbuild.config.spec import ORDER_BYTES_PER_SAMPLE, DatasetSpec, count_indices
from betonbuild.errors import SourceError
from betonbuild.sources.adapters import factory_properties, import_factory
from betonbuild.sources.base import Source


class PythonSource(Source):
    kind = "python"
    # The source's entry in the config, as JSON Schema (config.load assembles the whole schema)
    config_schema = {
        "additionalProperties": False,
        "required": ["factory"],
        "properties": {
            "kind": {},
            **factory_properties("a map-style dataset (__len__ and __getitem__)"),
        },
    }
    # The user's code may import anything (ffcv, torch): verification then keeps the Loader batch in-process.
    may_import_ffcv = True
    files: list[str] = []  # the factory's module is an adapter file

    def __init__(self, spec: DatasetSpec):
        self.spec = spec
        factory = import_factory(spec.name, spec.source["factory"])
        try:
            self.dataset = factory(**spec.source.get("args", {}))
        except Exception as exc:
            raise SourceError(
                spec.name, f"factory {spec.source['factory']} raised {type(exc).__name__}: {exc}"
            ) from exc
        if not (hasattr(self.dataset, "__len__") and hasattr(self.dataset, "__getitem__")):
            raise SourceError(
                spec.name,
                f"factory {spec.source['factory']} returned a {type(self.dataset).__name__}, "
                "which lacks __len__ and __getitem__",
            )
        check_length(spec, self.dataset)

    @classmethod
    def adapter_references(cls, spec: DatasetSpec) -> list[str]:
        return [spec.source["factory"]]

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def sample_sizes(self) -> None:
        return None  # unknown without reading every sample

    def inputs_fingerprint(self, read_files: bool = True) -> dict[str, Any]:
        return {"files": 0, "bytes": 0, "sha256": ""}  # the factory's module is an adapter file

    # part_fingerprint: "", a factory's samples cannot be hashed without reading them all; only its
    # code (the adapters digest, part of every fingerprint) is


def check_length(spec: DatasetSpec, dataset: Any) -> int:
    """``len(dataset)``, refused (SourceError) if it fails or if the order it selects cannot fit in memory
    (checked before anything is allocated: a __len__ of 10**12 would otherwise fail allocating 7.28 TiB)."""
    try:
        length = len(dataset)
    except Exception as exc:  # noqa: BLE001 - e.g. OverflowError for a length beyond sys.maxsize
        raise SourceError(spec.name, f"len() of the dataset failed: {type(exc).__name__}: {exc}") from None
    selected = count_indices(spec.writer, length)
    needed, memory = selected * ORDER_BYTES_PER_SAMPLE, physical_memory()
    if memory and needed > memory:
        raise SourceError(
            spec.name,
            f"the dataset's __len__ is {length:,}: {selected:,} samples need {_gib(needed)} for the sample "
            f"order alone ({ORDER_BYTES_PER_SAMPLE} bytes each), more than this machine's {_gib(memory)} of memory; "
            "check __len__ (it is implausibly large), or select fewer samples with writer.indices",
        )
    return length


def physical_memory() -> int | None:
    """Bytes of RAM of this machine, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:,.1f} GiB"
