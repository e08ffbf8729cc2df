"""A centre-crop decoder for ``gray_image``, as ffcv's ``CenterCropRGBImageDecoder`` is for RGB:
the square of side ``ratio * min(height, width)`` at the image's centre, resized to
``output_size``, as a (batch, H, W, 1) uint8 batch::

    from ffcv.transforms import ToTensor
    from betonbuild.fields.gray_crop import center_crop_decoder

    pipelines = {"scan": [center_crop_decoder((224, 224)), ToTensor()]}

ffcv's C resize assumes 3 channels, so the resize is an area average compiled by numba (each
output pixel the mean of the source area it covers, fractional edges weighted: OpenCV's
INTER_AREA when shrinking); the crop is ffcv's ``get_center_crop``.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np

from betonbuild.fields.decoders import gray_decoder, padded_shape
from betonbuild.fields.gray_jpeg import TJFLAG_FASTDCT, TJPF_GRAY, tj_decompress

DEFAULT_CROP_RATIO = 224 / 256  # ffcv's own default (ffcv.fields.rgb_image.DEFAULT_CROP_RATIO)


def center_crop_decoder(output_size: tuple[int, int], ratio: float = DEFAULT_CROP_RATIO):
    """The Loader operation: ``pipelines={name: [center_crop_decoder((h, w)), ToTensor()]}``."""
    height, width = (int(s) for s in output_size)
    if height < 1 or width < 1 or not 0 < ratio <= 1:
        raise ValueError(f"output_size {output_size} needs two sides >= 1 and ratio {ratio} to be in (0, 1]")
    return _decoder_class()((height, width), float(ratio))


def area_resize(source, stride, top, left, crop_h, crop_w, out, out_h, out_w) -> None:
    """``source[top:top+crop_h, left:left+crop_w]`` (flat, rows ``stride`` apart) into the flat
    ``out`` of ``out_h`` x ``out_w``: each pixel the mean of the source area it covers."""
    scale_y, scale_x = crop_h / out_h, crop_w / out_w
    for y in range(out_h):
        y0, y1 = y * scale_y, (y + 1) * scale_y
        for x in range(out_w):
            x0, x1 = x * scale_x, (x + 1) * scale_x
            total, area = 0.0, 0.0
            for yy in range(int(y0), min(int(np.ceil(y1)), crop_h)):
                wy = min(y1, yy + 1.0) - max(y0, float(yy))
                row = (top + yy) * stride + left
                for xx in range(int(x0), min(int(np.ceil(x1)), crop_w)):
                    weight = wy * (min(x1, xx + 1.0) - max(x0, float(xx)))
                    total += weight * source[row + xx]
                    area += weight
            out[y * out_w + x] = np.uint8(min(255.0, total / area + 0.5))


@lru_cache(maxsize=1)
def _decoder_class() -> type:
    import numba
    from ffcv.fields.rgb_image import get_center_crop
    from ffcv.pipeline.allocation_query import AllocationQuery
    from ffcv.pipeline.compiler import Compiler

    # a subclass of the field's default decoder: ffcv takes a pipeline's first operation as its
    # decoder only then (PipelineSpec.accept_decoder), as its RGB decoders subclass SimpleRGBImageDecoder
    class GrayCenterCropDecoder(gray_decoder()):
        def __init__(self, output_size: tuple[int, int], ratio: float):
            super().__init__()
            self.output_size, self.ratio = output_size, ratio

        def declare_state_and_memory(self, previous_state):
            shape, dtype = (*self.output_size, 1), np.dtype("u1")
            height, width = padded_shape(self.metadata, 2)
            scratch = AllocationQuery((max(height * width, 1),), dtype)  # one decoded JPEG per batch row
            return replace(previous_state, jit_mode=True, shape=shape, dtype=dtype), (
                AllocationQuery(shape, dtype),
                scratch,
            )

        def generate_code(self):
            mem_read, my_range = self.memory_read, Compiler.get_iterator()
            resize, crop = Compiler.compile(area_resize), Compiler.compile(get_center_crop)
            lib, decompress = tj_decompress()
            # one decompressor per thread of numba's pool, this Loader's own (freed with the process)
            self.handles = handles = np.array(
                [lib.tjInitDecompress() for _ in range(numba.config.NUMBA_NUM_THREADS)], dtype=np.uint64
            )
            (out_h, out_w), ratio = self.output_size, self.ratio

            def decode(indices, storage, metadata, storage_state):
                destination, scratch = storage
                for ix in my_range(indices.shape[0]):
                    record = metadata[indices[ix]]
                    height, width = np.int64(record["shape"][0]), np.int64(record["shape"][1])
                    data = mem_read(record["ptr"], storage_state)
                    pixels = data
                    if record["mode"] == 0:
                        pixels = scratch[ix]
                        decompress(
                            handles[numba.get_thread_id()],
                            data.ctypes.data,
                            data.size,
                            pixels.ctypes.data,
                            width,
                            width,
                            height,
                            TJPF_GRAY,
                            TJFLAG_FASTDCT,
                        )
                    top, left, side, _ = crop(height, width, None, ratio)
                    side = max(side, 1)
                    resize(pixels, width, top, left, side, side, destination[ix].reshape(-1), out_h, out_w)
                return destination[: indices.shape[0]]

            decode.is_parallel = True
            return decode

    return GrayCenterCropDecoder
