"""The ffcv field class of ``gray_image``: a single-channel uint8 image, stored raw or as a
greyscale JPEG (ffcv's RGBImageField stores only 3 channels).

Record: ``mode u1`` (0 JPEG, 1 raw, as ffcv's images), ``ptr <u8``, ``size <u8``, ``shape <u4[2]``
(height, width). The Loader decodes (``betonbuild.fields.decoders.gray_decoder``) to a
(batch, H, W, 1) uint8 batch padded with zeros to the file's largest height and width; with one
image size in the file that is every image exactly. ``<name>_shape`` gives (height, width).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from betonbuild.beton.format import IMAGE_MODE_JPEG, IMAGE_MODE_RAW
from betonbuild.fields.builtin_encoders import ffcv_resizer
from betonbuild.fields.gray_jpeg import decode_gray_jpeg
from betonbuild.fields.shipped import arguments_record, parse_arguments


class GrayImageField:
    """``gray_image``: a uint8 HxW image (PIL mode L, or an HxWx1 array), stored as ``write_mode`` says."""

    betonbuild_kind = "gray_image"
    betonbuild_pointer_columns = ("ptr",)
    ndim = 2  # the shape record: (height, width)

    def __init__(
        self,
        write_mode: str = "raw",
        max_resolution: int | None = None,
        smart_threshold: int | None = None,
        jpeg_quality: int = 90,
        compress_probability: float = 0.5,
    ):
        if write_mode not in ("raw", "jpg", "smart", "proportion"):
            raise ValueError(f"write_mode {write_mode!r} is not raw, jpg, smart or proportion")
        self.write_mode, self.max_resolution, self.smart_threshold = write_mode, max_resolution, smart_threshold
        self.jpeg_quality, self.compress_probability = int(jpeg_quality), float(compress_probability)

    def arguments(self) -> dict[str, Any]:
        return {
            "write_mode": self.write_mode,
            "max_resolution": self.max_resolution,
            "smart_threshold": self.smart_threshold,
            "jpeg_quality": self.jpeg_quality,
            "compress_probability": self.compress_probability,
        }

    @property
    def metadata_type(self) -> np.dtype:
        return np.dtype([("mode", "u1"), ("ptr", "<u8"), ("size", "<u8"), ("shape", "<u4", (2,))], align=True)

    @classmethod
    def from_binary(cls, binary):
        return cls(**parse_arguments(binary, cls.betonbuild_kind))

    def to_binary(self):
        return arguments_record(self.betonbuild_kind, self.arguments())

    def stored_mode(self, image: np.ndarray) -> int:
        if self.write_mode == "jpg":
            return IMAGE_MODE_JPEG
        if self.write_mode == "smart":
            large = self.smart_threshold is not None and image.size > self.smart_threshold
            return IMAGE_MODE_JPEG if large else IMAGE_MODE_RAW
        if self.write_mode == "proportion":  # as ffcv's RGBImageField: numpy's global RNG
            return IMAGE_MODE_JPEG if np.random.rand() < self.compress_probability else IMAGE_MODE_RAW
        return IMAGE_MODE_RAW

    def encode(self, destination, image, malloc) -> None:
        import cv2

        image = np.asarray(image)
        if image.ndim == 3 and image.shape[2] == 1:
            image = image[:, :, 0]
        if image.dtype != np.uint8 or image.ndim != 2:
            raise ValueError(f"expected a uint8 HxW image, got {image.dtype} {image.shape}")
        image = np.ascontiguousarray(ffcv_resizer(image, self.max_resolution))
        mode = self.stored_mode(image)
        if mode == IMAGE_MODE_JPEG:
            ok, data = cv2.imencode(".jpg", image, [int(cv2.IMWRITE_JPEG_QUALITY), self.jpeg_quality])
            if not ok:
                raise ValueError("cv2 could not encode the image as JPEG")
            data = data.reshape(-1)
        else:
            data = image.reshape(-1)
        ptr, region = malloc(data.size)
        region[:] = data
        destination["mode"] = mode
        destination["ptr"] = ptr
        destination["size"] = data.size
        destination["shape"] = image.shape

    def decode(self, record, payloads) -> np.ndarray:
        """The stored image, HxWx1 uint8, decoded as the Loader decodes it."""
        height, width = (int(s) for s in np.asarray(record["shape"]).reshape(-1))
        data = np.asarray(payloads[0], dtype=np.uint8)
        if int(record["mode"]) == IMAGE_MODE_JPEG:
            return decode_gray_jpeg(data, height, width)
        if int(record["mode"]) != IMAGE_MODE_RAW or data.size != height * width:
            raise ValueError(f"mode {int(record['mode'])} payload of {data.size} bytes for {width}x{height}")
        return data.reshape(height, width, 1).copy()

    def loader_item_equal(self, item: np.ndarray, stored: np.ndarray) -> bool:
        item = np.asarray(item)
        h, w = stored.shape[:2]
        if item.ndim != 3 or item.shape[0] < h or item.shape[1] < w:
            return False
        rest = item.copy()
        rest[:h, :w] = 0
        return np.array_equal(item[:h, :w], stored) and not rest.any()

    def get_decoder_class(self):
        from betonbuild.fields import decoders  # why local: it imports ffcv (torch) on first use

        return decoders.gray_decoder()

    def extra_outputs(self, name: str) -> dict[str, Any]:
        from betonbuild.fields import decoders  # why local: it imports ffcv (torch) on first use

        return {f"{name}_shape": decoders.shape_decoder()()}
