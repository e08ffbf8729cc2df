"""The ragged decoder through the real ffcv.Loader (2 workers, random order, the last partial batch
kept, several epochs so every batch buffer is reused): each row is the stored array, padded with
exactly the pad value, whether the array is one run of the padded row (ndim 1, or all but the
first dimension full size) or one run per row; serial (small rows) and parallel (large rows);
int_list's ``pad_value`` from the config to the Loader."""

from __future__ import annotations

import numpy as np
import pytest

from betonbuild.config.load import load_config
from betonbuild.errors import ConfigError
from betonbuild.fields.decoders import PARALLEL_ROW_BYTES
from betonbuild.fields.ragged_field import IntListField, RaggedArrayField
from betonbuild.loading import loader_fields, loader_pipelines, unpad
from betonbuild.sources import open_source
from betonbuild.write.writer import write_beton


def ffcv_write(path, field, values) -> None:
    from ffcv.fields import IntField
    from ffcv.writer import DatasetWriter

    class Samples:
        def __len__(self):
            return len(values)

        def __getitem__(self, i):
            return values[i], i

    DatasetWriter(str(path), {"x": field, "i": IntField()}, num_workers=2).from_indexed_dataset(Samples())


def loader(path, batch_size: int, custom=None, pipelines=None):
    from ffcv.loader import Loader, OrderOption

    return Loader(
        str(path),
        batch_size=batch_size,
        num_workers=2,
        order=OrderOption.RANDOM,
        drop_last=False,
        custom_fields=custom or loader_fields(path),
        pipelines=pipelines if pipelines is not None else loader_pipelines(path),
    )


def padded(value: np.ndarray, shape: tuple, pad) -> np.ndarray:
    out = np.full(shape, pad, dtype=value.dtype)
    out[tuple(slice(0, s) for s in value.shape)] = value
    return out


def assert_epochs_equal(path, values, pad, batch_size: int, epochs: int = 3) -> None:
    padded_shape = tuple(max(v.shape[d] for v in values) for d in range(values[0].ndim))
    batches = loader(path, batch_size)
    for _ in range(epochs):
        seen = []
        for x, i, shape in batches:
            assert x.shape[1:] == padded_shape
            for row, index, row_shape in zip(x.numpy(), i.numpy().reshape(-1), shape.numpy()):
                want = values[int(index)]
                assert tuple(row_shape) == want.shape
                assert np.array_equal(row, padded(want, padded_shape, pad)), f"sample {index}"
                seen.append(int(index))
        assert sorted(seen) == list(range(len(values)))


@pytest.mark.parametrize("elements", [40, PARALLEL_ROW_BYTES])  # serial, then parallel
def test_every_shape_of_every_dimension_is_copied_and_padded_exactly(tmp_path, elements: int):
    rng = np.random.default_rng(19)
    values = []
    for k in range(53):
        # dense (trailing dimensions at their largest) and strided cases, empty ones, the largest
        shape = (int(rng.integers(0, 6)), 4 if k % 3 == 0 else int(rng.integers(1, 5)), int(rng.integers(1, 3)))
        if k == 7:
            shape = (5, 4, 2)
        values.append(rng.integers(-(2**31), 2**31 - 1, size=shape, dtype=np.int32))
    field = RaggedArrayField("<i4", 3, 5 * 4 * 2)
    scale = max(1, elements // 40)
    if scale > 1:  # rows of PARALLEL_ROW_BYTES and more: the same shapes, the first dimension longer
        values = [np.tile(v, (scale, 1, 1)) for v in values]
        field = RaggedArrayField("<i4", 3, 5 * 4 * 2 * scale)
    assert (5 * scale * 4 * 2 * 4 >= PARALLEL_ROW_BYTES) == (scale > 1)
    ffcv_write(tmp_path / "r.beton", field, values)
    assert_epochs_equal(tmp_path / "r.beton", values, 0, batch_size=8)


def test_one_dimensional_floats_long_rows_then_short_ones_leave_no_stale_values(tmp_path):
    rng = np.random.default_rng(3)
    # the first batches long, the last short, over 3 epochs in random order: a buffer row that held
    # a long value holds a short one later, and its tail must be zeros again
    values = [rng.standard_normal(int(n)).astype(np.float32) + 1 for n in [30] * 20 + list(rng.integers(0, 4, 21))]
    ffcv_write(tmp_path / "f.beton", RaggedArrayField("<f4", 1, 30), values)
    assert_epochs_equal(tmp_path / "f.beton", values, 0, batch_size=4)


def test_the_field_class_refuses_a_pad_value_its_dtype_cannot_hold():
    with pytest.raises(ValueError, match="pad_value 300"):
        IntListField("|u1", 1, 4, pad_value=300)
    with pytest.raises(ValueError, match="pad_value -1"):
        RaggedArrayField("<f4", 1, 4, pad_value=-1)
    assert "pad_value" not in IntListField("<i8", 1, 4).arguments(), "files without it keep their arguments"


ADAPTER = """
class Lists:
    def __len__(self):
        return 29

    def __getitem__(self, i):
        return {"tokens": list(range(i % 7 * 3, i % 7 * 4)), "label": i}


def make():
    return Lists()
"""


def spec_of(tokens: dict):
    fields = {"tokens": {"type": "int_list", "max_elements": 8, **tokens}, "label": {"type": "int"}}
    source = {"kind": "python", "factory": "lists_adapter:make"}
    return load_config({"datasets": {"k": {"source": source, "fields": fields}}}).datasets["k"]


def test_int_list_pad_value_from_the_config_fills_the_loader_batch(tmp_path, monkeypatch):
    (tmp_path / "lists_adapter.py").write_text(ADAPTER)
    monkeypatch.chdir(tmp_path)
    spec = spec_of({"dtype": "int16", "pad_value": -100})
    source = open_source(spec)
    write_beton(spec, source, np.arange(len(source)), tmp_path / "k.beton", 2, log=open("/dev/null", "w"))
    seen = []
    for tokens, label, lengths in loader(tmp_path / "k.beton", batch_size=8):
        assert tokens.shape[1:] == (6,) and str(tokens.dtype) == "torch.int16"
        for row, i, n, exact in zip(tokens.numpy(), label.numpy().reshape(-1), lengths, unpad(tokens, lengths)):
            want = source[int(i)]["tokens"]
            assert exact.tolist() == want and n == len(want)
            assert row[len(want) :].tolist() == [-100] * (6 - len(want)), f"sample {i}: {row}"
            seen.append(int(i))
    assert sorted(seen) == list(range(29))
    stored = IntListField("<i2", 1, 8, pad_value=-100)
    assert stored.loader_item_equal(np.array([1, 2, -100], np.int16), np.array([1, 2], np.int16))
    assert not stored.loader_item_equal(np.array([1, 2, 0], np.int16), np.array([1, 2], np.int16))


def test_pad_value_zero_is_the_default_and_leaves_the_options_as_they_were():
    assert "pad_value" not in spec_of({}).fields[0].options
    assert "pad_value" not in spec_of({"pad_value": 0}).fields[0].options
    assert spec_of({"pad_value": -1}).fields[0].options["pad_value"] == -1


@pytest.mark.parametrize(
    "tokens, where",
    [
        ({"dtype": "uint8", "pad_value": -1}, "pad_value.*does not fit in uint8"),
        ({"pad_value": -1, "multi_hot": 5}, "pad_value.*multi_hot"),
        ({"pad_value": 1.5}, "pad_value"),
    ],
)
def test_a_pad_value_that_cannot_apply_is_a_config_error_naming_the_key(tokens: dict, where: str):
    with pytest.raises(ConfigError, match=where):
        spec_of(tokens)
