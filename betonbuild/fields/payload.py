"""What bytes and json share: one allocation per sample, its (ptr, size) in the metadata record."""

from __future__ import annotations

import numpy as np

from betonbuild.beton.format import BetonFile, FieldInfo
from betonbuild.config.spec import FieldSpec
from betonbuild.fields.kind import FieldKind


class PayloadKind(FieldKind):
    cost_per_sample_s = 0.002

    def loader_pipeline(self, field: FieldSpec, beton: BetonFile, n: int) -> list:
        from ffcv.fields.bytes import BytesDecoder

        return [BytesDecoder()]

    def data_bytes(self, beton: BetonFile, info: FieldInfo) -> int:
        return int(beton.metadata[info.name]["size"].sum(dtype=np.uint64))

    def digest_column(self, beton: BetonFile, info: FieldInfo, positions: np.ndarray, meta: np.ndarray):
        """``<u8`` length, then the payload."""
        ptrs, sizes = meta["ptr"], meta["size"]
        beton.check_payloads_inside(ptrs, sizes, f"field '{info.name}'")
        lengths = np.ascontiguousarray(sizes, dtype="<u8").view(np.uint8).reshape(-1, 8)
        return lambda i, position, allocs: (lengths[i], beton.mm[int(ptrs[i]) : int(ptrs[i]) + int(sizes[i])])
