"""The strict per-field sample contract, checked BEFORE a value reaches ffcv.

ffcv silently stores wrong data for many inputs (int32 into a float32 field, a short tuple, an
empty bytes value...). Every check here turns such a value into a ``SampleError`` naming the
dataset, the field and the source index; nothing is coerced silently. The few explicit
conversions (``image_mode: convert``, ``json_numpy: convert``, bytes objects -> uint8 arrays,
non-contiguous -> contiguous) change representation, never values.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from betonbuild.config.spec import DatasetSpec, FieldSpec
from betonbuild.errors import SampleError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_IMAGE_SIDE = 65535  # ffcv stores width and height as <u2


def describe(value: Any) -> str:
    """A short summary of a value for error messages: type, dtype, shape, or a clipped repr."""
    if isinstance(value, np.ndarray):
        return f"numpy array dtype={value.dtype} shape={value.shape}"
    if type(value).__module__ == "torch" and hasattr(value, "shape"):
        return f"torch tensor dtype={value.dtype} shape={tuple(value.shape)} device={value.device}"
    if type(value).__module__.startswith("PIL."):
        return f"PIL image mode={value.mode} size={value.size}"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def sample_to_tuple(spec: DatasetSpec, sample: Any, index: int) -> tuple:
    """Map one source sample onto the field order: tuples by position, dicts by name (never by iteration)."""
    names = spec.field_names
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
    values = sample_to_tuple(spec, sample, index)
    return tuple(check_value(spec.name, f, v, index) for f, v in zip(spec.fields, values))


def check_value(dataset: str, field: FieldSpec, value: Any, index: int) -> Any:
    def fail(why: str, fix: str = "") -> SampleError:
        return SampleError(dataset, field.name, index, why, fix)

    return _CHECKS[field.type](field, value, fail)


def _check_int(field: FieldSpec, value: Any, fail: Callable[..., SampleError]) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise fail(f"int field got {describe(value)}", "return a Python int or numpy integer")
    if not INT64_MIN <= int(value) <= INT64_MAX:
        raise fail(
            f"int value {int(value)} does not fit in int64",
            "store it as a float or json field, or scale it in the adapter",
        )
    return int(value)


def _check_float(field: FieldSpec, value: Any, fail: Callable[..., SampleError]) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise fail(f"float field got {describe(value)}", "return a Python float or numpy floating value")
    try:
        return float(value)
    except OverflowError:
        raise fail(
            f"value {describe(value)} is too large for a float64",
            "scale it in the adapter, or store it as a json field (a string)",
        ) from None


def _check_ndarray(field: FieldSpec, value: Any, fail: Callable[..., SampleError]) -> np.ndarray:
    want_dtype, want_shape = np.dtype(field.options["dtype"]), tuple(field.options["shape"])
    if not isinstance(value, np.ndarray):
        raise fail(
            f"ndarray field got {describe(value)}",
            f"return np.asarray(value, dtype='{want_dtype}') with shape {want_shape}",
        )
    _check_array_layout(value, want_dtype, want_shape, fail)
    return np.ascontiguousarray(value)


def _check_array_layout(value: np.ndarray, want_dtype: np.dtype, want_shape: tuple, fail) -> None:
    if value.dtype != want_dtype:
        if value.dtype.newbyteorder("=") == want_dtype.newbyteorder("="):
            raise fail(
                f"array is {value.dtype.str} (non-native byte order); the field stores {want_dtype.str}",
                "convert with value.astype(value.dtype.newbyteorder('='))",
            )
        raise fail(
            f"dtype {value.dtype} does not match the field's {want_dtype} (shape {value.shape}); "
            "ffcv checks only the byte count and would store it wrongly",
            f"convert explicitly in your dataset (value.astype('{want_dtype}')) or change the field's dtype",
        )
    if value.shape != want_shape:
        raise fail(
            f"shape {value.shape} does not match the field's {want_shape}",
            "reshape in your dataset or change the field's shape",
        )


def _check_torch_tensor(field: FieldSpec, value: Any, fail: Callable[..., SampleError]):
    import torch

    if not isinstance(value, torch.Tensor):
        raise fail(f"torch_tensor field got {describe(value)}", "return a torch.Tensor")
    if value.device.type != "cpu":
        raise fail(f"tensor is on {value.device}", "return value.cpu() from your dataset's __getitem__")
    if value.requires_grad:
        raise fail("tensor requires grad", "return value.detach() from your dataset's __getitem__")
    want = getattr(torch, field.options["dtype"])
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


def _check_rgb_image(field: FieldSpec, value: Any, fail: Callable[..., SampleError]) -> np.ndarray:
    from PIL import Image

    convert = field.options.get("image_mode") == "convert"
    convert_hint = "add `image_mode: convert` to the field to convert with PIL .convert('RGB')"
    if isinstance(value, Image.Image):
        if value.mode != "RGB":
            if not convert:
                raise fail(f"PIL image has mode {value.mode}, not RGB", convert_hint)
            value = value.convert("RGB")
        value = np.asarray(value)
    elif isinstance(value, np.ndarray):
        if value.dtype != np.uint8:
            raise fail(f"image is {describe(value)}; RGB images are uint8", "convert to uint8 HxWx3 in your dataset")
        if value.ndim == 3 and value.shape[0] == 3 and value.shape[2] != 3:
            raise fail(f"image is {describe(value)}, which looks channels-first (CHW)", "use value.transpose(1, 2, 0)")
        if value.ndim != 3 or value.shape[2] != 3:
            channels = 1 if value.ndim == 2 else value.shape[2] if value.ndim == 3 else None
            if not convert or channels not in (1, 4):
                raise fail(
                    f"image is {describe(value)}; expected HxWx3 RGB",
                    convert_hint if channels in (1, 4) else "reduce it to 3 channels (RGB) in the adapter",
                )
            # HxW / HxWx1 are grey (mode L), HxWx4 is RGBA: the conversions PIL's .convert("RGB") defines.
            value = np.asarray(
                Image.fromarray(value.reshape(value.shape[:2]) if channels == 1 else value).convert("RGB")
            )
    elif type(value).__module__ == "torch":
        raise fail(
            f"image is a {describe(value)}",
            "return a uint8 HxWx3 numpy array (e.g. tensor.permute(1, 2, 0).numpy()) or a PIL RGB image",
        )
    else:
        raise fail(f"rgb_image field got {describe(value)}", "return a uint8 HxWx3 numpy array or a PIL RGB image")
    height, width = value.shape[:2]
    if not (1 <= height <= MAX_IMAGE_SIDE and 1 <= width <= MAX_IMAGE_SIDE):
        raise fail(
            f"image is {width}x{height}; each side must be 1..{MAX_IMAGE_SIDE} pixels",
            "skip or resize such images in the adapter, or set the field's max_resolution",
        )
    max_resolution = field.options.get("max_resolution")
    if max_resolution and max(height, width) > max_resolution:
        ratio = max_resolution / max(height, width)
        if int(ratio * height) < 1 or int(ratio * width) < 1:
            raise fail(
                f"image {width}x{height} would be resized to zero pixels by max_resolution {max_resolution}",
                "raise max_resolution, or pad or skip such thin images in the adapter",
            )
    return np.ascontiguousarray(value)


def _check_bytes(field: FieldSpec, value: Any, fail: Callable[..., SampleError]) -> np.ndarray:
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = np.frombuffer(bytes(value), dtype=np.uint8)
    elif not isinstance(value, np.ndarray):
        raise fail(f"bytes field got {describe(value)}", "return bytes or a 1-D uint8 numpy array")
    if value.dtype != np.uint8 or value.ndim != 1:
        raise fail(
            f"bytes field got {describe(value)}; ffcv would cast every value to one byte",
            "return a 1-D uint8 array (e.g. np.frombuffer(data, dtype=np.uint8))",
        )
    if value.size == 0 and not field.options.get("allow_empty"):
        raise fail(
            "value is empty; ffcv stores a size-0 allocation whose pointer collides with the next one, "
            "and its Loader then returns corrupted data for this sample's following field",
            "store at least one byte (e.g. a length prefix or terminator)",
        )
    return np.ascontiguousarray(value)


def _check_json(field: FieldSpec, value: Any, fail: Callable[..., SampleError]) -> Any:
    if field.options.get("json_numpy") == "convert":
        value = _numpy_to_python(value)
    problem = _json_problem(value, "value")
    if problem:
        raise fail(problem, "return plain Python values (use .item()/.tolist()), or set `json_numpy: convert`")
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise fail(
            f"value is not JSON-encodable: {exc}",
            "return dicts, lists, str, int, float, bool or None (no sets, bytes or objects)",
        ) from None
    return value


def _json_problem(value: Any, where: str) -> str | None:
    """Finds what json.dumps would reject or silently change (numpy values, NaN, non-str keys)."""
    if isinstance(value, (np.generic, np.ndarray)) and not isinstance(value, str):
        return f"{where} is a {describe(value)}; JSON needs plain Python values"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where} is {value}, which JSON cannot represent"
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{where} has key {key!r} of type {type(key).__name__}; JSON would turn it into a string"
            problem = _json_problem(item, f"{where}[{key!r}]")
            if problem:
                return problem
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            problem = _json_problem(item, f"{where}[{i}]")
            if problem:
                return problem
    return None


def _numpy_to_python(value: Any) -> Any:
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _numpy_to_python(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_numpy_to_python(v) for v in value]
    return value


def _check_custom(field: FieldSpec, value: Any, fail: Callable[..., SampleError]) -> Any:
    """Custom values pass through as they are; only their encode must not fail (it would kill ffcv's worker)."""
    from betonbuild.fields.custom import encode_problem

    problem = encode_problem(field, value)
    if problem:
        raise fail(problem, "return a value the class's encode accepts, or fix the class")
    return value


_CHECKS = {
    "int": _check_int,
    "float": _check_float,
    "ndarray": _check_ndarray,
    "torch_tensor": _check_torch_tensor,
    "rgb_image": _check_rgb_image,
    "bytes": _check_bytes,
    "json": _check_json,
    "custom": _check_custom,
}
