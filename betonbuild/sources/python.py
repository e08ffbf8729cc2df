"""``python``: the user's ``module:factory(**args)``, imported with the working directory on sys.path."""

from __future__ import annotations

from typing import Any

from betonbuild.config.spec import DatasetSpec
from betonbuild.errors import SourceError
from betonbuild.sources.adapters import import_factory
from betonbuild.sources.base import Source


class PythonSource(Source):
    kind = "python"
    # The source's entry in the config, as JSON Schema (config.load assembles the whole schema)
    config_schema = {
        "additionalProperties": False,
        "required": ["factory"],
        "properties": {
            "kind": {},
            "factory": {
                "type": "string",
                "pattern": "^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$",
                "description": "module:function, imported with the working directory on sys.path.",
            },
            "args": {"type": "object", "default": {}},
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
