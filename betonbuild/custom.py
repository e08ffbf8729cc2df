"""Custom field classes that ship with betonbuild, for configs to name (``class: "betonbuild.custom:..."``).

The machinery that builds, checks and compares any custom field lives in ``betonbuild.fields.custom``;
this module holds only classes, so that the class path in a user's config never changes.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from betonbuild.fields.custom import ARGUMENT_BYTES


class FixedUTF8Field:
    """A UTF-8 string of at most ``width`` bytes, stored in the metadata record itself (no allocation).

    Config: ``title: {type: custom, class: "betonbuild.custom:FixedUTF8Field", args: {width: 32}}``.
    Values are ``str`` without NUL characters. The Loader yields a (batch, width) uint8 array;
    ``FixedUTF8Field.to_str(row)`` turns a row back into the string. Because nothing is allocated,
    files with this field can be merged like files with only built-in fields.
    """

    betonbuild_pointer_columns = ()  # no file offsets in the record: betonbuild.beton.merge may join such files

    def __init__(self, width: int = 32):
        if not isinstance(width, int) or isinstance(width, bool) or not 1 <= width <= 4096:
            raise ValueError(f"width must be an integer in [1, 4096], not {width!r}")
        self.width = width

    @property
    def metadata_type(self) -> np.dtype:
        return np.dtype(("<u1", (self.width,)))

    @staticmethod
    def from_binary(binary) -> FixedUTF8Field:
        data = np.asarray(binary).view(np.uint8).reshape(-1)
        return FixedUTF8Field(int(data[:8].view("<u8")[0]))

    def to_binary(self):
        result = np.zeros(1, dtype=np.dtype([("", "<u1", ARGUMENT_BYTES)]))[0]  # as ffcv's fields return it
        result[0][:8] = np.frombuffer(np.uint64(self.width).astype("<u8").tobytes(), dtype=np.uint8)
        return result

    def encode(self, destination, value, malloc):
        if not isinstance(value, str):
            raise TypeError(f"expected a str, got {type(value).__name__}")
        if "\0" in value:
            raise ValueError("the string contains a NUL character, which marks its end when stored")
        data = value.encode("utf-8")
        if len(data) > self.width:
            raise ValueError(f"{value[:20]!r}... is {len(data)} UTF-8 bytes; the field holds {self.width}")
        destination[0] = np.frombuffer(data.ljust(self.width, b"\0"), dtype=np.uint8)

    def get_decoder_class(self):
        return _fixed_utf8_decoder()

    @staticmethod
    def to_str(row) -> str:
        return bytes(np.asarray(row, dtype=np.uint8)).rstrip(b"\0").decode("utf-8")

    def decode(self, record, payloads) -> str:
        return self.to_str(record)

    def from_loader(self, item) -> str:
        return self.to_str(item)


@lru_cache(maxsize=1)
def _fixed_utf8_decoder():
    """The Loader's decoder: copies each sample's record into a (batch, width) uint8 array."""
    from dataclasses import replace

    from ffcv.pipeline.allocation_query import AllocationQuery
    from ffcv.pipeline.operation import Operation

    class FixedUTF8Decoder(Operation):
        def declare_state_and_memory(self, previous_state):
            shape = (self.field.width,)
            return (
                replace(previous_state, jit_mode=True, shape=shape, dtype=np.dtype("<u1")),
                AllocationQuery(shape, dtype=np.dtype("<u1")),
            )

        def generate_code(self):
            def decode(indices, destination, metadata, storage_state):
                for ix in range(indices.shape[0]):
                    destination[ix] = metadata[indices[ix]]
                return destination[: indices.shape[0]]

            return decode

    return FixedUTF8Decoder
