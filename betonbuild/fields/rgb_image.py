"""``type: rgb_image``: a uint8 HxWx3 image, stored raw or as JPEG (ffcv's ``RGBImageField``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from betonbuild.beton.format import IMAGE_MODE_JPEG, IMAGE_MODE_RAW, BetonFile, FieldInfo
from betonbuild.beton.payloads import decode_image
from betonbuild.config.spec import FieldSpec
from betonbuild.errors import BetonFormatError, ConfigError
from betonbuild.fields.builtin_encoders import RGBImageEncoder, ffcv_resizer
from betonbuild.fields.kept_jpeg import KeptJPEG, Reencode, keeping_encode, keeps_source_jpeg, resolve_source_jpeg
from betonbuild.fields.kind import Fail, FieldKind, StoredSample, describe
from betonbuild.fields.reduced_decode import decodes_reduced, reduced_pil_file, was_reduced

MAX_IMAGE_SIDE = 65535  # ffcv stores width and height as <u2
LOADER_JPEG_MEAN_ERROR = 4.0  # two JPEG decoders of one file; a different image differs by ~50+
MODE_NAMES = {IMAGE_MODE_JPEG: "jpeg", IMAGE_MODE_RAW: "raw"}
JPEG_TOLERANCE_FIX = (
    "store the images losslessly with `write_mode: raw`, "
    "or raise `verify.jpeg_mean_abs_error` if that loss is acceptable"
)
_DIGEST_HEADER = np.dtype([("mode", "u1"), ("width", "<u2"), ("height", "<u2"), ("length", "<u8")])


def expected_image(field: FieldSpec, image: np.ndarray) -> np.ndarray:
    """What ffcv stores for a source image: resized (INTER_AREA, never upscaled) to max_resolution."""
    return ffcv_resizer(image, field.options["max_resolution"])


def jpeg_error(decoded: np.ndarray, expected: np.ndarray) -> tuple[float, int]:
    """A decoded JPEG's mean and largest absolute pixel error against the pixels it should hold,
    as the verification reports them (the write's measurements, ``write.image_measure``, too)."""
    import cv2

    mean = cv2.norm(decoded, expected, cv2.NORM_L1) / max(decoded.size, 1)
    return mean, int(cv2.norm(decoded, expected, cv2.NORM_INF))


def digits_above(value: float, limit: float) -> str:
    """``value`` with the fewest decimals (at least 2) that still show it above ``limit``: 8.002
    against 8.0 prints as 8.002, not as 8.00."""
    for decimals in range(2, 16):
        text = f"{value:.{decimals}f}"
        if float(text) > limit:
            return text
    return repr(value)


def check_smart_threshold(where: str, options: dict[str, Any]) -> None:
    """``write_mode: smart`` needs its threshold (the rule of every image kind with ffcv's write modes)."""
    if options["write_mode"] == "smart" and options["smart_threshold"] is None:
        raise ConfigError(
            f"{where}.smart_threshold",
            "write_mode 'smart' needs smart_threshold (image bytes, height*width*3, above which it is stored "
            "as JPEG); without it ffcv stores raw and wastes a JPEG encode per image",
        )


class RGBImageKind(FieldKind):
    name = "rgb_image"
    # The field's entry in the config, as JSON Schema (config.load assembles the whole schema)
    options_schema = {
        "additionalProperties": False,
        "properties": {
            "type": {},
            "write_mode": {"enum": ["raw", "jpg", "smart", "proportion"], "default": "raw"},
            "max_resolution": {"type": ["integer", "null"], "minimum": 1, "default": None},
            "smart_threshold": {"type": ["integer", "null"], "minimum": 1, "default": None},
            "jpeg_quality": {"type": "integer", "minimum": 1, "maximum": 100, "default": 90},
            "compress_probability": {"type": "number", "minimum": 0, "maximum": 1, "default": 0.5},
            "image_mode": {
                "enum": ["strict", "convert"],
                "default": "strict",
                "description": "strict rejects non-RGB PIL images; convert applies PIL .convert('RGB').",
            },
            "decode": {
                "enum": ["full", "reduced"],
                "default": "full",
                "description": (
                    "reduced: a source JPEG that max_resolution shrinks 2x or more (an image folder's file, a "
                    "webdataset rgb8 member, Parquet image bytes, a python source's JPEG bytes or PIL JPEG file) "
                    "is decoded at libjpeg's reduced DCT scale (PIL draft), then resized as ffcv does; pixels "
                    "differ slightly from ffcv's (docs/images.md)."
                ),
            },
            "source_jpeg": {
                "enum": ["reencode", "keep"],
                "default": "reencode",
                "description": (
                    "keep stores a source JPEG's bytes unchanged where ffcv reads it as it is (8-bit, YCbCr or "
                    "grey, within max_resolution); reencode decodes and encodes every image (ffcv's way)."
                ),
            },
        },
    }
    cost_per_sample_s = 0.05
    preview_roles = ("image",)

    def normalise(self, where: str, options: dict[str, Any]) -> dict[str, Any]:
        check_smart_threshold(where, options)
        if options["source_jpeg"] == "keep" and options["write_mode"] != "jpg":
            raise ConfigError(
                f"{where}.source_jpeg",
                f"`source_jpeg: keep` stores JPEGs, but write_mode is {options['write_mode']!r}: "
                "set `write_mode: jpg`, or remove `source_jpeg`",
            )
        if options["decode"] == "reduced" and not options["max_resolution"]:
            raise ConfigError(
                f"{where}.decode",
                "`decode: reduced` decodes the JPEGs that max_resolution shrinks 2x or more, and there is "
                "no max_resolution: set one, or remove `decode`",
            )
        return options

    def build(self, field: FieldSpec):
        o = field.options
        encoder = RGBImageEncoder(
            write_mode=o["write_mode"],
            max_resolution=o["max_resolution"],
            smart_threshold=o["smart_threshold"],
            jpeg_quality=o["jpeg_quality"],
            compress_probability=o["compress_probability"],
        )
        return keeping_encode(encoder) if keeps_source_jpeg(field) else encoder

    def check(self, field: FieldSpec, value: Any, fail: Fail) -> np.ndarray | KeptJPEG:
        if keeps_source_jpeg(field):
            value = resolve_source_jpeg(field, value, fail)
            if isinstance(value, KeptJPEG):
                return value  # its frame header was checked: 8-bit, within max_resolution
            if isinstance(value, Reencode):
                value = value.image
        if decodes_reduced(field):
            value = _reduced_pil_file(field, value, fail)
        value = _as_rgb_array(field, value, fail)
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
        # an array that is contiguous already is returned as it is: a ``ReducedPixels`` stays marked
        return value if value.flags.c_contiguous else np.ascontiguousarray(value)

    def decoded_bytes(self, field: FieldSpec, page_size: int) -> int:
        if field.options.get("max_resolution"):
            return 3 * field.options["max_resolution"] ** 2
        return page_size

    def compare_needs_ffcv(self, field: FieldSpec) -> bool:
        return False  # ffcv's resizer is reproduced by ``ffcv_resizer``

    def compare(self, field: FieldSpec, stored: StoredSample, value: Any, stats: dict) -> str | None:
        if isinstance(value, KeptJPEG):
            return _compare_kept(field, stored, value, stats)
        if was_reduced(value):
            stats["reduced_decode"] = stats.get("reduced_decode", 0) + 1
        expected = expected_image(field, value)
        found, raw = stored.image(field.name)
        if found.shape != expected.shape:
            return f"image shape {found.shape}, expected {expected.shape}"
        if raw:
            stats["raw"] = stats.get("raw", 0) + 1
            return None if np.array_equal(found, expected) else "raw image pixels differ"
        mean, worst = jpeg_error(found, np.ascontiguousarray(expected))
        stats["jpeg"] = stats.get("jpeg", 0) + 1
        stats["jpeg_mean_abs_error_sum"] = stats.get("jpeg_mean_abs_error_sum", 0.0) + mean
        stats["jpeg_mean_abs_error_max"] = max(stats.get("jpeg_mean_abs_error_max", 0.0), round(mean, 3))
        stats["jpeg_max_abs_error_max"] = max(stats.get("jpeg_max_abs_error_max", 0), worst)
        if mean > stored.tolerance:
            stats["jpeg_over_tolerance"] = stats.get("jpeg_over_tolerance", 0) + 1  # the report adds the fix once
            return (
                f"JPEG mean absolute pixel error {digits_above(mean, stored.tolerance)} exceeds the tolerance "
                f"{stored.tolerance} (`verify.jpeg_mean_abs_error`)"
            )
        return None

    def report_stats(self, field: FieldSpec, column: int, stats: dict, tolerance: float) -> None:
        if "jpeg_mean_abs_error_sum" in stats:
            stats["jpeg_mean_abs_error_mean"] = round(stats.pop("jpeg_mean_abs_error_sum") / max(stats["jpeg"], 1), 3)
        stats["jpeg_tolerance"] = tolerance
        if keeps_source_jpeg(field):  # no quality loss hidden: how many images were kept, how many re-encoded
            stats.setdefault("kept", 0)
            stats["reencoded"] = stats.get("jpeg", 0) + stats.get("raw", 0)
        if decodes_reduced(field):  # and how many were decoded at libjpeg's reduced scale
            stats.setdefault("reduced_decode", 0)
        if stats.pop("jpeg_over_tolerance", 0):
            # variable_result prints it once, after the failing samples
            quality = field.options["jpeg_quality"]
            # ffcv's colour subsampling keeps an error of a few levels even at quality 100
            raise_quality = f"raise the field's `jpeg_quality` (now {quality}), " if quality < 100 else ""
            stats["fix"] = raise_quality + JPEG_TOLERANCE_FIX

    def loader_pipeline(self, field: FieldSpec, beton: BetonFile, n: int) -> list | None:
        from ffcv.fields.decoders import SimpleRGBImageDecoder

        meta = beton.metadata[field.name][:n]
        if len(np.unique(meta["width"])) == 1 and len(np.unique(meta["height"])) == 1:
            return [SimpleRGBImageDecoder()]
        return None  # SimpleRGBImageDecoder needs one image size

    def loader_equal(self, field: FieldSpec, beton: BetonFile, item: Any, position: int) -> bool:
        # ffcv decodes JPEG with libturbojpeg, we with cv2: their IDCTs differ by about 1 level.
        mine = decode_image(beton, field.name, position).astype(np.int16)
        return item.shape == mine.shape and np.abs(item.astype(np.int16) - mine).mean() < LOADER_JPEG_MEAN_ERROR

    def describe_arguments(self, info: FieldInfo) -> dict[str, Any]:
        return {"note": "ffcv stores no image arguments (write_mode, quality and max_resolution are not recorded)"}

    def data_bytes(self, beton: BetonFile, info: FieldInfo) -> int:
        sizes = beton.image_sizes(info.name, np.arange(beton.num_samples, dtype=np.int64))
        return int(np.maximum(sizes, 0).sum())

    def describe_stored(self, beton: BetonFile, info: FieldInfo) -> dict[str, Any]:
        """How many images are stored as JPEG, raw, and (only if any) in an unknown mode."""
        modes = beton.metadata[info.name]["mode"]
        jpeg, raw = int((modes == IMAGE_MODE_JPEG).sum()), int((modes == IMAGE_MODE_RAW).sum())
        unknown = len(modes) - jpeg - raw
        return {"image_modes": {"jpeg": jpeg, "raw": raw, **({"unknown": unknown} if unknown else {})}}

    def arguments_text(self, entry: dict[str, Any]) -> str:
        """The image modes: ffcv records no image arguments."""
        if "image_modes" not in entry:
            return super().arguments_text(entry)
        return ", ".join(f"{k} {v}" for k, v in entry["image_modes"].items())

    def summarise(self, beton: BetonFile, info: FieldInfo, position: int) -> str:
        """The mode, the size in pixels and the stored bytes."""
        record = beton.metadata[info.name][position]
        mode = int(record["mode"])
        size = len(beton.variable_payload(info.name, position))
        return f"{MODE_NAMES.get(mode, f'mode {mode}')} {int(record['width'])}x{int(record['height'])}, {size} bytes"

    def digest_column(self, beton: BetonFile, info: FieldInfo, positions: np.ndarray, meta: np.ndarray):
        """mode ``u1``, width ``<u2``, height ``<u2``, ``<u8`` length, then the payload."""
        sizes = beton.image_sizes(info.name, positions)
        bad = sizes < 0
        if bad.any():
            position = int(positions[np.argmax(bad)])
            mode = int(meta["mode"][np.argmax(bad)])
            why = "unknown image mode" if mode not in MODE_NAMES else "JPEG pointer not in the allocation table"
            raise BetonFormatError(f"{beton.path}: sample {position} field '{info.name}': {why}")
        beton.check_payloads_inside(meta["data_ptr"], sizes.astype(np.uint64), f"field '{info.name}'")
        headers = np.zeros(len(positions), dtype=_DIGEST_HEADER)
        for key in ("mode", "width", "height"):
            headers[key] = meta[key]
        headers["length"] = sizes
        head_bytes = headers.view(np.uint8).reshape(len(positions), -1)
        ptrs = meta["data_ptr"]
        return lambda i, position, allocs: (head_bytes[i], beton.mm[int(ptrs[i]) : int(ptrs[i]) + int(sizes[i])])


def _compare_kept(field: FieldSpec, stored: StoredSample, value: KeptJPEG, stats: dict) -> str | None:
    """A kept JPEG is verified by its bytes; one decode, by ffcv's own decoder (``stored.image``, whose
    return code the report's ``image_decoder`` check judges), proves that ffcv reads it."""
    record = stored.beton.metadata[field.name][stored.position]
    payload = stored.beton.variable_payload(field.name, stored.position)
    stats["kept"] = stats.get("kept", 0) + 1
    mode, size = int(record["mode"]), (int(record["width"]), int(record["height"]))
    if mode != IMAGE_MODE_JPEG or size != (value.width, value.height):
        stored_as = f"{MODE_NAMES.get(mode, 'unknown')} {size[0]}x{size[1]}"
        return f"kept JPEG stored as {stored_as}, expected jpeg {value.width}x{value.height}"
    if payload.size != len(value.data) or not np.array_equal(payload, np.frombuffer(value.data, np.uint8)):
        return f"kept JPEG's {payload.size} stored bytes differ from the source's {len(value.data)}" + (
            f" ({value.file})" if value.file else ""
        )
    found, _ = stored.image(field.name)
    if found.shape != (value.height, value.width, 3):
        return f"kept JPEG decodes to shape {found.shape}, expected {(value.height, value.width, 3)}"
    return None


def _reduced_pil_file(field: FieldSpec, value: Any, fail: Fail) -> Any:
    """``decode: reduced`` for a python source's PIL JPEG opened from a file (``reduced_pil_file``)."""
    from PIL import Image

    try:
        return reduced_pil_file(field, value)
    except (OSError, Image.DecompressionBombError) as exc:
        raise fail(f"cannot decode the image{_file_of(value)}: {exc}", "return images that decode") from None


def _as_rgb_array(field: FieldSpec, value: Any, fail: Fail) -> np.ndarray:
    """A PIL image or an array as uint8 HxWx3 (converted only with ``image_mode: convert``). PIL is
    imported only where it is needed: the import statement, run once a sample, cost ~1% of a JPEG
    write's worker time for arrays that need nothing."""
    convert = field.options.get("image_mode") == "convert"
    convert_hint = "add `image_mode: convert` to the field to convert with PIL .convert('RGB')"
    if isinstance(value, np.ndarray):
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
            from PIL import Image

            # HxW / HxWx1 are grey (mode L), HxWx4 is RGBA: the conversions PIL's .convert("RGB") defines.
            value = np.asarray(
                Image.fromarray(value.reshape(value.shape[:2]) if channels == 1 else value).convert("RGB")
            )
        return value
    from PIL import Image

    if isinstance(value, Image.Image):
        if value.mode != "RGB":
            _refuse_high_depth(value, fail)  # before the hint: `image_mode: convert` would clip it
            if not convert:
                raise fail(f"PIL image has mode {value.mode}, not RGB", convert_hint)
            try:
                value = value.convert("RGB")
            except ValueError as exc:  # a mode PIL cannot convert to RGB
                raise fail(
                    f"PIL image{_file_of(value)} has mode {value.mode}, which PIL cannot convert to RGB: {exc}",
                    "convert it to RGB in an adapter (a python source), or save the files as RGB",
                ) from None
        return np.asarray(value)
    if type(value).__module__ == "torch":
        raise fail(
            f"image is a {describe(value)}",
            "return a uint8 HxWx3 numpy array (e.g. tensor.permute(1, 2, 0).numpy()) or a PIL RGB image",
        )
    raise fail(f"rgb_image field got {describe(value)}", "return a uint8 HxWx3 numpy array or a PIL RGB image")


def _refuse_high_depth(image, fail: Fail) -> None:
    """Refuses an image of more than 8 bits per channel (modes I;16*, I, F): PIL's .convert("RGB")
    silently turns every value above 255 into 255, and verification would then pass against the clipped copy."""
    from PIL import ImageMode

    try:
        itemsize = np.dtype(ImageMode.getmode(image.mode).typestr).itemsize
    except (KeyError, TypeError, ValueError):
        return  # a mode PIL does not describe: its .convert decides
    if itemsize <= 1:
        return
    pixels = np.asarray(image)
    bits = f"{8 * itemsize}-bit {'float' if pixels.dtype.kind == 'f' else 'integer'}"
    largest = f"{pixels.max():g}" if pixels.size else "none"
    raise fail(
        f"PIL image{_file_of(image)} has mode {image.mode} ({bits} values, largest {largest}); "
        "PIL's .convert('RGB') would clip every value above 255, so betonbuild refuses it "
        "even with `image_mode: convert`",
        "scale it to 8 bits yourself: read the images with a python source whose __getitem__ returns "
        "np.asarray(image) scaled to 0..255 (e.g. * 255 / 65535 for 16-bit data, * 255 / 4095 for 12-bit), "
        "rounded to uint8 and stacked to HxWx3; or save the files as 8-bit images",
    )


def _file_of(image) -> str:
    """' (file <path>)' for an image PIL opened from a file (an image folder's), else ''."""
    filename = getattr(image, "filename", "")
    return f" (file {filename})" if filename else ""


KIND = RGBImageKind()
