"""ffcv Loader decoders of betonbuild's shipped kinds, compiled by ffcv's own ``Compiler`` (numba).

Each factory imports ffcv on first use and returns one ``Operation`` class (cached), written as
ffcv's ``NDArrayDecoder``/``BytesDecoder`` are: ``declare_state_and_memory`` sizes the batch from
the file's metadata (the largest shape in the whole file, so every batch has the same shape),
``generate_code`` returns a function the pipeline compiles, parallel over the batch.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np

from betonbuild.fields.gray_jpeg import TJFLAG_FASTDCT, TJPF_GRAY, tj_decompress


def padded_shape(metadata: np.ndarray, ndim: int) -> tuple[int, ...]:
    """The largest size of each dimension over every sample of the file."""
    if len(metadata) == 0:
        return (0,) * ndim
    return tuple(int(s) for s in np.asarray(metadata["shape"]).reshape(len(metadata), ndim).max(axis=0))


@lru_cache(maxsize=1)
def ragged_decoder() -> type:
    """Every sample's array copied into a batch zero-padded to ``padded_shape``."""
    from ffcv.pipeline.allocation_query import AllocationQuery
    from ffcv.pipeline.compiler import Compiler
    from ffcv.pipeline.operation import Operation

    class RaggedDecoder(Operation):
        def declare_state_and_memory(self, previous_state):
            shape, dtype = padded_shape(self.metadata, self.field.ndim), self.field.dtype
            return replace(previous_state, jit_mode=True, shape=shape, dtype=dtype), AllocationQuery(shape, dtype)

        def generate_code(self):
            mem_read, my_range = self.memory_read, Compiler.get_iterator()
            ndim, itemsize = self.field.ndim, self.field.dtype.itemsize
            padded = np.array(padded_shape(self.metadata, ndim), dtype=np.int64)

            def decode(indices, destination, metadata, storage_state):
                for ix in my_range(indices.shape[0]):
                    record = metadata[indices[ix]]
                    out = destination[ix].reshape(-1).view(np.uint8)
                    size = np.int64(record["size"])
                    if ndim == 1:
                        out[size:] = 0  # only the padding: the copy below fills the rest
                    else:
                        out[:] = 0
                    if size == 0:
                        continue
                    data = mem_read(record["ptr"], storage_state)
                    shape = record["shape"]
                    last = np.int64(shape[ndim - 1]) * itemsize
                    for row in range(size // last):
                        rest, offset, stride = row, np.int64(0), padded[ndim - 1]
                        for d in range(ndim - 2, -1, -1):
                            extent = np.int64(shape[d])
                            offset += (rest % extent) * stride
                            rest //= extent
                            stride *= padded[d]
                        start = offset * itemsize
                        out[start : start + last] = data[row * last : (row + 1) * last]
                return destination[: indices.shape[0]]

            decode.is_parallel = True
            return decode

    return RaggedDecoder


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
