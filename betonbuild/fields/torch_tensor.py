"""``type: torch_tensor``: a CPU torch tensor of one dtype and shape per field, stored as ndarray's payload."""

from __future__ import annotations

from typing import Any

import numpy as np

from betonbuild.config.spec import FieldSpec
from betonbuild.errors import ConfigError
from betonbuild.fields.fixed import ArrayKind, bool_as_byte_dtype
from betonbuild.fields.kind import Fail, describe

TORCH_DTYPES = ("float16", "float32", "float64", "uint8", "int8", "int16", "int32", "int64", "bool")


def torch_dtype(name: str):
    import torch

    return getattr(torch, name)


class TorchTensorKind(ArrayKind):
    name = "torch_tensor"

    def normalise_dtype(self, where: str, options: dict[str, Any]) -> dict[str, Any]:
        if options["dtype"] not in TORCH_DTYPES:
            raise ConfigError(f"{where}.dtype", f"{options['dtype']!r} is not one of {', '.join(TORCH_DTYPES)}")
        return options

    def sample_dtype(self, field: FieldSpec) -> np.dtype:
        return np.dtype(field.options["dtype"]) if field.options["dtype"] != "bool" else np.dtype(bool)

    def build(self, field: FieldSpec):
        from ffcv.fields import TorchTensorField

        return TorchTensorField(dtype=torch_dtype(field.options["dtype"]), shape=tuple(field.options["shape"]))

    def check(self, field: FieldSpec, value: Any, fail: Fail):
        import torch

        if not isinstance(value, torch.Tensor):
            raise fail(f"torch_tensor field got {describe(value)}", "return a torch.Tensor")
        if value.device.type != "cpu":
            raise fail(f"tensor is on {value.device}", "return value.cpu() from your dataset's __getitem__")
        if value.requires_grad:
            raise fail("tensor requires grad", "return value.detach() from your dataset's __getitem__")
        want = getattr(torch, field.options["dtype"])
        if value.dtype == torch.bool and bool_as_byte_dtype(np.dtype(bool), self.sample_dtype(field)):
            value = value.to(want)  # False/True become 0/1: the same values and bytes
        if value.dtype != want:
            raise fail(
                f"dtype {value.dtype} does not match the field's {want} (shape {tuple(value.shape)})",
                f"convert explicitly in your dataset (value.to({want})) or change the field's dtype",
            )
        if tuple(value.shape) != tuple(field.options["shape"]):
            raise fail(
                f"shape {tuple(value.shape)} does not match the field's {tuple(field.options['shape'])}",
                "reshape in your dataset or change the field's shape",
            )
        return value.contiguous()

    def compare_needs_ffcv(self, field: FieldSpec) -> bool:
        return True  # its values are torch tensors


KIND = TorchTensorKind()
