"""``kind: parquet``: files, globs and directories, row-group reading, the column rules, fixed
columns, parts of whole row groups, cached fingerprints, and every bad input named by dataset,
field and row (file and row group)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from parquet_samples import IMAGE_FIELDS, NUMERIC_FIELDS, jpeg_crops, numeric_table, write_numeric
from PIL import Image

from betonbuild.config.load import load_config
from betonbuild.errors import ConfigError, SampleError, SourceError
from betonbuild.provenance import ffcv_build
from betonbuild.sources import SOURCE_KINDS, input_files, open_source
from betonbuild.sources.parquet import ParquetSource
from betonbuild.verify import verify_beton
from betonbuild.write.contract import check_sample
from betonbuild.write.writer import write_beton


def make_spec(path, fields=None, name: str = "pq", **source):
    entry = {"source": {"kind": "parquet", "path": path, **source}, "fields": fields or NUMERIC_FIELDS}
    return load_config({"datasets": {name: entry}}).datasets[name]


@pytest.fixture
def two_files(tmp_path: Path) -> Path:
    write_numeric(tmp_path / "data" / "a.parquet", 40, start=0)
    write_numeric(tmp_path / "data" / "b.parquet", 30, start=40)
    return tmp_path / "data"


def test_the_kind_is_registered():
    assert SOURCE_KINDS["parquet"] is ParquetSource


@pytest.mark.parametrize("form", ["directory", "glob", "list"])
def test_a_directory_a_glob_and_a_list_name_the_same_files_in_order(two_files, form):
    path = {
        "directory": str(two_files),
        "glob": str(two_files / "*.parquet"),
        "list": [str(two_files / "a.parquet"), str(two_files / "b.parquet")],
    }[form]
    spec = make_spec(path)
    assert input_files(spec) == [str(two_files / "a.parquet"), str(two_files / "b.parquet")]
    source = open_source(spec)
    assert len(source) == 70
    assert source.shard_counts() == [16, 16, 8, 16, 14]  # row groups of 16 rows, file after file
    ident, score, vec = source[45]
    want = numeric_table(30, start=40)
    assert ident == 45 and score == want["score"][5].as_py()
    np.testing.assert_array_equal(vec, np.asarray(want["vec"][5].as_py(), dtype=np.float32))
    assert vec.dtype == np.float32 and vec.shape == (8,)
    assert check_sample(spec, source[45], 45)[0] == 45


def test_rows_are_read_a_row_group_at_a_time(two_files, monkeypatch):
    source = open_source(make_spec(str(two_files)))
    reads = []
    original = ParquetSource._read_batch
    monkeypatch.setattr(ParquetSource, "_read_batch", lambda self, g, c: reads.append(g) or original(self, g, c))
    for index in range(len(source)):
        source[index]
    assert reads == [0, 1, 2, 3, 4]


def test_fixed_columns_give_every_fixed_field_as_arrays_of_any_rows(two_files):
    source = open_source(make_spec(str(two_files)))
    columns = source.fixed_columns()
    assert sorted(columns) == ["id", "score", "vec"]
    rows = np.array([69, 0, 17, 40, 41])
    np.testing.assert_array_equal(columns["id"][rows], rows)
    assert columns["vec"][rows].shape == (5, 8)
    np.testing.assert_array_equal(columns["vec"][rows][3], source[40][2])


def test_work_items_are_whole_row_groups(two_files):
    source = open_source(make_spec(str(two_files)))
    items = source.work_items(np.arange(70))
    assert [len(item) for item in items] == [16, 16, 8, 16, 14]
    assert items[3][0].tolist() == [40, 40]


def test_dotted_columns_and_text_and_variable_lists(tmp_path):
    table = numeric_table(10).combine_chunks()
    meta = pa.StructArray.from_arrays([table["id"].chunk(0), table["text"].chunk(0)], ["key", "text"])
    pq.write_table(pa.Table.from_arrays([meta, table["tokens"]], ["meta", "tokens"]), tmp_path / "n.parquet")
    fields = {"key": {"type": "int"}, "text": {"type": "json"}, "tokens": {"type": "json"}}
    spec = make_spec(str(tmp_path / "n.parquet"), fields, columns={"key": "meta.key", "text": "meta.text"})
    key, text, tokens = open_source(spec)[3]
    assert (key, text) == (3, "row 3")
    assert tokens.tolist() == [0, 1, 2, 3]  # a variable-length list: one numpy array per row


def test_a_write_and_its_verification_pass(two_files, tmp_path):
    spec = make_spec(str(two_files))
    source = open_source(spec)
    rows = np.arange(len(source))
    write_beton(spec, source, rows, tmp_path / "out.beton", 2, log=open(os.devnull, "w"))
    report = verify_beton(spec, source, rows, str(tmp_path / "out.beton"), ffcv_build())
    assert report["ok"], report


def image_table(n: int):
    """A Hugging Face Image column (struct of bytes and path) of real JPEGs, and a label."""
    encoded = jpeg_crops(n)
    image = pa.StructArray.from_arrays(
        [pa.array(encoded, pa.binary()), pa.array([f"{i}.jpg" for i in range(n)])], ["bytes", "path"]
    )
    return pa.table({"image": image, "label": pa.array(np.arange(n) % 3)}), encoded


def test_an_image_struct_column_is_an_rgb_image_and_its_bytes_are_kept(tmp_path):
    table, encoded = image_table(6)
    pq.write_table(table, tmp_path / "img.parquet", row_group_size=4)
    spec = make_spec(str(tmp_path / "img.parquet"), IMAGE_FIELDS)
    source = open_source(spec)
    image, label = source[5]
    assert np.asarray(image).shape == (32, 32, 3) and label == 2  # PIL's pixels (or PIL's image: the first of a kind)
    assert source.encoded_image(5).tobytes() == encoded[5]
    np.testing.assert_array_equal(check_sample(spec, source[5], 5)[0], np.asarray(image))
    by_bytes = make_spec(str(tmp_path / "img.parquet"), IMAGE_FIELDS, columns={"image": "image.bytes"})
    assert open_source(by_bytes).encoded_image(0).tobytes() == encoded[0]
    rows = np.arange(6)
    write_beton(spec, source, rows, tmp_path / "img.beton", 1, log=open(os.devnull, "w"))
    assert verify_beton(spec, source, rows, str(tmp_path / "img.beton"), ffcv_build())["ok"]


def test_colour_jpegs_of_an_image_column_are_pil_s_pixels_and_the_rest_pil_s_images(tmp_path, monkeypatch):
    """Re-encoded images are decoded by libjpeg-turbo directly where that gives PIL's pixels
    (betonbuild.sources.jpeg, as image folders and shards are); grey, CMYK and PNG rows stay PIL's."""
    from wds_samples import image_payloads  # why: the shards' real photos in every JPEG flavour

    import betonbuild.sources.jpeg as jpeg_module
    from betonbuild.sources.jpeg import jpeg_kind

    names = sorted(image_payloads())
    payloads = [image_payloads()[name][1] for name in names]
    image = pa.StructArray.from_arrays([pa.array(payloads, pa.binary()), pa.array(names)], ["bytes", "path"])
    labels = pa.array(np.zeros(len(names), np.int64))
    pq.write_table(pa.table({"image": image, "label": labels}), tmp_path / "p.parquet")
    monkeypatch.setattr(jpeg_module, "JPEG_KINDS", {})
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 89_478_485)  # PIL's default: another test's adapter lowers it
    calls: list[int] = []
    real = jpeg_module.fast_rgb8
    monkeypatch.setattr(jpeg_module, "fast_rgb8", lambda data: calls.append(1) or real(data))
    source = open_source(make_spec(str(tmp_path / "p.parquet"), IMAGE_FIELDS))
    direct = 0
    for index, (name, payload) in enumerate(zip(names, payloads)):
        decoded = source[index][0]
        with Image.open(io.BytesIO(payload)) as expected:
            expected.load()
            if isinstance(decoded, np.ndarray):
                direct += 1
                assert expected.mode == "RGB" and np.array_equal(decoded, np.asarray(expected)), name
            else:
                assert decoded.mode == expected.mode and np.array_equal(np.asarray(decoded), np.asarray(expected)), name
    colour = [p for p in payloads if (kind := jpeg_kind(p)) is not None and kind[1] == 3]
    assert len(colour) >= 20 and len(calls) == len(colour)
    assert direct == len(colour) - len({jpeg_kind(p) for p in colour})  # the first of each kind: PIL's, compared


# -- fingerprints --------------------------------------------------------------------------------


def test_fingerprints_change_with_the_file_they_cover_and_hashes_are_cached(two_files, tmp_path):
    cache_dir = tmp_path / "results"
    cache_dir.mkdir()
    spec = make_spec(str(two_files))
    source = ParquetSource.open(spec, cache_dir)
    inputs = source.inputs_fingerprint()
    first_part, second_part = (
        source.part_fingerprint(np.arange(40), inputs),
        source.part_fingerprint(np.arange(40, 70), inputs),
    )
    assert (cache_dir / ".parquet-cache.json").exists()

    hashed = []
    import betonbuild.sources.cached_hashes as cached

    original = cached.sha256_file
    cached.sha256_file = lambda path: hashed.append(path) or original(path)
    try:
        assert ParquetSource.open(spec, cache_dir).inputs_fingerprint() == inputs  # nothing read again
        assert hashed == []
        time.sleep(0.01)
        write_numeric(two_files / "b.parquet", 30, start=1000)  # same size and shape, other values
        again = ParquetSource.open(spec, cache_dir)
        changed = again.inputs_fingerprint()
        assert hashed == [str(two_files / "b.parquet")]
    finally:
        cached.sha256_file = original
    assert changed["sha256"] != inputs["sha256"]
    assert again.part_fingerprint(np.arange(40), changed) == first_part
    assert again.part_fingerprint(np.arange(40, 70), changed) != second_part


def test_a_fingerprint_without_reading_counts_the_files_and_hashes_none(two_files, tmp_path, monkeypatch):
    import betonbuild.sources.cached_hashes as cached

    monkeypatch.setattr(cached, "sha256_file", lambda path: pytest.fail(f"{path} was read for its digest"))
    counted = ParquetSource.open(make_spec(str(two_files)), tmp_path).inputs_fingerprint(read_files=False)
    sizes = sum(p.stat().st_size for p in two_files.glob("*.parquet"))
    assert counted == {"files": 2, "bytes": sizes, "sha256": None}  # the CLI's direct write


# -- config errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source, message",
    [
        ({"path": "hf://datasets/x/train.parquet"}, "is a URL"),
        ({"path": "a.parquet", "columns": {"nope": "id"}}, r"columns: names \['nope'\], which are not fields"),
    ],
)
def test_config_errors_name_the_key(source, message):
    with pytest.raises(ConfigError, match=message):
        make_spec(**source)


@pytest.mark.parametrize("writer", [{"shuffle": True}, {"indices": [0, 1]}])
def test_shuffle_and_indices_are_refused(writer):
    entry = {"source": {"kind": "parquet", "path": "a.parquet"}, "fields": NUMERIC_FIELDS, "writer": writer}
    with pytest.raises(ConfigError, match="written in row order"):
        load_config({"datasets": {"pq": entry}})


# -- bad input -----------------------------------------------------------------------------------


def test_a_truncated_file_is_named(two_files):
    path = two_files / "b.parquet"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(SourceError, match=r"dataset 'pq': .*b\.parquet is not a readable Parquet file \(truncated"):
        open_source(make_spec(str(two_files)))


def test_a_file_that_is_not_parquet_is_named(tmp_path):
    (tmp_path / "x.parquet").write_text("id,score\n1,2.0\n")
    with pytest.raises(SourceError, match=r"x\.parquet is not a readable Parquet file"):
        open_source(make_spec(str(tmp_path / "x.parquet")))


def test_a_missing_column_lists_the_columns(two_files):
    spec = make_spec(str(two_files), {"id": {"type": "int"}, "label": {"type": "int"}})
    with pytest.raises(SourceError) as caught:
        open_source(spec)
    text = str(caught.value)
    assert "field 'label' reads column 'label'" in text and "a.parquet does not have" in text
    assert "['id', 'score', 'vec', 'tokens', 'text']" in text and "source.columns.label" in text


def test_a_float64_column_into_an_int_field_is_refused(two_files):
    spec = make_spec(str(two_files), {"score": {"type": "int"}})
    with pytest.raises(
        SourceError,
        match=r"field 'score' \(int\) reads column 'score' .* holds double; a int field "
        "needs an integer column",
    ):
        open_source(spec)


def test_a_list_of_another_dtype_or_size_into_an_ndarray_field_is_refused(two_files):
    with pytest.raises(SourceError, match="needs float64 elements. Fix: set the field's dtype to float32"):
        open_source(make_spec(str(two_files), {"vec": {"type": "ndarray", "dtype": "float64", "shape": [8]}}))
    with pytest.raises(SourceError, match=r"needs 4 elements per row \(shape \[2, 2\]\), not 8"):
        open_source(make_spec(str(two_files), {"vec": {"type": "ndarray", "dtype": "float32", "shape": [2, 2]}}))


def test_a_null_is_refused_when_the_source_opens_naming_the_row(tmp_path):
    table = numeric_table(40)
    scores = table["score"].to_pylist()
    scores[37] = None
    pq.write_table(table.set_column(1, "score", pa.array(scores)), tmp_path / "n.parquet", row_group_size=16)
    started = time.monotonic()
    with pytest.raises(SampleError) as caught:
        open_source(make_spec(str(tmp_path / "n.parquet")))
    assert time.monotonic() - started < 5
    error = caught.value
    assert (error.dataset, error.field, error.index) == ("pq", "score", 37)
    assert "column 'score' is null in this row" in str(error)
    assert "n.parquet, row group 2, row 37 of the file" in str(error)


def test_list_lengths_that_do_not_fit_an_ndarray_field_are_refused_by_row(tmp_path):
    table = numeric_table(20)
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=8)
    fields = {"tokens": {"type": "ndarray", "dtype": "int32", "shape": [3]}}
    source = open_source(make_spec(str(tmp_path / "t.parquet"), fields))
    assert source[2][0].tolist() == [0, 1, 2]  # rows of exactly 3 elements read
    with pytest.raises(SampleError) as caught:
        source[9]
    error = caught.value
    assert (error.field, error.index) == ("tokens", 9)
    assert "holds 5 elements in this row; the field's shape [3] needs 3" in str(error)
    assert "row group 1, row 9 of the file" in str(error) and "ragged_ndarray" in str(error)


def test_a_null_element_inside_a_list_is_refused_by_row(tmp_path):
    vec = [[1.0, 2.0]] * 5
    vec[3] = [1.0, None]
    pq.write_table(pa.table({"vec": pa.array(vec, pa.list_(pa.float32()))}), tmp_path / "v.parquet")
    source = open_source(
        make_spec(str(tmp_path / "v.parquet"), {"vec": {"type": "ndarray", "dtype": "float32", "shape": [2]}})
    )
    assert source[2][0].tolist() == [1.0, 2.0]
    with pytest.raises(SampleError, match=r"sample index 3 .*column 'vec' has a null element in this row"):
        source[3]


def test_a_damaged_row_group_is_named(two_files):
    path = two_files / "a.parquet"
    metadata = pq.ParquetFile(path).metadata
    offset = metadata.row_group(1).column(1).data_page_offset
    data = bytearray(path.read_bytes())
    data[offset : offset + 64] = b"\xff" * 64
    path.write_bytes(bytes(data))
    source = open_source(make_spec(str(two_files)))
    with pytest.raises(
        SampleError, match=r"sample index 16 .*a\.parquet, row group 1, row 16 of the file\): cannot read"
    ):
        source[20]


def test_an_image_that_does_not_decode_is_named(tmp_path):
    table, _ = image_table(4)
    broken = pa.StructArray.from_arrays([pa.array([b"not a jpeg"] * 4), pa.array(["x"] * 4)], ["bytes", "path"])
    pq.write_table(table.set_column(0, "image", broken), tmp_path / "b.parquet")
    with pytest.raises(SampleError, match=r"field 'image', sample index 1 .*cannot decode its image bytes"):
        open_source(make_spec(str(tmp_path / "b.parquet"), IMAGE_FIELDS))[1]


@pytest.mark.parametrize("kind", ["parquet", "huggingface"])
def test_a_source_without_path_is_a_config_error(kind):
    with pytest.raises(ConfigError, match=r"datasets.pq.source.path: is required"):
        load_config({"datasets": {"pq": {"source": {"kind": kind}, "fields": NUMERIC_FIELDS}}})


def test_a_fixed_column_with_a_bad_row_is_refused_not_filled(tmp_path):
    table = numeric_table(20)
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=8)
    fields = {"tokens": {"type": "ndarray", "dtype": "int32", "shape": [3]}}
    column = open_source(make_spec(str(tmp_path / "t.parquet"), fields)).fixed_columns()["tokens"]
    with pytest.raises(
        SampleError,
        match=r"sample index 0 \(file .*t\.parquet, row group 0, row 0 of the file\): "
        "column 'tokens' holds 1 elements",
    ):
        column[np.arange(4)]


def test_source_jpeg_keep_stores_an_image_columns_jpeg_bytes_unchanged(tmp_path):
    from betonbuild.beton.format import BetonFile

    table, encoded = image_table(6)
    pq.write_table(table, tmp_path / "img.parquet", row_group_size=4)
    fields = {**IMAGE_FIELDS, "image": {**IMAGE_FIELDS["image"], "write_mode": "jpg", "source_jpeg": "keep"}}
    spec = make_spec(str(tmp_path / "img.parquet"), fields)
    source = open_source(spec)
    rows = np.arange(6)
    record = write_beton(spec, source, rows, tmp_path / "kept.beton", 2, log=open(os.devnull, "w"))
    assert record["source_jpeg"]["image"]["kept"] == 6
    beton = BetonFile(str(tmp_path / "kept.beton"))
    assert [bytes(beton.variable_payload("image", i)) for i in rows] == encoded
    report = verify_beton(spec, source, rows, str(tmp_path / "kept.beton"), ffcv_build())
    assert report["ok"], report


def test_columns_are_read_without_importing_pandas_and_equal_pyarrows_own_conversion(two_files, tmp_path):
    """pyarrow's to_numpy imports pandas (seconds per writer worker on a busy machine): the columns
    are read from the Arrow buffers, sliced arrays and booleans included, with the same values."""
    kinds = {
        "i16": pa.array([3, 1, 4, 1, 5, 9, 2, 6, 5], pa.int16()),
        "f32": pa.array([0.5, 2.5, -1.0, 7.0, 0.0, 1.5, 2.0, 3.0, 4.0], pa.float32()),
        "flag": pa.array([True, False, True, True, False, False, True, False, True]),
        "maybe": pa.array([1, None, 3, None, 5, 6, 7, None, 9]),
        "lists": pa.array([[1, 2], [3], [], [4, 5, 6], [7], [8], [9, 10], [11], [12]]),
    }
    pq.write_table(pa.table(kinds), tmp_path / "kinds.parquet")
    code = (
        "import json, sys\n"
        "import numpy as np, pyarrow.parquet as pq\n"
        "from betonbuild.sources.arrow_columns import to_numpy\n"
        "from betonbuild.config.load import load_config\n"
        "from betonbuild.sources import open_source\n"
        f"entry = {{'source': {{'kind': 'parquet', 'path': {str(two_files)!r}}}, 'fields': {NUMERIC_FIELDS!r}}}\n"
        "source = open_source(load_config({'datasets': {'pq': entry}}).datasets['pq'])\n"
        "rows = [source[i] for i in range(len(source))]\n"
        "fixed = {name: column[np.arange(len(source))] for name, column in source.fixed_columns().items()}\n"
        f"table = pq.ParquetFile({str(tmp_path / 'kinds.parquet')!r}).read().combine_chunks()\n"
        "columns = [table[name].chunk(0) for name in table.column_names]\n"
        "arrays = [a.slice(s, n) for a in columns[:3] for s, n in ((0, 9), (3, 5), (2, 0))]\n"
        "arrays += [columns[3].is_null(), columns[4].offsets, columns[4].slice(2, 4).offsets]\n"
        "mine = [to_numpy(a) for a in arrays]\n"
        "without = 'pandas' not in sys.modules\n"
        "same = [m.dtype == a.to_numpy(zero_copy_only=False).dtype and m.tolist() == a.to_pylist()\n"
        "        for m, a in zip(mine, arrays)]\n"
        "print(json.dumps([without, same, len(rows), int(rows[45][0]), int(fixed['id'][69])]))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(result.stdout) == [True, [True] * 12, 70, 45, 69]


def test_sample_sizes_come_from_the_footers_and_the_heaviest_row_groups(tmp_path, two_files):
    """Bytes per row for the pre-flight's largest samples: the rows' own lengths in the 8 row groups
    heaviest per row, elsewhere the footer's chunk sizes spread over each row group's rows (scaled)."""
    rng = np.random.default_rng(5)
    lengths = [100 + 10 * i + (40 if i % 4 == 1 else 0) for i in range(80)]  # 20 row groups of 4
    blobs = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in lengths]
    pq.write_table(pa.table({"blob": pa.array(blobs, pa.binary())}), tmp_path / "b.parquet", row_group_size=4)
    source = open_source(make_spec(str(tmp_path / "b.parquet"), {"blob": {"type": "bytes"}}))
    sizes = source.sample_sizes()
    assert sizes[48:].tolist() == lengths[48:]  # row groups 12-19, read
    for group in range(12):  # estimated: about the mean (page headers, min/max statistics scaled out)
        mean = np.mean(lengths[4 * group : 4 * group + 4])
        assert (sizes[4 * group : 4 * group + 4] == sizes[4 * group]).all() and 0.8 * mean < sizes[
            4 * group
        ] < 1.2 * mean
    from betonbuild.write.preflight import largest_rows  # noqa: PLC0415 - the caller, used by this test only

    assert largest_rows(source, np.arange(80)).tolist() == sorted(np.argsort(lengths)[-8:].tolist())
    assert not open_source(make_spec(str(two_files))).sample_sizes().any()  # no binary column: no size to tell
