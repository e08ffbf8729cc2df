"""``type: gray_image``: a single-channel uint8 image (PIL mode ``L``, an HxW or HxWx1 array), stored
raw or as a greyscale JPEG with rgb_image's ``write_mode``, ``max_resolution`` and ``jpeg_quality``.

Read back through ``ffcv.Loader`` as (batch, H, W, 1) uint8 (zero-padded to the file's largest
image when sizes differ) plus ``<name>_shape``. A 3-channel image is refused: convert it yourself
(``image.convert("L")``), so that the conversion is a choice, not an accident."""

from __future__ import annotations

from typing import Any

import numpy as np

from betonbuild.beton.format import IMAGE_MODE_JPEG, IMAGE_MODE_RAW, BetonFile, FieldInfo
from betonbuild.config.spec import FieldSpec
from betonbuild.fields.builtin_encoders import ffcv_resizer
from betonbuild.fields.gray_field import GrayImageField
from betonbuild.fields.kind import Fail, StoredSample, describe
from betonbuild.fields.rgb_image import MAX_IMAGE_SIDE, MODE_NAMES, RGBImageKind, check_smart_threshold, digits_above
from betonbuild.fields.shipped import ShippedKind

GRAY_FIX = "convert it to one channel in the dataset: PIL image.convert('L'), or cv2.cvtColor(a, cv2.COLOR_RGB2GRAY)"
IMAGE_OPTIONS = ("write_mode", "max_resolution", "smart_threshold", "jpeg_quality", "compress_probability")


class GrayImageKind(ShippedKind):
    name = "gray_image"
    field_class = GrayImageField
    options_schema = {
        "additionalProperties": False,
        "properties": {"type": {}, **{k: RGBImageKind.options_schema["properties"][k] for k in IMAGE_OPTIONS}},
    }
    cost_per_sample_s = 0.02
    preview_roles = ("image",)

    def normalise(self, where: str, options: dict[str, Any]) -> dict[str, Any]:
        check_smart_threshold(where, options)
        return options

    def check(self, field: FieldSpec, value: Any, fail: Fail) -> np.ndarray:
        from PIL import Image

        if isinstance(value, Image.Image):
            if value.mode != "L":
                raise fail(f"gray_image got a PIL image of mode {value.mode}, not L (8-bit greyscale)", GRAY_FIX)
            value = np.asarray(value)
        if not isinstance(value, np.ndarray):
            raise fail(f"gray_image field got {describe(value)}", "return a uint8 HxW numpy array or a PIL L image")
        if value.ndim == 3 and value.shape[2] == 1:
            value = value[:, :, 0]
        if value.ndim == 3 and value.shape[2] in (3, 4):
            raise fail(f"gray_image got {describe(value)}: {value.shape[2]} channels, not 1", GRAY_FIX)
        if value.ndim != 2:
            raise fail(f"gray_image got {describe(value)}; expected HxW or HxWx1", "return a uint8 HxW array")
        if value.dtype != np.uint8:
            raise fail(
                f"gray_image got {describe(value)}; images are uint8",
                "scale to 0..255 and convert with .astype(np.uint8) in the dataset",
            )
        height, width = value.shape
        if not (1 <= height <= MAX_IMAGE_SIDE and 1 <= width <= MAX_IMAGE_SIDE):
            raise fail(f"image is {width}x{height}; each side must be 1..{MAX_IMAGE_SIDE} pixels", "resize it")
        limit = field.options["max_resolution"]
        ratio = limit / max(height, width) if limit else 1.0
        if ratio < 1 and (int(ratio * height) < 1 or int(ratio * width) < 1):
            raise fail(
                f"image {width}x{height} would be resized to zero pixels by max_resolution {limit}",
                "raise max_resolution, or pad or skip such thin images in the adapter",
            )
        return np.ascontiguousarray(value)

    def decoded_bytes(self, field: FieldSpec, page_size: int) -> int:
        limit = field.options["max_resolution"]
        return min(page_size, limit * limit) if limit else page_size

    def compare_needs_ffcv(self, field: FieldSpec) -> bool:
        return False  # cv2 resizes, libturbojpeg decodes: no ffcv module

    def compare(self, field: FieldSpec, stored: StoredSample, value: Any, stats: dict) -> str | None:
        """The stored image decoded as the Loader does, against the source resized as the writer did."""
        allocations = stored.allocations()
        stored.claim(1)
        record = stored.beton.metadata[field.name][stored.position]
        if not allocations or (int(record["ptr"]), int(record["size"])) != allocations[0]:
            return "the record's pointer is not the sample's allocation"
        expected = ffcv_resizer(value, field.options["max_resolution"])
        mode = int(record["mode"])
        if field.options["write_mode"] != "proportion" and mode != self.build(field).stored_mode(expected):
            return f"stored as {MODE_NAMES.get(mode, mode)}; write_mode {field.options['write_mode']} stores otherwise"
        found = self.build(field).decode(record, [stored.beton.read(*allocations[0])])[:, :, 0]
        if found.shape != expected.shape:
            return f"image shape {found.shape}, expected {expected.shape}"
        if mode == IMAGE_MODE_RAW:
            stats["raw"] = stats.get("raw", 0) + 1
            return None if np.array_equal(found, expected) else "raw image pixels differ"
        errors = np.abs(found.astype(np.int16) - expected)
        mean = float(errors.mean())
        stats["jpeg"] = stats.get("jpeg", 0) + 1
        stats["jpeg_mean_abs_error_sum"] = stats.get("jpeg_mean_abs_error_sum", 0.0) + mean
        stats["jpeg_mean_abs_error_max"] = max(stats.get("jpeg_mean_abs_error_max", 0.0), round(mean, 3))
        stats["jpeg_max_abs_error_max"] = max(stats.get("jpeg_max_abs_error_max", 0), int(errors.max()))
        if mean > stored.tolerance:
            return (
                f"JPEG mean absolute pixel error {digits_above(mean, stored.tolerance)} exceeds the tolerance "
                f"{stored.tolerance} (`verify.jpeg_mean_abs_error`): raise jpeg_quality or use write_mode raw"
            )
        return None

    def report_stats(self, field: FieldSpec, column: int, stats: dict, tolerance: float) -> None:
        stats["comparison"] = "decoded image against the source (raw: exact; JPEG: mean absolute error)"
        if "jpeg_mean_abs_error_sum" in stats:
            stats["jpeg_mean_abs_error_mean"] = round(stats.pop("jpeg_mean_abs_error_sum") / max(stats["jpeg"], 1), 3)
        stats["jpeg_tolerance"] = tolerance

    def loader_pipeline(self, field: FieldSpec, beton: BetonFile, n: int) -> list:
        return [self.build(field).get_decoder_class()()]

    def preview_image(self, beton: BetonFile, field: FieldSpec, position: int) -> np.ndarray:
        return self.stored_value(beton, field.name, position)[:, :, 0]

    def describe_stored(self, beton: BetonFile, info: FieldInfo) -> dict[str, Any]:
        modes = beton.metadata[info.name]["mode"]
        jpeg, raw = int((modes == IMAGE_MODE_JPEG).sum()), int((modes == IMAGE_MODE_RAW).sum())
        return {"image_modes": {"jpeg": jpeg, "raw": raw}}

    def summary_text(self, value: np.ndarray) -> str:
        return f"gray {value.shape[1]}x{value.shape[0]}, mean {value.mean():.1f}"


KIND = GrayImageKind()
