"""Unit tests of the strict sample contract (betonbuild.write.contract): one test per rule.

Every error must name the dataset, the field (when there is one) and the source index.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from betonbuild.config.load import load_config
from betonbuild.config.spec import DatasetSpec
from betonbuild.demo import colour_photos
from betonbuild.errors import SampleError
from betonbuild.write.contract import check_sample, check_value, describe, sample_to_tuple

DATASET = "shapes"
INDEX = 1234

FIELDS = {
    "label": {"type": "int"},
    "score": {"type": "float"},
    "emb": {"type": "ndarray", "dtype": "float32", "shape": [2, 3]},
    "tens": {"type": "torch_tensor", "dtype": "float32", "shape": [4]},
    "image": {"type": "rgb_image"},
    "image_conv": {"type": "rgb_image", "image_mode": "convert"},
    "image_small": {"type": "rgb_image", "max_resolution": 16},
    "blob": {"type": "bytes"},
    "blob_empty": {"type": "bytes", "allow_empty": True},
    "meta": {"type": "json"},
    "meta_conv": {"type": "json", "json_numpy": "convert"},
}


def make_spec(fields: dict, sample_keys=None, name: str = DATASET) -> DatasetSpec:
    entry = {"source": {"kind": "python", "factory": "m:f"}, "fields": fields}
    if sample_keys is not None:
        entry["sample_keys"] = sample_keys
    return load_config({"datasets": {name: entry}}).datasets[name]


SPEC = make_spec(FIELDS)
FIELD = {f.name: f for f in SPEC.fields}


def check(field: str, value, index: int = INDEX):
    return check_value(DATASET, FIELD[field], value, index)


def rejected(field: str, value, index: int = INDEX) -> SampleError:
    with pytest.raises(SampleError) as info:
        check(field, value, index)
    error = info.value
    message = str(error)
    assert f"dataset '{DATASET}'" in message
    assert f"field '{field}'" in message
    assert f"sample index {index}" in message
    assert (error.dataset, error.field, error.index) == (DATASET, field, index)
    return error


@pytest.fixture(scope="module")
def photo() -> np.ndarray:
    """A real 48x64 RGB crop of the astronaut photograph."""
    image = colour_photos()["astronaut"]
    return np.ascontiguousarray(image[100:148, 150:214])


# --- int -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [3.9, -0.5, np.float32(2.5), np.longdouble(3.5)])
def test_a_fraction_into_int_field_is_rejected(value):
    error = rejected("label", value)
    assert "int field got" in str(error)
    assert "which is not a whole number; ffcv would truncate it" in str(error)
    assert "round(value)" in error.fix


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -np.inf, np.float32("nan")])
def test_a_non_finite_float_into_int_field_is_rejected(value):
    error = rejected("label", value)
    assert "which has no integer value" in str(error)
    assert "make the field a float" in error.fix


@pytest.mark.parametrize(
    "value,expected",
    [(3.0, 3), (-7.0, -7), (np.float32(2.0), 2), (np.float16(2048.0), 2048), (-(2.0**63), -(2**63)), (2.0**62, 2**62)],
)
def test_a_whole_float_into_int_field_is_accepted_as_its_int(value, expected):
    result = check("label", value)
    assert type(result) is int and result == expected


@pytest.mark.parametrize("value", [2.0**63, -(2.0**64), 1e300])
def test_a_whole_float_outside_int64_is_rejected(value):
    assert f"int value {int(value)} does not fit in int64" in str(rejected("label", value))


@pytest.mark.parametrize(
    "value,expected",
    [
        (np.array(7), 7),
        (np.array(-3, dtype=np.int8), -3),
        (np.array(2**64 - 1 >> 1, dtype=np.uint64), 2**63 - 1),
        (np.array(4.0), 4),
        (torch.tensor(7), 7),
        (torch.tensor(-2, dtype=torch.int16), -2),
        (torch.tensor(5.0, dtype=torch.float32), 5),
    ],
)
def test_a_zero_d_integer_array_or_tensor_into_int_field_is_accepted_as_its_int(value, expected):
    result = check("label", value)
    assert type(result) is int and result == expected


@pytest.mark.parametrize(
    "value,why",
    [
        (np.array(7.5), "int field got numpy array dtype=float64 shape=(), which is not a whole number"),
        (torch.tensor(0.5), "int field got torch tensor dtype=torch.float32 shape=() device=cpu, which is not"),
        (np.array(True), "int field got numpy array dtype=bool shape=()"),
        (torch.tensor(True), "int field got torch tensor dtype=torch.bool shape=()"),
        (np.array([7]), "int field got numpy array dtype=int64 shape=(1,)"),
        (torch.tensor([7]), "int field got torch tensor dtype=torch.int64 shape=(1,)"),
        (torch.tensor(7, device="meta"), "int field got torch tensor dtype=torch.int64 shape=() device=meta"),
        (np.array(2**64 - 1, dtype=np.uint64), f"int value {2**64 - 1} does not fit in int64"),
    ],
)
def test_arrays_and_tensors_that_are_not_one_integer_are_rejected(value, why):
    assert why in str(rejected("label", value))


def test_str_into_int_field_is_rejected():
    assert "int field got str '7'" in str(rejected("label", "7"))


def test_none_into_int_field_is_rejected():
    assert "int field got NoneType None" in str(rejected("label", None))


@pytest.mark.parametrize("value", [True, False, np.bool_(True)])
def test_bool_into_int_field_is_rejected(value):
    assert "int field got" in str(rejected("label", value))


@pytest.mark.parametrize(
    "value", [np.int8(-5), np.uint8(250), np.int32(7), np.int64(-(2**63)), np.uint64(2**63 - 1), 42]
)
def test_int_field_accepts_python_and_numpy_ints_as_python_int(value):
    result = check("label", value)
    assert type(result) is int
    assert result == int(value)


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, np.uint64(2**64 - 1), 10**30])
def test_int_outside_int64_is_rejected(value):
    assert f"int value {int(value)} does not fit in int64" in str(rejected("label", value))


def test_int64_limits_are_accepted():
    assert check("label", 2**63 - 1) == 2**63 - 1
    assert check("label", -(2**63)) == -(2**63)


# --- float ---------------------------------------------------------------------------------------


def test_none_into_float_field_is_rejected():
    # ffcv would store NaN.
    assert "float field got NoneType None" in str(rejected("score", None))


def test_str_into_float_field_is_rejected():
    assert "float field got str '2.5'" in str(rejected("score", "2.5"))


@pytest.mark.parametrize("value", [True, np.bool_(False)])
def test_bool_into_float_field_is_rejected(value):
    assert "float field got" in str(rejected("score", value))


@pytest.mark.parametrize(
    "value,expected",
    [
        (np.array(1.5), 1.5),
        (np.array(0.1, dtype=np.float32), float(np.float32(0.1))),
        (np.array(-4, dtype=np.int32), -4.0),
        (np.array(np.nan), np.nan),
        (torch.tensor(0.25), 0.25),
        (torch.tensor(0.1, dtype=torch.float16), float(np.float16(0.1))),
        (torch.tensor(3), 3.0),
    ],
)
def test_zero_d_array_or_tensor_into_float_field_is_accepted_as_its_float(value, expected):
    result = check("score", value)
    assert type(result) is float
    assert result == expected or (np.isnan(expected) and np.isnan(result))


@pytest.mark.parametrize(
    "value,why",
    [
        (np.array([1.5]), "float field got numpy array dtype=float64 shape=(1,)"),
        (np.array(True), "float field got numpy array dtype=bool shape=()"),
        (torch.tensor(False), "float field got torch tensor dtype=torch.bool shape=()"),
        (np.array(1 + 2j), "float field got numpy array dtype=complex128 shape=()"),
    ],
)
def test_arrays_and_tensors_that_are_not_one_number_into_float_field_are_rejected(value, why):
    assert why in str(rejected("score", value))


@pytest.mark.parametrize(
    "value,stored",
    [
        (2**53 + 1, "9007199254740992.0"),
        (np.int64(2**62 + 1), "4.611686018427388e+18"),
        (np.uint64(2**64 - 1), "1.8446744073709552e+19"),
        (np.longdouble(1) / 3, "0.3333333333333333"),
    ],
)
def test_a_number_float64_would_round_is_rejected(value, stored):
    error = rejected("score", value)
    assert f"is not exactly a float64; it would be stored as {stored}" in str(error)
    assert "float(value)" in error.fix
    assert check("score", float(value)) == float(value)  # the fix works when followed


@pytest.mark.parametrize("value", [2**53, -(2**60), np.int64(2**62), np.longdouble(0.5), np.uint64(2**63)])
def test_a_large_number_float64_holds_exactly_is_accepted(value):
    assert check("score", value) == float(value)


@pytest.mark.parametrize("value", [2.5, np.float32(0.25), np.float64(-1e300), 3, np.int16(4)])
def test_float_field_accepts_numbers_as_python_float(value):
    result = check("score", value)
    assert type(result) is float
    assert result == float(value)


def test_int_too_large_for_float_field_is_a_sample_error():
    rejected("score", 2**1024)


# --- ndarray -------------------------------------------------------------------------------------


def test_float64_into_float32_field_names_field_and_index():
    error = rejected("emb", np.zeros((2, 3), dtype=np.float64))
    assert "dtype float64 does not match the field's float32 (shape (2, 3))" in str(error)
    assert "value.astype('float32')" in error.fix


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_bool_array_into_a_one_byte_integer_field_is_accepted_as_0_and_1(dtype):
    spec = make_spec({"mask": {"type": "ndarray", "dtype": dtype, "shape": [2, 3]}})
    value = np.array([[True, False, True], [False, False, True]])
    result = check_value(DATASET, spec.fields[0], value, 0)
    assert result.dtype == np.dtype(dtype) and result.flags.c_contiguous
    assert result.tolist() == [[1, 0, 1], [0, 0, 1]]
    strided = check_value(DATASET, spec.fields[0], np.ones((4, 6), bool)[::2, ::2], 0)
    assert strided.tolist() == [[1, 1, 1], [1, 1, 1]] and strided.flags.c_contiguous


@pytest.mark.parametrize("dtype", ["float32", "int16", "uint16", "float64"])
def test_bool_array_into_a_wider_field_is_rejected(dtype):
    spec = make_spec({"mask": {"type": "ndarray", "dtype": dtype, "shape": [3]}})
    with pytest.raises(SampleError) as info:
        check_value(DATASET, spec.fields[0], np.array([True, False, True]), 0)
    assert f"dtype bool does not match the field's {dtype}" in str(info.value)


def test_bool_array_of_the_wrong_shape_into_a_uint8_field_is_rejected():
    spec = make_spec({"mask": {"type": "ndarray", "dtype": "uint8", "shape": [2, 3]}})
    with pytest.raises(SampleError, match=r"shape \(3, 2\) does not match the field's \(2, 3\)"):
        check_value(DATASET, spec.fields[0], np.ones((3, 2), bool), 0)


@pytest.mark.parametrize("dtype", ["uint8", "int8", "float32"])
def test_a_one_byte_integer_array_into_a_bool_field_is_rejected(dtype):
    # 2 is no bool: the conversion is accepted one way only.
    spec = make_spec({"mask": {"type": "ndarray", "dtype": "bool", "shape": [3]}})
    with pytest.raises(SampleError, match=f"dtype {dtype} does not match the field's bool"):
        check_value(DATASET, spec.fields[0], np.array([0, 1, 2], dtype=dtype), 0)


def test_float16_into_float32_field_is_rejected():
    assert "dtype float16 does not match the field's float32" in str(rejected("emb", np.zeros((2, 3), np.float16)))


def test_int32_into_float32_field_is_rejected_though_the_byte_count_matches():
    error = rejected("emb", np.zeros((2, 3), dtype=np.int32))
    assert "dtype int32 does not match the field's float32" in str(error)


def test_transposed_shape_is_rejected_though_the_byte_count_matches():
    error = rejected("emb", np.zeros((3, 2), dtype=np.float32))
    assert "shape (3, 2) does not match the field's (2, 3)" in str(error)


def test_flat_array_is_rejected():
    assert "shape (6,) does not match the field's (2, 3)" in str(rejected("emb", np.zeros(6, dtype=np.float32)))


def test_big_endian_array_is_rejected_with_a_byte_order_message():
    error = rejected("emb", np.arange(6, dtype=">f4").reshape(2, 3))
    assert "array is >f4 (non-native byte order); the field stores <f4" in str(error)
    assert "newbyteorder('=')" in error.fix


def test_list_into_ndarray_field_is_rejected():
    error = rejected("emb", [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]])
    assert "ndarray field got list" in str(error)
    assert "np.asarray(value, dtype='float32') with shape (2, 3)" in error.fix


def test_tensor_into_ndarray_field_is_rejected():
    assert "ndarray field got torch tensor" in str(rejected("emb", torch.zeros(2, 3)))


def test_non_contiguous_array_is_made_contiguous_with_the_same_values():
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    view = base[::2, ::2]
    assert view.shape == (2, 3) and not view.flags.c_contiguous
    result = check("emb", view)
    assert result.flags.c_contiguous
    assert result.dtype == np.float32
    assert np.array_equal(result, view)


def test_fortran_ordered_array_is_made_c_contiguous():
    value = np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    result = check("emb", value)
    assert result.flags.c_contiguous
    assert result.tobytes() == np.arange(6, dtype=np.float32).tobytes()


def test_matching_array_is_accepted_unchanged():
    value = np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3)
    assert np.array_equal(check("emb", value), value)


# --- torch_tensor --------------------------------------------------------------------------------


def test_tensor_requiring_grad_is_rejected_with_a_detach_hint():
    error = rejected("tens", torch.zeros(4, requires_grad=True))
    assert "tensor requires grad" in str(error)
    assert "value.detach()" in error.fix


def test_tensor_of_wrong_dtype_is_rejected():
    error = rejected("tens", torch.zeros(4, dtype=torch.float64))
    assert "dtype torch.float64 does not match the field's torch.float32 (shape (4,))" in str(error)


def test_tensor_of_wrong_shape_is_rejected():
    assert "shape (2, 2) does not match the field's (4,)" in str(rejected("tens", torch.zeros(2, 2)))


def test_numpy_array_into_tensor_field_is_rejected():
    assert "torch_tensor field got numpy array" in str(rejected("tens", np.zeros(4, dtype=np.float32)))


def test_non_contiguous_tensor_is_made_contiguous():
    base = torch.arange(8, dtype=torch.float32)
    view = base[::2]
    assert not view.is_contiguous()
    result = check("tens", view)
    assert result.is_contiguous()
    assert torch.equal(result, torch.tensor([0.0, 2.0, 4.0, 6.0]))


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_bool_tensor_into_a_one_byte_integer_tensor_field_is_accepted_as_0_and_1(dtype):
    spec = make_spec({"mask": {"type": "torch_tensor", "dtype": dtype, "shape": [3]}})
    result = check_value(DATASET, spec.fields[0], torch.tensor([True, False, True]), 0)
    assert result.dtype == getattr(torch, dtype) and result.tolist() == [1, 0, 1]


def test_bool_tensor_into_a_float_tensor_field_is_rejected():
    spec = make_spec({"mask": {"type": "torch_tensor", "dtype": "float32", "shape": [3]}})
    with pytest.raises(SampleError, match="dtype torch.bool does not match the field's torch.float32"):
        check_value(DATASET, spec.fields[0], torch.tensor([True, False, True]), 0)


def test_bool_tensor_field_accepts_bool_tensors():
    spec = make_spec({"mask": {"type": "torch_tensor", "dtype": "bool", "shape": [3]}})
    value = torch.tensor([True, False, True])
    assert torch.equal(check_value(DATASET, spec.fields[0], value, 0), value)


# --- rgb_image -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["L", "P", "RGBA", "CMYK", "YCbCr"])
def test_non_rgb_pil_image_is_rejected_naming_image_mode_convert(photo, mode):
    image = Image.fromarray(photo).convert(mode)
    error = rejected("image", image)
    assert f"PIL image has mode {mode}, not RGB" in str(error)
    assert "image_mode: convert" in error.fix


@pytest.mark.parametrize("mode", ["L", "P", "RGBA", "CMYK"])
def test_image_mode_convert_converts_pil_images_to_rgb(photo, mode):
    image = Image.fromarray(photo).convert(mode)
    result = check("image_conv", image)
    assert result.dtype == np.uint8 and result.shape == (48, 64, 3)
    assert np.array_equal(result, np.asarray(image.convert("RGB")))


def test_rgb_pil_image_is_accepted_with_its_pixels(photo):
    result = check("image", Image.fromarray(photo))
    assert np.array_equal(result, photo)


def test_rgb_array_is_accepted_unchanged(photo):
    assert np.array_equal(check("image", photo), photo)


def test_non_contiguous_image_is_made_contiguous(photo):
    view = photo[:, ::2]
    result = check("image", view)
    assert result.flags.c_contiguous and np.array_equal(result, view)


def test_channels_first_array_is_rejected_with_transpose_hint(photo):
    error = rejected("image", np.ascontiguousarray(photo.transpose(2, 0, 1)))
    assert "looks channels-first (CHW)" in str(error)
    assert "transpose(1, 2, 0)" in error.fix


def test_float_image_is_rejected(photo):
    error = rejected("image", photo.astype(np.float32) / 255)
    assert "RGB images are uint8" in str(error)


def test_grayscale_array_is_rejected_in_strict_mode_and_converted_with_convert(photo):
    gray = np.asarray(Image.fromarray(photo).convert("L"))
    error = rejected("image", gray)
    assert "expected HxWx3 RGB" in str(error) and "image_mode: convert" in error.fix
    result = check("image_conv", gray)
    assert result.shape == (48, 64, 3)
    assert np.array_equal(result[..., 0], gray) and np.array_equal(result[..., 2], gray)


def test_rgba_array_is_rejected_in_strict_mode(photo):
    rgba = np.dstack([photo, np.full(photo.shape[:2], 255, np.uint8)])
    assert "expected HxWx3 RGB" in str(rejected("image", rgba))


def test_single_channel_3d_array_with_convert_becomes_grey_rgb(photo):
    grey = photo[:, :, :1].copy()
    converted = check("image_conv", grey)
    assert converted.shape == (*grey.shape[:2], 3)
    assert all(np.array_equal(converted[:, :, c], grey[:, :, 0]) for c in range(3))


def test_five_channel_array_with_convert_is_a_sample_error(photo):
    rejected("image_conv", np.concatenate([photo, photo[:, :, :2]], axis=2))


def test_torch_image_is_rejected_with_permute_hint():
    error = rejected("image", torch.zeros(3, 8, 8, dtype=torch.uint8))
    assert "permute(1, 2, 0)" in error.fix


def test_bytes_into_image_field_is_rejected():
    assert "rgb_image field got bytes" in str(rejected("image", b"\x89PNG"))


@pytest.mark.parametrize("shape", [(0, 8, 3), (8, 0, 3), (0, 0, 3)])
def test_zero_size_image_is_rejected(shape):
    height, width = shape[:2]
    error = rejected("image", np.zeros(shape, dtype=np.uint8))
    assert f"image is {width}x{height}; each side must be 1..65535 pixels" in str(error)


def test_zero_size_pil_image_is_rejected():
    assert "image is 0x0" in str(rejected("image", Image.new("RGB", (0, 0))))


def test_image_wider_than_ffcv_can_store_is_rejected():
    error = rejected("image", np.zeros((1, 65536, 3), dtype=np.uint8))
    assert "image is 65536x1" in str(error)


def test_image_that_max_resolution_would_resize_to_zero_is_rejected():
    # 400 wide, 1 high, max_resolution 16 -> ffcv's resize gives 16 x int(0.04) = 0 pixels.
    error = rejected("image_small", np.zeros((1, 400, 3), dtype=np.uint8))
    assert "image 400x1 would be resized to zero pixels by max_resolution 16" in str(error)


def test_image_that_max_resolution_shrinks_to_nonzero_is_accepted(photo):
    assert np.array_equal(check("image_small", photo), photo)  # resizing is ffcv's job, not the check's


# --- bytes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [b"\x00\x01\xffabc", bytearray(b"\x00\x01\xffabc"), memoryview(b"\x00\x01\xffabc")])
def test_bytes_like_values_are_converted_to_uint8_exactly(value):
    result = check("blob", value)
    assert result.dtype == np.uint8 and result.ndim == 1
    assert result.tobytes() == b"\x00\x01\xffabc"


def test_uint8_array_is_accepted_unchanged():
    value = np.frombuffer(b"hello", dtype=np.uint8)
    assert check("blob", value).tobytes() == b"hello"


@pytest.mark.parametrize(
    "value",
    [np.array([-1, 0, 5, 127, -128], dtype=np.int8), np.array([True, False, True]), np.array([9, 8, 7], np.uint8)],
)
def test_a_one_byte_array_into_bytes_field_is_accepted_with_its_bytes_as_they_are(value):
    result = check("blob", value)
    assert result.dtype == np.uint8 and result.ndim == 1
    assert result.tobytes() == value.tobytes()


def test_a_strided_int8_array_into_bytes_field_keeps_its_values_bytes():
    value = np.array([1, -1, 2, -2, 3, -3], dtype=np.int8)[::2]
    assert check("blob", value).tobytes() == bytes([1, 2, 3])


@pytest.mark.parametrize(
    "value",
    [np.array([1, 2], np.int16), np.array([1.0], np.float32), np.zeros((2, 2), np.int8), np.array(5, np.int8)],
)
def test_a_wider_or_not_1d_array_into_bytes_field_is_rejected(value):
    assert f"bytes field got {describe(value)}; ffcv would cast every value to one byte" in str(rejected("blob", value))


def test_int64_array_into_bytes_field_is_rejected():
    # ffcv would cast each value to one byte (300 -> 44).
    error = rejected("blob", np.array([1, 300, 2], dtype=np.int64))
    assert "ffcv would cast every value to one byte" in str(error)


def test_2d_uint8_array_into_bytes_field_is_rejected():
    assert "bytes field got numpy array dtype=uint8 shape=(2, 2)" in str(rejected("blob", np.zeros((2, 2), np.uint8)))


def test_str_into_bytes_field_is_rejected():
    assert "bytes field got str" in str(rejected("blob", "text"))


@pytest.mark.parametrize("value", [b"", np.zeros(0, dtype=np.uint8)])
def test_empty_bytes_are_rejected(value):
    error = rejected("blob", value)
    assert "value is empty" in str(error)
    assert "corrupted data for this sample's following field" in str(error)


def test_empty_bytes_are_accepted_with_allow_empty():
    result = check("blob_empty", b"")
    assert result.dtype == np.uint8 and result.size == 0


# --- json ----------------------------------------------------------------------------------------


def test_numpy_int_in_json_is_rejected_with_a_hint():
    error = rejected("meta", {"label": np.int64(3)})
    assert "value['label'] is a int64" in str(error)
    assert "json_numpy: convert" in error.fix


def test_numpy_array_in_json_is_rejected():
    assert "value[1] is a numpy array" in str(rejected("meta", [1, np.arange(3)]))


def test_json_numpy_convert_turns_numpy_values_into_python():
    value = {
        "label": np.int64(3),
        "box": np.array([1.5, 2.5], dtype=np.float32),
        "nested": [np.uint8(7), {"b": np.bool_(True)}],
    }
    result = check("meta_conv", value)
    assert result == {"label": 3, "box": [1.5, 2.5], "nested": [7, {"b": True}]}
    assert type(result["label"]) is int and type(result["box"][0]) is float and type(result["nested"][1]["b"]) is bool


@pytest.mark.parametrize("value", [float("nan"), {"x": float("inf")}, [1.0, float("-inf")]])
def test_non_finite_float_in_json_is_rejected(value):
    assert "which JSON cannot represent" in str(rejected("meta", value))


def test_numpy_nan_is_rejected_even_with_convert():
    assert "value is nan, which JSON cannot represent" in str(rejected("meta_conv", np.float64("nan")))


@pytest.mark.parametrize("key", [1, 2.5, None, (1, 2)])
def test_non_str_json_keys_are_rejected(key):
    error = rejected("meta", {key: "a"})
    assert f"value has key {key!r} of type {type(key).__name__}; JSON would turn it into a string" in str(error)


def test_set_in_json_is_rejected():
    assert "value is not JSON-encodable" in str(rejected("meta", {"tags": {1, 2}}))


def test_numpy_str_is_accepted_in_json():
    assert check("meta", np.str_("cat")) == "cat"
    assert check("meta", {np.str_("k"): [np.str_("v")]}) == {"k": ["v"]}


def test_plain_json_is_returned_unchanged():
    value = {"a": [1, 2.5, "x", None, True], "b": {"c": []}}
    assert check("meta", value) == value


# --- arity and mapping ---------------------------------------------------------------------------

ARITY_SPEC = make_spec({"image": {"type": "bytes"}, "label": {"type": "int"}, "score": {"type": "float"}})


def arity_error(sample, spec: DatasetSpec = ARITY_SPEC, index: int = 55) -> SampleError:
    with pytest.raises(SampleError) as info:
        sample_to_tuple(spec, sample, index)
    message = str(info.value)
    assert f"dataset '{spec.name}'" in message and f"sample index {index}" in message
    assert info.value.field is None and info.value.index == index
    return info.value


def test_short_tuple_is_rejected():
    error = arity_error((b"x", 1))
    assert "sample has 2 values but 3 fields are configured ['image', 'label', 'score']" in str(error)


def test_long_tuple_is_rejected():
    assert "sample has 4 values but 3 fields" in str(arity_error((b"x", 1, 0.5, "extra")))


def test_list_sample_of_the_right_length_is_accepted():
    assert sample_to_tuple(ARITY_SPEC, [b"x", 1, 0.5], 0) == (b"x", 1, 0.5)


def test_dict_sample_is_mapped_by_field_name_not_by_iteration_order():
    assert sample_to_tuple(ARITY_SPEC, {"score": 0.5, "label": 1, "image": b"x"}, 0) == (b"x", 1, 0.5)


def test_dict_missing_a_key_is_rejected():
    error = arity_error({"image": b"x", "score": 0.5})
    assert "dict sample has no key 'label'" in str(error)


def test_dict_with_an_unexpected_key_is_rejected():
    error = arity_error({"image": b"x", "label": 1, "score": 0.5, "path": "a.png"})
    assert "dict sample has unexpected key 'path'" in str(error)


def test_sample_keys_map_dict_keys_onto_fields():
    spec = make_spec({"image": {"type": "bytes"}, "label": {"type": "int"}}, sample_keys=["jpg", 0])
    assert sample_to_tuple(spec, {0: 7, "jpg": b"\xff"}, 3) == (b"\xff", 7)
    error = arity_error({"image": b"\xff", "label": 7}, spec=spec, index=3)
    assert "dict sample has no key 'jpg'" in str(error)


@pytest.mark.parametrize("sample", [b"abc", np.zeros(3), 5, None, "abc"])
def test_non_sequence_sample_is_rejected(sample):
    error = arity_error(sample)
    assert f"sample is a {type(sample).__name__}, not a tuple, list or dict" in str(error)


def test_check_sample_checks_every_value_in_field_order():
    assert check_sample(ARITY_SPEC, {"image": b"ab", "label": np.int64(2), "score": np.float32(0.5)}, 9)[1:] == (2, 0.5)
    with pytest.raises(SampleError) as info:
        check_sample(ARITY_SPEC, (b"ab", 2, "0.5"), 9)
    assert (info.value.field, info.value.index) == ("score", 9)
    assert "dataset 'shapes', field 'score', sample index 9: float field got str '0.5'" in str(info.value)


def test_sample_error_survives_pickling_with_its_fields():
    import pickle

    error = rejected("label", 1.5)
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.dataset, copy.field, copy.index, copy.fix) == (error.dataset, error.field, error.index, error.fix)
    assert str(copy) == str(error)


@pytest.mark.parametrize(
    "field,value",
    [
        ("label", 2**64),
        ("label", 1.5),
        ("label", None),
        ("score", 10**400),
        ("score", "x"),
        ("emb", np.zeros((2, 2), np.float32)),
        ("emb", np.zeros((2, 3), np.float64)),
        ("image", np.zeros((8, 8, 5), np.uint8)),
        ("image", np.zeros((8, 8, 4), np.uint8)),
        ("image", np.zeros((3, 8, 8), np.uint8)),
        ("image", np.zeros((8, 0, 3), np.uint8)),
        ("image", np.zeros((8, 70000, 3), np.uint8)),
        ("image_small", np.zeros((1, 400, 3), np.uint8)),
        ("blob", b""),
        ("blob", np.zeros(4, np.float32)),
        ("meta", {"tags": {1, 2}}),
        ("meta", np.int64(3)),
    ],
)
def test_every_rejection_says_what_to_change(field, value):
    assert rejected(field, value).fix, "the error must say what to change"
