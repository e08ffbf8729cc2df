"""ragged_ndarray, int_list, text, gray_image: written, verified, inspected and read through the real
ffcv.Loader (2 workers, random order, the last partial batch kept), every sample against the source."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from betonbuild.beton.describe import as_text, describe
from betonbuild.beton.digest import content_digest
from betonbuild.beton.format import BetonFile
from betonbuild.beton.merge import merge_betons
from betonbuild.config.load import load_config
from betonbuild.errors import ConfigError, SampleError
from betonbuild.fields.custom import custom_handlers
from betonbuild.loading import loader_fields, loader_pipelines, texts, unpad
from betonbuild.provenance import ffcv_build
from betonbuild.sources import open_source
from betonbuild.verify import verify_beton
from betonbuild.write.contract import check_value
from betonbuild.write.preflight import survey_samples
from betonbuild.write.writer import write_beton

ADAPTER = textwrap.dedent(
    '''
    import numpy as np
    from skimage import data

    PHOTOS = [data.camera(), data.coins(), data.moon(), data.page(), data.text()]


    class AllKinds:
        """Every shipped kind, empty values included; ``tamper`` changes one field of sample 5."""

        def __init__(self, n, tamper=None):
            self.n, self.tamper = n, tamper

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            rng = np.random.default_rng(i)
            photo = PHOTOS[i % 5]
            sample = {
                "points": rng.standard_normal((int(rng.integers(0, 6)), 3)).astype(np.float32),
                "tokens": [int(t) for t in rng.integers(0, 50, size=int(rng.integers(0, 9)))],
                "labels": rng.choice(10, size=int(rng.integers(1, 4)), replace=False),
                "caption": ["", "naïve\\0café\\0", "日本語 " * (i % 4), "x" * (i % 30)][i % 4],
                "blob": bytes(range(i % 40 + 1)),
                "raw": np.ascontiguousarray(photo[: 64 + i % 9, : 80 - i % 7]),
                "jpeg": np.ascontiguousarray(photo[: 40 + i % 5, : 50 + i % 3])[:, :, None],
                "label": i,
            }
            if i == 5 and self.tamper:
                value = sample[self.tamper]
                if isinstance(value, str):
                    sample[self.tamper] = value + "!"
                elif isinstance(value, list):
                    sample[self.tamper] = value + [1]
                elif self.tamper == "labels":
                    sample[self.tamper] = np.array([9, 8, 7, 6])
                elif value.dtype == np.uint8:
                    sample[self.tamper] = 255 - value  # every pixel changes: far beyond a JPEG's error
                else:
                    sample[self.tamper] = np.zeros((7, 3), np.float32)
            return sample


    def make(n=30, tamper=None):
        return AllKinds(n, tamper)
    '''
)

FIELDS = {
    "points": {"type": "ragged_ndarray", "dtype": "float32", "ndim": 2, "max_shape": [8, 3]},
    "tokens": {"type": "int_list", "max_elements": 16},
    "labels": {"type": "int_list", "dtype": "int16", "max_elements": 4, "multi_hot": 10},
    "caption": {"type": "text", "max_bytes": 64},
    "blob": {"type": "bytes"},
    "raw": {"type": "gray_image"},
    "jpeg": {"type": "gray_image", "write_mode": "jpg", "jpeg_quality": 95},
    "label": {"type": "int"},
}
SHIPPED = ["points", "tokens", "labels", "caption", "raw", "jpeg"]


@pytest.fixture
def project(tmp_path: Path, monkeypatch) -> Path:
    (tmp_path / "kinds_adapter.py").write_text(ADAPTER)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def spec_of(n: int = 30, fields: dict | None = None, **args):
    source = {"kind": "python", "factory": "kinds_adapter:make", "args": {"n": n, **args}}
    return load_config({"datasets": {"k": {"source": source, "fields": fields or FIELDS}}}).datasets["k"]


def write(spec, path: Path, workers: int = 2):
    source = open_source(spec)
    rows = np.arange(len(source))
    write_beton(spec, source, rows, path, workers, log=open("/dev/null", "w"))
    return source, rows


def check(report: dict, name: str) -> dict:
    return next(c for c in report["checks"] if c["name"] == name)


def test_every_kind_read_through_ffcv_loader_with_two_workers_in_random_order_equals_the_source(project: Path):
    from ffcv.loader import Loader, OrderOption

    spec = spec_of(37)
    source, _ = write(spec, project / "k.beton")
    path = str(project / "k.beton")
    assert set(loader_fields(path)) == set(SHIPPED)
    loader = Loader(
        path,
        batch_size=8,
        num_workers=2,
        order=OrderOption.RANDOM,
        drop_last=False,
        custom_fields=loader_fields(path),
        pipelines=loader_pipelines(path),
    )
    extra = ["points_shape", "tokens_len", "labels_len", "caption_len", "blob_len", "raw_shape", "jpeg_shape"]
    assert list(loader_pipelines(path)) == extra, "the Loader yields them after the file's fields, in this order"
    names = list(FIELDS) + extra
    seen = []
    for batch in loader:
        out = dict(zip(names, batch))
        assert out["raw"].shape[1:] == (72, 80, 1) and out["labels"].shape[1:] == (10,)
        for k, i in enumerate(out["label"].numpy().reshape(-1)):
            want = source[int(i)]
            seen.append(int(i))
            assert np.array_equal(unpad(out["points"], out["points_shape"])[k], want["points"])
            assert unpad(out["tokens"], out["tokens_len"])[k].tolist() == want["tokens"]
            assert np.flatnonzero(out["labels"][k].numpy()).tolist() == sorted(want["labels"].tolist())
            assert out["labels_len"][k] == len(want["labels"])
            assert texts(out["caption"], out["caption_len"])[k] == want["caption"]
            assert unpad(out["blob"], out["blob_len"])[k].tobytes() == want["blob"]
            assert np.array_equal(unpad(out["raw"], out["raw_shape"])[k][:, :, 0], want["raw"])
            jpeg = unpad(out["jpeg"], out["jpeg_shape"])[k].astype(np.int16)
            assert jpeg.shape == want["jpeg"].shape and np.abs(jpeg - want["jpeg"]).mean() < 2
    assert sorted(seen) == list(range(37)), "every sample once, the last partial batch included"


def test_plain_ffcv_bytes_decoder_still_pads_to_the_batch_and_reader_takes_the_same_mapping(project: Path):
    from ffcv.loader import Loader, OrderOption
    from ffcv.reader import Reader

    spec = spec_of(12)
    write(spec, project / "k.beton", workers=1)
    path = str(project / "k.beton")
    reader = Reader(path, custom_handlers=loader_fields(path))
    assert list(reader.metadata["f3"]["shape"][:4, 0]) == [0, 13, 20, 3]  # caption: its UTF-8 bytes
    loader = Loader(path, batch_size=12, order=OrderOption.SEQUENTIAL, custom_fields=loader_fields(path))
    blob = next(iter(loader))[4].numpy()
    assert blob.shape == (12, 12), "ffcv's own BytesDecoder: every item padded to the largest"


def test_full_verification_passes_and_the_content_digest_ignores_the_layout(project: Path):
    spec = spec_of(30)
    source, rows = write(spec, project / "two.beton", workers=2)
    write(spec, project / "one.beton", workers=1)
    report = verify_beton(spec, source, rows, str(project / "two.beton"), ffcv_build(), every_variable_sample=True)
    assert report["ok"], [c for c in report["checks"] if not c["ok"]]
    variable = check(report, "variable_fields")
    assert variable["detail"].startswith("every sample of") and "JPEG mean absolute error" in variable["detail"]
    assert all(variable["fields"][name]["compared"] == 30 for name in SHIPPED)
    loader_batch = check(report, "loader_batch")["detail"]
    assert "equal to the file's decoded content, and their shapes and lengths ['points_shape'" in loader_batch
    handlers = custom_handlers(spec)
    digests = {content_digest(BetonFile(project / f, custom_handlers=handlers)) for f in ("one.beton", "two.beton")}
    assert len(digests) == 1


@pytest.mark.parametrize("field", SHIPPED)
def test_verification_finds_a_changed_value_of_each_kind(project: Path, field: str):
    write(spec_of(12), project / "k.beton", workers=1)
    changed = spec_of(12, tamper=field)
    source = open_source(changed)
    report = verify_beton(changed, source, np.arange(12), str(project / "k.beton"), ffcv_build(), True)
    variable = check(report, "variable_fields")
    assert not variable["ok"] and f"field '{field}' sample 5" in variable["detail"], variable["detail"]
    assert variable["fields"][field]["mismatches"] == 1


def test_a_changed_payload_byte_fails_verification_and_the_loader_batch(project: Path):
    spec = spec_of(12)
    source, rows = write(spec, project / "k.beton", workers=1)
    beton = BetonFile(project / "k.beton", custom_handlers=custom_handlers(spec))
    ptr = int(beton.metadata["raw"]["ptr"][3])
    del beton
    with open(project / "k.beton", "r+b") as fh:
        fh.seek(ptr + 10)
        byte = fh.read(1)
        fh.seek(ptr + 10)
        fh.write(bytes([byte[0] ^ 0xFF]))
    report = verify_beton(spec, source, rows, str(project / "k.beton"), ffcv_build(), True)
    assert "field 'raw' sample 3" in check(report, "variable_fields")["detail"]


SAMPLE_ERRORS = [
    ("points", np.zeros((2, 3)), "dtype float64 does not match the field's float32"),
    ("points", np.zeros(3, np.float32), "1 dimension"),
    ("points", np.zeros((9, 3), np.float32), "holds 27 elements; the field's max_elements is 24"),
    ("points", [[1.0, 2.0, 3.0]], "ragged_ndarray field got list"),
    ("tokens", [1, 2.5], "not an integer"),
    ("tokens", list(range(17)), "holds 17 elements"),
    ("tokens", [[1, 2]], "not an integer"),
    ("labels", [3, 10], "outside 0..9"),
    ("labels", [40000], "do not fit the field's dtype int16"),
    ("caption", "caf\udce9", "not valid UTF-8 text"),
    ("caption", b"caf\xe9", "bytes that are not UTF-8"),
    ("caption", "é" * 33, "is 66 UTF-8 bytes; the field's max_bytes is 64"),
    ("caption", 7, "text field got int"),
    ("raw", np.zeros((4, 4, 3), np.uint8), "3 channels, not 1"),
    ("raw", np.zeros((4, 4), np.uint16), "images are uint8"),
]


@pytest.mark.parametrize("name, value, why", SAMPLE_ERRORS, ids=[f"{n}-{w[:24]}" for n, _, w in SAMPLE_ERRORS])
def test_the_sample_contract_names_dataset_field_index_and_a_fix(name: str, value, why: str):
    spec = spec_of()
    field = next(f for f in spec.fields if f.name == name)
    with pytest.raises(SampleError) as caught:
        check_value("k", field, value, 17)
    text = str(caught.value)
    assert why in text and "'k'" in text and name in text and "17" in text
    assert caught.value.fix


def test_a_pil_rgb_image_into_gray_image_is_refused_and_pil_l_is_stored():
    from PIL import Image

    spec = spec_of()
    field = next(f for f in spec.fields if f.name == "raw")
    with pytest.raises(SampleError, match="mode RGB, not L.*convert\\('L'\\)"):
        check_value("k", field, Image.new("RGB", (4, 3)), 0)
    assert check_value("k", field, Image.new("L", (4, 3), 7), 0).shape == (3, 4)


@pytest.mark.parametrize(
    "entry, where",
    [
        ({"type": "ragged_ndarray", "dtype": "float32", "ndim": 2}, "give max_elements"),
        ({"type": "ragged_ndarray", "dtype": "float32", "ndim": 2, "max_shape": [3]}, "max_shape"),
        ({"type": "ragged_ndarray", "dtype": ">f4", "ndim": 1, "max_elements": 3}, "big-endian"),
        ({"type": "int_list", "dtype": "float32", "max_elements": 3}, "not an integer dtype"),
        ({"type": "int_list", "dtype": "uint8", "max_elements": 3, "multi_hot": 300}, "do not fit"),
        ({"type": "gray_image", "write_mode": "smart"}, "smart_threshold"),
    ],
)
def test_config_errors_name_the_key(entry: dict, where: str):
    with pytest.raises(ConfigError, match=where):
        spec_of(fields={"x": entry})


def test_the_preflight_survey_refuses_a_ragged_value_larger_than_a_page(project: Path):
    fields = {"points": {"type": "ragged_ndarray", "dtype": "uint8", "ndim": 1, "max_elements": 1 << 23}}
    source = {"kind": "python", "factory": "kinds_adapter:make"}
    entry = {"source": source, "fields": fields, "writer": {"page_size": "2MiB"}}
    spec = load_config({"datasets": {"k": entry}}).datasets["k"]

    class Big:
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return {"points": np.zeros((3 << 20) if i else 5, np.uint8)}

    with pytest.raises(SampleError, match="points") as caught:
        survey_samples(spec, Big(), np.arange(2))
    assert caught.value.index == 1
    assert survey_samples(spec, Big(), np.arange(1))["fields"]["points"]["bytes"]["max"] > 5


def test_inspect_describes_and_decodes_every_kind_without_custom_options(project: Path):
    write(spec_of(6), project / "k.beton", workers=1)
    path = str(project / "k.beton")
    info = describe(BetonFile(path, custom_handlers=loader_fields(path)), samples=2)
    types = {f["name"]: f["type"] for f in info["fields"]}
    assert types == {name: entry["type"] for name, entry in FIELDS.items()}
    points = next(f for f in info["fields"] if f["name"] == "points")
    assert points["arguments"]["max_shape"] == [8, 3] and points["padded_shape"][1] == 3
    second = info["samples"][1]["fields"]
    assert second["caption"] == repr("naïve\0café\0") and second["raw"].startswith("gray 79x65")
    assert "int_list" in as_text(info) and "max_bytes=64" in as_text(info)


def test_the_report_preview_shows_gray_images_and_a_histogram_of_lengths(project: Path):
    from PIL import Image

    from betonbuild.report import contact_sheet, numeric_plot

    spec = spec_of(10)
    write(spec, project / "k.beton", workers=1)
    assert contact_sheet(str(project / "k.beton"), spec, str(project / "sheet.png")) == list(range(10))
    sheet = np.asarray(Image.open(project / "sheet.png").convert("L"))
    assert sheet.std() > 20, "the photos are drawn"
    numeric_plot(str(project / "k.beton"), spec, str(project / "plot.png"))  # tokens, caption: lengths
    assert Image.open(project / "plot.png").size[0] > 300


def test_parts_with_shipped_kinds_merge_and_read_back_equal(project: Path):
    spec = spec_of(10)
    source = open_source(spec)
    for k, rows in enumerate((np.arange(0, 4), np.arange(4, 10))):
        write_beton(spec, source, rows, project / f"p{k}.beton", 1, log=open("/dev/null", "w"))
    merge_betons([project / "p0.beton", project / "p1.beton"], project / "m.beton", custom_handlers(spec))
    report = verify_beton(spec, source, np.arange(10), str(project / "m.beton"), ffcv_build(), True)
    assert report["ok"], [c for c in report["checks"] if not c["ok"]]


def test_the_loader_batch_check_fails_when_a_shape_output_disagrees_with_the_records(project: Path, monkeypatch):
    from betonbuild.fields.ragged import RaggedKind
    from betonbuild.verify.loader import check_loader_batch

    spec = spec_of(12)
    write(spec, project / "k.beton", workers=1)
    beton = BetonFile(project / "k.beton", custom_handlers=custom_handlers(spec))
    assert check_loader_batch(beton, spec)[0]
    original = RaggedKind.loader_extra_equal
    monkeypatch.setattr(  # a decoder giving each sample's shape one too long, as a broken one would
        RaggedKind, "loader_extra_equal", lambda self, f, b, item, p: original(self, f, b, np.asarray(item) + 1, p)
    )
    ok, detail = check_loader_batch(beton, spec)
    assert not ok and "field 'points': ffcv.Loader's points_shape disagrees with the file's records" in detail
