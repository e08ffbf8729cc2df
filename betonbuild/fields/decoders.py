"""ffcv Loader decoders of betonbuild's shipped kinds, compiled by ffcv's own ``Compiler`` (numba).

Each factory imports ffcv on first use and returns one ``Operation`` class (cached), written as
ffcv's ``NDArrayDecoder``/``BytesDecoder`` are: ``declare_state_and_memory`` sizes the batch from
the file's metadata (the largest shape in the whole file, so every batch has the same shape),
``generate_code`` returns a function the pipeline compiles, parallel over the batch where a
sample costs enough to share the batch out (images, large ragged rows).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np

from betonbuild.fields.gray_jpeg import TJFLAG_FASTDCT, TJPF_GRAY, tj_decompress

PARALLEL_ROW_BYTES = 4096
"""From this padded row size on, ``ragged_decoder`` shares a batch out over the Loader's threads.
Measured with 2 threads, int32 rows padded to twice their mean, batch 256: serial 1.4x faster at
512 bytes, even at 2 KiB, parallel 1.3x faster at 8 KiB (benchmark 11's data at larger means)."""


def padded_shape(metadata: np.ndarray, ndim: int) -> tuple[int, ...]:
    """The largest size of each dimension over every sample of the file."""
    if len(metadata) == 0:
        return (0,) * ndim
    return tuple(int(s) for s in np.asarray(metadata["shape"]).reshape(len(metadata), ndim).max(axis=0))


@lru_cache(maxsize=1)
def ragged_decoder() -> type:
    """Every sample's array copied into a batch padded to ``padded_shape`` with the field's
    ``pad_value`` (0 unless an ``int_list`` sets it).

    Serial over the batch (as ffcv's ``NDArrayDecoder``) for padded rows under
    ``PARALLEL_ROW_BYTES``: there a numba parallel region per batch cost more than the copies it
    shares out. The payload goes in with ffcv's ``memcpy`` (a numba slice assignment copied byte by
    byte, through a temporary where it could not rule out overlap); only the padding is filled."""
    from ffcv.libffcv import memcpy
    from ffcv.pipeline.allocation_query import AllocationQuery
    from ffcv.pipeline.compiler import Compiler
    from ffcv.pipeline.operation import Operation

    class RaggedDecoder(Operation):
        def declare_state_and_memory(self, previous_state):
            shape, dtype = padded_shape(self.metadata, self.field.ndim), self.field.dtype
            return replace(previous_state, jit_mode=True, shape=shape, dtype=dtype), AllocationQuery(shape, dtype)

        def generate_code(self):
            mem_read, my_range, copy = self.memory_read, Compiler.get_iterator(), Compiler.compile(memcpy)
            fill = Compiler.compile(pad_filler(self.field.dtype, self.field.pad_value))
            ndim, itemsize = self.field.ndim, self.field.dtype.itemsize
            padded = np.array(padded_shape(self.metadata, ndim), dtype=np.int64)

            def decode(indices, destination, metadata, storage_state):
                for ix in my_range(indices.shape[0]):
                    record = metadata[indices[ix]]
                    out = destination[ix].reshape(-1).view(np.uint8)
                    shape = record["shape"]
                    # the sample's rows are contiguous in the padded row when all but its first
                    # dimension are the padded ones (always for ndim 1)
                    dense = True
                    for d in range(1, ndim):
                        dense = dense and np.int64(shape[d]) == padded[d]
                    size = min(np.int64(record["size"]), out.size)
                    if dense:
                        fill(out, size)
                    else:
                        fill(out, 0)
                    if size == 0:
                        continue
                    data = mem_read(record["ptr"], storage_state)
                    size = min(size, data.size)
                    if dense:
                        copy(data[:size], out[:size])
                        continue
                    last = np.int64(shape[ndim - 1]) * itemsize
                    for row in range(size // last):
                        rest, offset, stride = row, np.int64(0), padded[ndim - 1]
                        for d in range(ndim - 2, -1, -1):
                            extent = np.int64(shape[d])
                            offset += (rest % extent) * stride
                            rest //= extent
                            stride *= padded[d]
                        start = offset * itemsize
                        copy(data[row * last : (row + 1) * last], out[start : start + last])
                return destination[: indices.shape[0]]

            decode.is_parallel = int(np.prod(padded)) * itemsize >= PARALLEL_ROW_BYTES
            return decode

    return RaggedDecoder


def pad_filler(dtype: np.dtype, pad_value: int):
    """``fill(row_bytes, start)``: the padding of one decoded row, from byte ``start`` on (a whole
    element boundary) to its end. Zeros byte by byte (any dtype, float16 included); another pad
    value (integer dtypes: ``int_list``) through a view of the row's elements."""
    value_type = dtype.type
    if pad_value == 0:

        def fill_zero(out, start):
            out[start:] = 0

        return fill_zero

    pad = value_type(pad_value)

    def fill_value(out, start):
        out[start:].view(value_type)[:] = pad

    return fill_value


@lru_cache(maxsize=1)
def multi_hot_decoder() -> type:
    """``int_list`` with ``multi_hot: W``: a (batch, W) uint8 vector, 1 at every listed id."""
    from ffcv.pipeline.allocation_query import AllocationQuery
    from ffcv.pipeline.compiler import Compiler
    from ffcv.pipeline.operation import Operation

    class MultiHotDecoder(Operation):
        def declare_state_and_memory(self, previous_state):
            shape, dtype = (self.field.multi_hot,), np.dtype("u1")
            return replace(previous_state, jit_mode=True, shape=shape, dtype=dtype), AllocationQuery(shape, dtype)

        def generate_code(self):
            mem_read, my_range = self.memory_read, Compiler.get_iterator()
            value_type, width = self.field.dtype.type, self.field.multi_hot

            def decode(indices, destination, metadata, storage_state):
                for ix in my_range(indices.shape[0]):
                    record = metadata[indices[ix]]
                    out = destination[ix]
                    out[:] = 0
                    if record["size"] == 0:
                        continue
                    values = mem_read(record["ptr"], storage_state).view(value_type)
                    for k in range(values.shape[0]):
                        if 0 <= values[k] < width:  # the writer refused any other id
                            out[values[k]] = 1
                return destination[: indices.shape[0]]

            decode.is_parallel = True
            return decode

    return MultiHotDecoder


@lru_cache(maxsize=1)
def shape_decoder() -> type:
    """Each sample's shape, (batch, ndim) int64: the ``<name>_shape`` output."""
    from ffcv.pipeline.allocation_query import AllocationQuery
    from ffcv.pipeline.compiler import Compiler
    from ffcv.pipeline.operation import Operation

    class ShapeDecoder(Operation):
        def declare_state_and_memory(self, previous_state):
            shape, dtype = (self.field.ndim,), np.dtype("<i8")
            return replace(previous_state, jit_mode=True, shape=shape, dtype=dtype), AllocationQuery(shape, dtype)

        def generate_code(self):
            my_range, ndim = Compiler.get_iterator(), self.field.ndim

            def decode(indices, destination, metadata, storage_state):
                for ix in my_range(indices.shape[0]):
                    shape = metadata[indices[ix]]["shape"]
                    for d in range(ndim):
                        destination[ix, d] = shape[d]
                return destination[: indices.shape[0]]

            return decode

    return ShapeDecoder


@lru_cache(maxsize=1)
def length_decoder() -> type:
    """Each sample's length, (batch,) int64: ``<name>_len`` of ``int_list`` (elements), ``text``
    (UTF-8 bytes) and ``bytes`` (ffcv's own BytesField: its record's size)."""
    from ffcv.pipeline.allocation_query import AllocationQuery
    from ffcv.pipeline.compiler import Compiler
    from ffcv.pipeline.operation import Operation

    class LengthDecoder(Operation):
        def declare_state_and_memory(self, previous_state):
            shape, dtype = (), np.dtype("<i8")
            return replace(previous_state, jit_mode=True, shape=shape, dtype=dtype), AllocationQuery(shape, dtype)

        def generate_code(self):
            my_range = Compiler.get_iterator()

            def from_shape(indices, destination, metadata, storage_state):
                for ix in my_range(indices.shape[0]):
                    destination[ix] = metadata[indices[ix]]["shape"][0]
                return destination[: indices.shape[0]]

            def from_size(indices, destination, metadata, storage_state):
                for ix in my_range(indices.shape[0]):
                    destination[ix] = metadata[indices[ix]]["size"]
                return destination[: indices.shape[0]]

            return from_shape if "shape" in self.metadata.dtype.names else from_size

    return LengthDecoder


@lru_cache(maxsize=1)
def gray_decoder() -> type:
    """``gray_image``: (batch, H, W, 1) uint8, zero-padded to the file's largest height and width;
    JPEGs decoded by libturbojpeg straight to one channel (TJPF_GRAY), one handle per thread."""
    import numba
    from ffcv.pipeline.allocation_query import AllocationQuery
    from ffcv.pipeline.compiler import Compiler
    from ffcv.pipeline.operation import Operation

    class GrayDecoder(Operation):
        def declare_state_and_memory(self, previous_state):
            height, width = padded_shape(self.metadata, 2)
            shape, dtype = (height, width, 1), np.dtype("u1")
            return replace(previous_state, jit_mode=True, shape=shape, dtype=dtype), AllocationQuery(shape, dtype)

        def generate_code(self):
            mem_read, my_range = self.memory_read, Compiler.get_iterator()
            lib, decompress = tj_decompress()
            # one decompressor per thread of numba's pool, this Loader's own (freed with the process)
            self.handles = handles = np.array(
                [lib.tjInitDecompress() for _ in range(numba.config.NUMBA_NUM_THREADS)], dtype=np.uint64
            )
            max_height, max_width = padded_shape(self.metadata, 2)

            def decode(indices, destination, metadata, storage_state):
                for ix in my_range(indices.shape[0]):
                    record = metadata[indices[ix]]
                    height, width = np.int64(record["shape"][0]), np.int64(record["shape"][1])
                    out = destination[ix].reshape(-1)
                    if height != max_height or width != max_width:
                        out[:] = 0
                    data = mem_read(record["ptr"], storage_state)
                    if record["mode"] == 0:
                        decompress(
                            handles[numba.get_thread_id()],
                            data.ctypes.data,
                            data.size,
                            out.ctypes.data,
                            width,
                            max_width,
                            height,
                            TJPF_GRAY,
                            TJFLAG_FASTDCT,
                        )
                    elif width == max_width:
                        out[: height * width] = data
                    else:
                        for row in range(height):
                            out[row * max_width : row * max_width + width] = data[row * width : (row + 1) * width]
                return destination[: indices.shape[0]]

            decode.is_parallel = True
            return decode

    return GrayDecoder
