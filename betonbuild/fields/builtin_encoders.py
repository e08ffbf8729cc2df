"""The writing half of ffcv 1.0.2's built-in fields (``IntField``, ``FloatField``, ``NDArrayField``,
``BytesField``, ``JSONField``, ``RGBImageField``): metadata record type, descriptor type id and
arguments, and ``encode``, the same numpy and cv2 operations in the same order, so a file written
with them is byte for byte the file ffcv's fields write (tests/unit/fields/test_builtin_encoders.py
compares each with ffcv's on the same values). One step differs in how, not in what: the JPEG bytes
of an RGB image come from libturbojpeg straight from its RGB pixels where each process has proven
them equal to ``cv2.imencode``'s of the BGR copy ffcv makes (``betonbuild._compat.turbojpeg_encode``).

Why not ffcv's classes: importing any of them imports the ffcv package, and with it torch and
numba, 2-3 s of one core before a write job's first sample (docs/performance.md), for code that is
a few numpy assignments and a JPEG encode. Reading stays ffcv's: these classes have no
decoders, and the file's type ids name ffcv's own classes for its Loader. ``torch_tensor`` and
``type: custom`` fields are still written by ffcv's classes (their values or classes are torch's
and ffcv's anyway).
"""

from __future__ import annotations

import json

import numpy as np

from betonbuild._compat.turbojpeg_encode import encode_jpeg, prove
from betonbuild.beton.format import (
    BYTES_TYPE_ID,
    FLOAT_TYPE_ID,
    IMAGE_MODE_JPEG,
    IMAGE_MODE_RAW,
    INT_TYPE_ID,
    JSON_TYPE_ID,
    METADATA_TYPES,
    NDARRAY_ARGS_TYPE,
    NDARRAY_TYPE_ID,
    RGB_IMAGE_TYPE_ID,
)

ARGUMENTS_TYPE = np.dtype([("", "<u1", 1024)])  # ffcv.fields.base.ARG_TYPE: a descriptor's argument slot
IMAGE_MODES = {"jpg": IMAGE_MODE_JPEG, "raw": IMAGE_MODE_RAW}  # ffcv.fields.rgb_image.IMAGE_MODES


def no_arguments():
    """The zeroed argument slot of a field without arguments (ffcv's ``to_binary`` of most fields)."""
    return np.zeros(1, dtype=ARGUMENTS_TYPE)[0]


class BuiltinEncoder:
    """One built-in field's writing half: its type id and ``metadata_type`` from the format's table."""

    betonbuild_type_id: int = -1  # the ffcv class it writes as (``betonbuild.beton.descriptors``)

    @property
    def metadata_type(self) -> np.dtype:
        return METADATA_TYPES[self.betonbuild_type_id]

    def to_binary(self):
        return no_arguments()


class IntEncoder(BuiltinEncoder):
    betonbuild_type_id = INT_TYPE_ID

    def encode(self, destination, value, malloc) -> None:
        destination[0] = value


class FloatEncoder(IntEncoder):
    betonbuild_type_id = FLOAT_TYPE_ID


class BytesEncoder(BuiltinEncoder):
    """A 1-D uint8 array, stored as it is; its pointer and size in the record."""

    betonbuild_type_id = BYTES_TYPE_ID

    def encode(self, destination, value: np.ndarray, malloc) -> None:
        ptr, buffer = malloc(value.size)
        buffer[:] = value
        destination["ptr"] = ptr
        destination["size"] = value.size


class JSONEncoder(BytesEncoder):
    """``json.dumps(value)``, NUL-terminated, UTF-8 (ffcv's ``SEPARATOR`` and ``ENCODING``)."""

    betonbuild_type_id = JSON_TYPE_ID

    def encode(self, destination, value, malloc) -> None:
        content = (json.dumps(value) + "\0").encode("utf8")
        super().encode(destination, np.frombuffer(content, dtype="uint8"), malloc)


class NDArrayEncoder(BuiltinEncoder):
    """A fixed ``dtype`` and ``shape``: the record is the payload's pointer."""

    betonbuild_type_id = NDARRAY_TYPE_ID

    def __init__(self, dtype: np.dtype, shape: tuple[int, ...]):
        self.dtype, self.shape = dtype, shape
        self.element_size = dtype.itemsize * np.prod(shape)

    def to_binary(self):
        result = no_arguments()
        header = np.zeros(1, dtype=NDARRAY_ARGS_TYPE)
        shape = np.array(self.shape).astype("<u8")
        header["shape"][0][: len(shape)] = shape
        encoded_type = np.frombuffer(json.dumps(self.dtype.descr).encode("ascii"), dtype="<u1")
        header["type_length"][0] = len(encoded_type)
        to_write = np.concatenate([header.view("<u1"), encoded_type])
        result[0][: to_write.shape[0]] = to_write
        return result

    def encode(self, destination, value: np.ndarray, malloc) -> None:
        destination[0], data_region = malloc(self.element_size)
        data_region[:] = value.reshape(-1).view("<u1")


def ffcv_target_size(width: int, height: int, target_resolution: int | None) -> tuple[int, int] | None:
    """The (width, height) ``ffcv_resizer`` resizes an image of this size to; None if it keeps it."""
    if target_resolution is None or max(width, height) <= target_resolution:
        return None  # ffcv's ratio below is then >= 1 (checked without numpy: once per image)
    original_size = np.array([width, height])
    ratio = target_resolution / original_size.max()
    return tuple(int(v) for v in (ratio * original_size).astype(int)) if ratio < 1 else None


def ffcv_resizer(image: np.ndarray, target_resolution: int | None) -> np.ndarray:
    """ffcv's ``ffcv.fields.rgb_image.resizer`` (tests/unit/fields/test_rgb_image_resize.py compares
    both on many sizes): the longest side to ``target_resolution`` by INTER_AREA, never enlarged."""
    size = ffcv_target_size(image.shape[1], image.shape[0], target_resolution)
    if size is None:
        return image
    import cv2  # here: a write that resizes nothing never imports it (0.13 s of each worker's core)

    return cv2.resize(image, size, interpolation=cv2.INTER_AREA)


class RGBImageEncoder(BuiltinEncoder):
    """ffcv's ``RGBImageField`` encode: resized to ``max_resolution`` (INTER_AREA), then stored raw or
    as JPEG as ``write_mode`` decides (``proportion`` draws from numpy's global RNG, as ffcv's does)."""

    betonbuild_type_id = RGB_IMAGE_TYPE_ID

    def __init__(
        self,
        write_mode: str = "raw",
        max_resolution: int | None = None,
        smart_threshold: int | None = None,
        jpeg_quality: int = 90,
        compress_probability: float = 0.5,
    ):
        self.write_mode, self.max_resolution, self.smart_threshold = write_mode, max_resolution, smart_threshold
        self.jpeg_quality, self.proportion = int(jpeg_quality), compress_probability
        if write_mode != "raw":
            prove(self.jpeg_quality)  # in the writer's parent: its forked workers inherit the verdict

    def encode(self, destination, image, malloc) -> None:
        if not isinstance(image, np.ndarray):
            if not type(image).__module__.startswith("PIL."):
                raise TypeError(f"Unsupported image type {type(image)}")
            image = np.array(image)
        if image.dtype != np.uint8:
            raise ValueError("Image type has to be uint8")
        if image.shape[2] != 3:
            raise ValueError(f"Invalid shape for rgb image: {image.shape}")
        image = ffcv_resizer(image, self.max_resolution)
        write_mode, as_jpg = self.write_mode, None
        if write_mode == "smart":
            as_jpg = encode_jpeg(image, self.jpeg_quality)
            write_mode = "raw"
            if self.smart_threshold is not None and image.nbytes > self.smart_threshold:
                write_mode = "jpg"
        elif write_mode == "proportion":
            write_mode = "jpg" if np.random.rand() < self.proportion else "raw"
        mode = IMAGE_MODES[write_mode]
        if write_mode == "jpg":
            if as_jpg is None:
                as_jpg = encode_jpeg(image, self.jpeg_quality)
            data_ptr, storage = malloc(as_jpg.nbytes)
            storage[:] = as_jpg
        elif write_mode == "raw":
            data_ptr, storage = malloc(image.nbytes)
            storage[:] = np.ascontiguousarray(image).view("<u1").reshape(-1)
        else:
            raise ValueError(f"Unsupported write mode {self.write_mode}")
        height, width = image.shape[:2]
        destination[0] = (mode, width, height, data_ptr)  # the record's field order; one assignment, not four
