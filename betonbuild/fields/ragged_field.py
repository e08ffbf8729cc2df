"""The ffcv field classes of ``ragged_ndarray``, ``int_list`` and ``text``: one array per sample whose
shape varies, stored with its shape in the metadata record.

Record: ``ptr <u8``, ``size <u8`` (payload bytes), ``shape <u4[ndim]``. The payload is the array's
C-order bytes, little-endian. An empty value allocates one zero byte, its size 0: ffcv's size-0
allocation would collide with the next one (see ``betonbuild.fields.bytes``), and a pointer that is
an allocation stays one when ``betonbuild.beton.merge`` shifts the parts' pointers.

The Loader decodes (``betonbuild.fields.decoders``) to a batch padded with zeros (``int_list``:
its ``pad_value``) to the largest shape in the file, and a second output, ``<name>_shape`` (or
``<name>_len``), gives each sample's shape so a training loop can unpad:
``betonbuild.loader_pipelines(path)`` adds it. With ``multi_hot`` (``int_list`` only), the
default decoder gives a (batch, multi_hot) uint8 vector instead.

These classes import nothing of ffcv at module level: the writer and verification use them
without importing ffcv (torch).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from betonbuild.fields.shipped import arguments_record, parse_arguments

MAX_NDIM = 8


class RaggedArrayField:
    """An array of ``dtype`` with ``ndim`` dimensions of any size, at most ``max_elements`` elements
    (and, with ``max_shape``, at most that size in each dimension)."""

    betonbuild_kind = "ragged_ndarray"
    betonbuild_pointer_columns = ("ptr",)  # betonbuild.beton.merge shifts it when joining parts

    def __init__(
        self,
        dtype: str,
        ndim: int,
        max_elements: int,
        max_shape: list | None = None,
        multi_hot: int = 0,
        pad_value: int = 0,
    ):
        self.dtype = np.dtype(dtype)
        if self.dtype.hasobject or self.dtype.fields is not None or self.dtype.subdtype is not None:
            raise ValueError(f"dtype {dtype!r} is not a plain numeric dtype")
        if not isinstance(ndim, int) or not 1 <= ndim <= MAX_NDIM:
            raise ValueError(f"ndim must be 1..{MAX_NDIM}, not {ndim!r}")
        if max_shape is not None and len(max_shape) != ndim:
            raise ValueError(f"max_shape {max_shape} has {len(max_shape)} dimensions, ndim is {ndim}")
        self.ndim, self.max_elements, self.multi_hot = ndim, int(max_elements), int(multi_hot)
        self.max_shape = None if max_shape is None else [int(s) for s in max_shape]
        self.pad_value = int(pad_value)
        if self.pad_value and (self.dtype.kind not in "iu" or not self._fits(self.pad_value)):
            raise ValueError(f"pad_value {pad_value!r} is not a value of the integer dtype {self.dtype}")

    def _fits(self, value: int) -> bool:
        info = np.iinfo(self.dtype)
        return info.min <= value <= info.max

    def arguments(self) -> dict[str, Any]:
        args = {"dtype": self.dtype.str, "ndim": self.ndim, "max_elements": self.max_elements}
        if self.max_shape is not None:
            args["max_shape"] = self.max_shape
        if self.multi_hot:
            args["multi_hot"] = self.multi_hot
        if self.pad_value:  # only when set: files without it keep their arguments byte for byte
            args["pad_value"] = self.pad_value
        return args

    @property
    def metadata_type(self) -> np.dtype:
        return np.dtype([("ptr", "<u8"), ("size", "<u8"), ("shape", "<u4", (self.ndim,))], align=True)

    @classmethod
    def from_binary(cls, binary):
        return cls(**parse_arguments(binary, cls.betonbuild_kind))

    def to_binary(self):
        return arguments_record(self.betonbuild_kind, self.arguments())

    # --- writing ---------------------------------------------------------------------------------

    def as_array(self, value: Any) -> np.ndarray:
        """The value as the stored array (``TextField``: its UTF-8 bytes); ValueError if it does not fit."""
        array = np.asarray(value)
        if array.dtype != self.dtype or array.ndim != self.ndim:
            raise ValueError(f"expected {self.dtype} with {self.ndim} dimension(s), not {array.dtype} {array.shape}")
        if array.size > self.max_elements:
            raise ValueError(f"{array.size} elements; the field holds at most {self.max_elements}")
        return np.ascontiguousarray(array, dtype=self.dtype.newbyteorder("<"))

    def encode(self, destination, value, malloc) -> None:
        array = self.as_array(value)
        data = array.reshape(-1).view(np.uint8)
        ptr, region = malloc(max(data.size, 1))
        region[:] = 0
        region[: data.size] = data
        destination["ptr"] = ptr
        destination["size"] = data.size
        destination["shape"] = array.shape

    # --- reading ---------------------------------------------------------------------------------

    def decode(self, record, payloads) -> np.ndarray:
        """The stored array, from its record and payload (betonbuild's memmap reader)."""
        shape = tuple(int(s) for s in np.asarray(record["shape"]).reshape(-1))
        size = int(record["size"])
        if size != math.prod(shape) * self.dtype.itemsize:
            raise ValueError(f"payload of {size} bytes for shape {shape} of {self.dtype}")
        data = np.asarray(payloads[0], dtype=np.uint8)[:size] if payloads else np.zeros(0, np.uint8)
        if data.size != size:
            raise ValueError(f"payload of {data.size} bytes, the record says {size}")
        return np.frombuffer(data.tobytes(), dtype=self.dtype).reshape(shape)

    def loader_item_equal(self, item: np.ndarray, stored: np.ndarray) -> bool:
        """Whether a row of the default decoder's batch is ``stored``, padded with ``pad_value``
        (or its multi-hot)."""
        item = np.asarray(item)
        if self.multi_hot:
            want = np.zeros(self.multi_hot, np.uint8)
            want[stored.astype(np.int64)] = 1
            return np.array_equal(item, want)
        if item.ndim != stored.ndim or any(i < s for i, s in zip(item.shape, stored.shape)):
            return False
        region = tuple(slice(0, s) for s in stored.shape)
        rest = item.copy()
        rest[region] = self.pad_value
        return np.array_equal(item[region], stored) and bool((rest == self.pad_value).all())

    def get_decoder_class(self):
        from betonbuild.fields import decoders  # why local: it imports ffcv (torch) on first use

        return decoders.multi_hot_decoder() if self.multi_hot else decoders.ragged_decoder()

    def extra_outputs(self, name: str) -> dict[str, Any]:
        """The Loader outputs beside the padded batch: each sample's shape (``betonbuild.loader_pipelines``)."""
        from betonbuild.fields import decoders  # why local: it imports ffcv (torch) on first use

        return {f"{name}_shape": decoders.shape_decoder()()}


class IntListField(RaggedArrayField):
    """``int_list``: a 1-D list of integers (labels, token ids); ``<name>_len`` gives the lengths."""

    betonbuild_kind = "int_list"

    def extra_outputs(self, name: str) -> dict[str, Any]:
        from betonbuild.fields import decoders  # why local: it imports ffcv (torch) on first use

        return {f"{name}_len": decoders.length_decoder()()}


class TextField(RaggedArrayField):
    """``text``: a ``str`` stored as its UTF-8 bytes, exactly (NUL characters included, no padding);
    the Loader gives the zero-padded bytes and ``<name>_len``; ``betonbuild.texts(batch, lengths)``."""

    betonbuild_kind = "text"

    def __init__(self, max_bytes: int):
        super().__init__("|u1", 1, int(max_bytes))
        self.max_bytes = int(max_bytes)

    def arguments(self) -> dict[str, Any]:
        return {"max_bytes": self.max_bytes}

    def as_array(self, value: Any) -> np.ndarray:
        if not isinstance(value, str):
            raise ValueError(f"expected a str, got {type(value).__name__}")
        data = value.encode("utf-8")  # a lone surrogate raises UnicodeEncodeError, a ValueError
        if len(data) > self.max_bytes:
            raise ValueError(f"{len(data)} UTF-8 bytes; the field holds at most {self.max_bytes}")
        return np.frombuffer(data, dtype=np.uint8)

    def decode(self, record, payloads) -> str:
        return super().decode(record, payloads).tobytes().decode("utf-8")

    def loader_item_equal(self, item: np.ndarray, stored: str) -> bool:
        return super().loader_item_equal(item, np.frombuffer(stored.encode("utf-8"), dtype=np.uint8))

    def extra_outputs(self, name: str) -> dict[str, Any]:
        from betonbuild.fields import decoders  # why local: it imports ffcv (torch) on first use

        return {f"{name}_len": decoders.length_decoder()()}
