"""The read-back report: full and sample modes, the content digest, custom fields, provenance."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from report_checks import ALL_CHECKS

from betonbuild.beton.describe import page_usage
from betonbuild.beton.digest import content_digest, range_digest
from betonbuild.beton.format import BetonFile
from betonbuild.config.load import load_config
from betonbuild.custom import FixedUTF8Field
from betonbuild.errors import ConfigError, SampleError
from betonbuild.provenance import ffcv_build
from betonbuild.sources import open_source
from betonbuild.verify import resolve_mode, verify_beton
from betonbuild.write.contract import check_sample
from betonbuild.write.writer import write_beton

ADAPTER = textwrap.dedent(
    '''
    import time

    import numpy as np
    from betonbuild.demo import colour_photos

    PHOTO = colour_photos()["astronaut"]


    class Mixed:
        """Every kind of field, real photo crops of varying size, and a fixed-width UTF-8 title."""

        def __init__(self, n, delay):
            self.n, self.delay = n, delay

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            time.sleep(self.delay)
            rng = np.random.default_rng(i)
            h, w = 24 + i % 7, 30 - i % 5
            return {
                "title": f"échantillon n°{i}",
                "x": rng.standard_normal(6).astype(np.float32),
                "label": i % 4,
                "blob": bytes(range(i % 40 + 1)),
                "meta": {"i": i, "tags": ["a"] * (i % 3)},
                "image": np.ascontiguousarray(PHOTO[3 * i % 400 :][:h, 2 * i % 400 :][:, :w]),
            }


    def make(n=40, delay=0.0):
        return Mixed(n, delay)
    '''
)

# numba's dispatcher finalizer raises KeyError when ffcv.Loader objects are collected (ffcv 1.0.2, harmless).

MIXED_FIELDS = {
    "title": {"type": "custom", "class": "betonbuild.custom:FixedUTF8Field", "args": {"width": 24}},
    "x": {"type": "ndarray", "dtype": "float32", "shape": [6]},
    "label": {"type": "int"},
    "blob": {"type": "bytes"},
    "meta": {"type": "json"},
    "image": {"type": "rgb_image", "write_mode": "jpg"},
}


@pytest.fixture
def project(tmp_path: Path, monkeypatch) -> Path:
    (tmp_path / "mixed_adapter.py").write_text(ADAPTER)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def spec_of(n: int = 40, fields: dict | None = None, delay: float = 0.0, **entry):
    config = {
        "datasets": {
            "mixed": {
                "source": {"kind": "python", "factory": "mixed_adapter:make", "args": {"n": n, "delay": delay}},
                "fields": fields or MIXED_FIELDS,
                **entry,
            }
        }
    }
    return load_config(config).datasets["mixed"]


def write(spec, path: Path, workers: int = 1):
    source = open_source(spec)
    rows = np.arange(len(source))
    write_beton(spec, source, rows, path, workers, log=open("/dev/null", "w"))
    return source, rows


def check(report: dict, name: str) -> dict:
    return next(c for c in report["checks"] if c["name"] == name)


def test_one_and_two_writer_workers_give_different_bytes_and_the_same_content_digest(project: Path):
    # A slow source keeps both workers busy, so each fills its own page: the layouts must differ.
    spec = spec_of(60, delay=0.01, writer={"chunksize": 5})
    write(spec, project / "one.beton", workers=1)
    write(spec, project / "two.beton", workers=2)
    bigger_pages = spec_of(60, writer={"chunksize": 5, "page_size": "4MiB"})
    write(bigger_pages, project / "pages.beton", workers=1)
    files = [project / name for name in ("one.beton", "two.beton", "pages.beton")]
    digests = {hashlib.sha256(f.read_bytes()).hexdigest() for f in files}
    assert len(digests) == 3, "the layouts should differ byte for byte"
    assert page_usage(BetonFile(files[1], {"title": FixedUTF8Field}))["pages_used"] == 2, "each worker filled a page"
    handlers = {"title": FixedUTF8Field}
    content = {content_digest(BetonFile(f, custom_handlers=handlers)) for f in files}
    assert len(content) == 1
    assert content_digest(BetonFile(files[0], handlers), threads=3) in content  # threads do not matter either


def test_the_content_digest_changes_with_one_byte_of_content(project: Path):
    spec = spec_of(20)
    write(spec, project / "a.beton")
    beton = BetonFile(project / "a.beton", custom_handlers={"title": FixedUTF8Field})
    before = content_digest(beton)
    ptr = int(beton.metadata["blob"][7]["ptr"])
    data = bytearray((project / "a.beton").read_bytes())
    data[ptr] ^= 1
    (project / "b.beton").write_bytes(bytes(data))
    assert content_digest(BetonFile(project / "b.beton", custom_handlers={"title": FixedUTF8Field})) != before


def test_full_report_of_every_field_kind_passes_with_its_statistics(project: Path):
    spec = spec_of(40, verify={"mode": "full"})
    source, rows = write(spec, project / "m.beton", workers=2)
    report = verify_beton(spec, source, rows, str(project / "m.beton"), ffcv_build(), threads=2)
    assert report["ok"], report["worst"]
    assert report["mode"] == "full" and report["threads"] == 2
    assert [c["name"] for c in report["checks"]] == ALL_CHECKS
    assert check(report, "image_decoder")["fields"] == {"image": {"ffcv_imdecode": 40, "cv2_fallback": 0}}
    assert report["content_digest"] == content_digest(BetonFile(project / "m.beton", {"title": FixedUTF8Field}))
    assert report["range_digest"] == range_digest(BetonFile(project / "m.beton", {"title": FixedUTF8Field}), 0, 40)
    structure = {c["name"] for c in check(report, "allocations")["structure"]}
    assert {
        "data_region_aligned",
        "allocations_in_one_page",
        "no_overlap",
        "samples_on_one_page",
        "metadata_pointers",
        "no_empty_allocations",
    } <= structure
    assert check(report, "fixed_fields")["fields"] == {
        "x": {"compared": 40, "mismatches": 0},
        "label": {"compared": 40, "mismatches": 0},
    }
    variable = check(report, "variable_fields")["fields"]
    assert variable["blob"]["compared"] == variable["blob"]["lengths_equal"] == 40
    assert "pads every item of a batch to the batch's largest item" in variable["blob"]["loader_lengths"]
    assert "Reader(path).metadata['f3']['size'][i]" in variable["blob"]["loader_lengths"]
    assert variable["meta"] == {"compared": 40, "mismatches": 0}
    image = variable["image"]
    assert image["jpeg"] == image["compared"] == 40
    assert 0 < image["jpeg_mean_abs_error_mean"] <= image["jpeg_mean_abs_error_max"] <= image["jpeg_tolerance"] == 8.0
    assert image["jpeg_max_abs_error_max"] >= image["jpeg_mean_abs_error_max"]
    title = check(report, "custom_fields")["fields"]["title"]
    assert title["compared"] == title["reencoded_equal"] == title["decoded_equal"] == 40
    assert title["class"] == "betonbuild.custom:FixedUTF8Field"
    assert report["config"]["fields"]["title"] == {
        "type": "custom",
        "class": "betonbuild.custom:FixedUTF8Field",
        "args": {"width": 24},
    }
    assert report["config"]["writer"]["num_workers"] == -1


def test_threads_do_not_change_the_report(project: Path):
    spec = spec_of(30, verify={"mode": "full"})
    source, rows = write(spec, project / "m.beton")
    reports = [verify_beton(spec, source, rows, str(project / "m.beton"), ffcv_build(), threads=t) for t in (1, 3)]
    for report in reports:
        report.pop("seconds"), report.pop("threads")
    assert reports[0] == reports[1]


def corrupt_payload(path: Path, ptr: int) -> None:
    data = bytearray(path.read_bytes())
    data[ptr] ^= 0x55
    path.write_bytes(bytes(data))


def test_full_mode_finds_a_corrupted_sample_that_sample_mode_does_not_decode(project: Path):
    sampled = spec_of(200, verify={"mode": "sample", "samples": 8})
    source, rows = write(sampled, project / "m.beton")
    picked = set(np.random.default_rng(0).choice(200, size=8, replace=False).tolist())
    victim = next(r for r in range(50, 200) if r not in picked)
    corrupt_payload(
        project / "m.beton",
        int(BetonFile(project / "m.beton", {"title": FixedUTF8Field}).metadata["blob"][victim]["ptr"]),
    )
    report = verify_beton(sampled, source, rows, str(project / "m.beton"), ffcv_build())
    assert report["mode"] == "sample"
    assert check(report, "variable_fields")["ok"] and check(report, "variable_fields")["rows"] == 8
    full = spec_of(200, verify={"mode": "full"})
    report = verify_beton(full, source, rows, str(project / "m.beton"), ffcv_build(), threads=2)
    assert not report["ok"]
    assert report["worst"] == f"variable_fields: field 'blob' sample {victim} (source index {victim}): bytes differ"


def test_auto_mode_is_full_up_to_the_threshold_and_sample_above_it():
    spec = load_config(
        {
            "datasets": {
                "d": {
                    "source": {"kind": "arrays", "columns": {"a": "a.npy"}},
                    "fields": {"a": {"type": "int"}},
                    "verify": {"full_max_samples": 100},
                }
            }
        }
    ).datasets["d"]
    assert spec.verify["mode"] == "auto"
    assert resolve_mode(spec, 100) == "full" and resolve_mode(spec, 101) == "sample"
    assert resolve_mode(spec, 10**6, every_variable_sample=True) == "full"  # the smoke gate


def test_a_custom_record_that_differs_from_the_source_fails_the_custom_check(project: Path):
    spec = spec_of(12, verify={"mode": "full"})
    source, rows = write(spec, project / "m.beton")
    beton = BetonFile(project / "m.beton", {"title": FixedUTF8Field})
    at = beton.metadata_start + beton.metadata_type.itemsize * 5 + beton.metadata_type.fields["title"][1]
    corrupt_payload(project / "m.beton", at)
    report = verify_beton(spec, source, rows, str(project / "m.beton"), ffcv_build())
    custom = check(report, "custom_fields")
    assert not custom["ok"] and custom["fields"]["title"]["mismatches"] == 1
    assert (
        "field 'title' sample 5 (source index 5): the metadata record differs from the re-encoded source value"
        in custom["detail"]
    )


def test_jpeg_tolerance_is_enforced_with_the_error_reported(project: Path):
    spec = spec_of(10, verify={"mode": "full", "jpeg_mean_abs_error": 0.5})
    source, rows = write(spec, project / "m.beton")
    report = verify_beton(spec, source, rows, str(project / "m.beton"), ffcv_build())
    variable = check(report, "variable_fields")
    assert not variable["ok"]
    assert "JPEG mean absolute pixel error" in variable["detail"] and "exceeds the tolerance 0.5" in variable["detail"]
    assert (
        variable["fields"]["image"]["mismatches"] == 10 and variable["fields"]["image"]["jpeg_mean_abs_error_max"] > 0.5
    )


def write_and_verify_image_folder(tmp_path: Path, root: str, image_field: dict, workers: int) -> dict:
    """Writes the image folder ``root`` (cwd-relative) with ``image_field`` + an int label, and verifies it."""
    config = {
        "datasets": {
            "d": {
                "source": {"kind": "image_folder", "root": root},
                "fields": {"image": image_field, "label": {"type": "int"}},
            }
        }
    }
    spec = load_config(config).datasets["d"]
    source = open_source(spec)
    rows = np.arange(len(source))
    target = tmp_path / f"{root}.beton"
    with open(os.devnull, "w") as quiet:
        write_beton(spec, source, rows, target, workers, log=quiet)
    return verify_beton(spec, source, rows, str(target), ffcv_build(), threads=2)


def test_an_image_folder_is_checked_in_full_with_its_source_files_decoded_fast(tmp_path: Path, monkeypatch):
    from conftest import make_photo_folder

    make_photo_folder(tmp_path / "photos", per_class=4)
    monkeypatch.chdir(tmp_path)
    report = write_and_verify_image_folder(
        tmp_path, "photos", {"type": "rgb_image", "write_mode": "jpg", "max_resolution": 40}, workers=2
    )
    assert report["ok"], report["worst"]
    image = check(report, "variable_fields")["fields"]["image"]
    assert image["compared"] == image["jpeg"] == image["source_decoded_fast"] == 8
    assert check(report, "fixed_fields")["fields"]["label"] == {"compared": 8, "mismatches": 0}


def test_another_ffcv_build_fails_the_report_and_shows_both(project: Path):
    spec = spec_of(5)
    source, rows = write(spec, project / "m.beton")
    writer = {**ffcv_build(), "libffcv_sha256": "0" * 64, "numpy": "1.0.0"}
    report = verify_beton(spec, source, rows, str(project / "m.beton"), writer)
    build = check(report, "same_ffcv_build")
    assert not build["ok"]
    assert f"libffcv_sha256: written by '{'0' * 64}', read by '{ffcv_build()['libffcv_sha256']}'" in build["detail"]
    assert "numpy: written by '1.0.0'" in build["detail"]
    assert report["provenance"]["writer"]["libffcv_sha256"] == "0" * 64
    assert report["provenance"]["reader"] == ffcv_build()
    assert all(c["ok"] for c in report["checks"] if c["name"] != "same_ffcv_build")


@pytest.mark.parametrize(
    "entry, where, why",
    [
        ({"class": "no_such_module:Field"}, "fields.title.class", "cannot import module 'no_such_module'"),
        ({"class": "betonbuild.custom:NoSuchClass"}, "fields.title.class", "has no attribute 'NoSuchClass'"),
        ({"class": "betonbuild.fields.custom:values_equal"}, "fields.title.class", "not a class"),
        (
            {"class": "betonbuild.errors:ConfigError"},
            "fields.title.class",
            "is not an ffcv Field: it lacks metadata_type",
        ),
        (
            {"class": "betonbuild.custom:FixedUTF8Field", "args": {"width": 0}},
            "fields.title.args",
            "width must be an integer in",
        ),
        (
            {"class": "betonbuild.custom:FixedUTF8Field", "args": {"colour": 3}},
            "fields.title.args",
            "unexpected keyword argument 'colour'",
        ),
        ({"class": "not a class path"}, "fields.title.class", "does not match"),
    ],
)
def test_a_custom_field_without_a_resolvable_class_is_a_config_error(entry, where, why):
    config = {
        "datasets": {
            "d": {
                "source": {"kind": "arrays", "columns": {"title": "t.npy"}},
                "fields": {"title": {"type": "custom", **entry}},
            }
        }
    }
    with pytest.raises(ConfigError, match=why) as info:
        load_config(config)
    assert where in info.value.where


def test_a_custom_value_its_encode_rejects_is_a_sample_error_naming_field_and_index(project: Path):
    spec = spec_of(
        3, fields={"title": {"type": "custom", "class": "betonbuild.custom:FixedUTF8Field", "args": {"width": 4}}}
    )
    assert check_sample(spec, ("abcd",), 7) == ("abcd",)
    with pytest.raises(
        SampleError,
        match=r"field 'title', sample index 7: .*FixedUTF8Field.encode raised "
        r"ValueError: 'abcdé'... is 6 UTF-8 bytes; the field holds 4",
    ):
        check_sample(spec, ("abcdé",), 7)
    with pytest.raises(SampleError, match="encode raised TypeError: expected a str, got int"):
        check_sample(spec, (3,), 0)


def test_a_hostile_pointer_fails_the_report_without_crashing_it(project: Path):
    spec = spec_of(16, verify={"mode": "full"})
    source, rows = write(spec, project / "m.beton")
    beton = BetonFile(project / "m.beton", {"title": FixedUTF8Field})
    at = beton.metadata_start + beton.metadata_type.itemsize * 3 + beton.metadata_type.fields["x"][1]
    data = bytearray((project / "m.beton").read_bytes())
    data[at : at + 8] = np.uint64(2**63 + 5).tobytes()
    (project / "m.beton").write_bytes(bytes(data))
    report = verify_beton(spec, source, rows, str(project / "m.beton"), ffcv_build())
    checks = {c["name"]: c for c in report["checks"]}
    assert report["ok"] is False
    assert (
        not checks["allocations"]["ok"]
        and "metadata_pointers: field 'x': sample 3's pointer" in checks["allocations"]["detail"]
    )
    assert not checks["fixed_fields"]["ok"] and "outside the data region" in checks["fixed_fields"]["detail"]
    assert not checks["content_digest"]["ok"] and "BetonFormatError" in checks["content_digest"]["detail"]
    assert checks["variable_fields"]["ok"] and checks["custom_fields"]["ok"]
    assert not checks["loader_batch"]["ok"] and checks["loader_batch"]["detail"].startswith("not run")


def test_jpeg_source_files_are_decoded_by_libjpeg_turbo_exactly_as_pil_decodes_them(tmp_path: Path, monkeypatch):
    from PIL import Image

    from betonbuild._compat.ffcv_ctypes import TurboJPEG
    from betonbuild.demo import colour_photos

    photos = colour_photos()
    for k, name in enumerate(["astronaut", "coffee", "chelsea"]):
        (tmp_path / "jpegs" / name).mkdir(parents=True)
        for j in range(3):
            crop = np.ascontiguousarray(photos[name][40 * j : 40 * j + 48 + k, 30 * j : 30 * j + 64])
            Image.fromarray(crop).save(
                tmp_path / "jpegs" / name / f"{j}.jpg", quality=95, subsampling=[0, 1, 2][k]
            )  # 4:4:4, 4:2:2, 4:2:0
    decoder = TurboJPEG()
    for path in sorted((tmp_path / "jpegs").rglob("*.jpg")):
        data = np.frombuffer(path.read_bytes(), dtype=np.uint8)
        assert np.array_equal(decoder.decode_rgb(data), np.asarray(Image.open(path)))
    decoder.close()
    monkeypatch.chdir(tmp_path)
    report = write_and_verify_image_folder(
        tmp_path, "jpegs", {"type": "rgb_image", "write_mode": "smart", "smart_threshold": 9300}, workers=1
    )
    assert report["ok"], report["worst"]
    image = check(report, "variable_fields")["fields"]["image"]
    assert image["source_decoded_fast"] == image["compared"] == 9
    assert image["raw"] == 3 and image["jpeg"] == 6  # 48x64x3 = 9216 bytes <= 9300: raw, exact; the others JPEG


def test_the_whole_file_range_digest_comes_from_the_content_digest_leaves(tmp_path: Path, monkeypatch):
    # 2,500 samples: three digest blocks, the last one short; each block is hashed once, for both digests.
    import betonbuild.verify.report as verify

    columns = {"a": np.arange(2500, dtype=np.int64), "b": np.linspace(0, 1, 2500)}
    for name, values in columns.items():
        np.save(tmp_path / f"{name}.npy", values)
    monkeypatch.chdir(tmp_path)
    spec = load_config(
        {
            "datasets": {
                "d": {
                    "source": {"kind": "arrays", "columns": {"a": "a.npy", "b": "b.npy"}},
                    "fields": {"a": {"type": "int"}, "b": {"type": "float"}},
                }
            }
        }
    ).datasets["d"]
    source = open_source(spec)
    rows = np.arange(len(source))
    with open(os.devnull, "w") as quiet:
        write_beton(spec, source, rows, tmp_path / "d.beton", 1, log=quiet)
    hashed = []
    real_leaf = verify.leaf_releasing
    monkeypatch.setattr(
        verify, "leaf_releasing", lambda beton, k, a, b: hashed.append((a, b)) or real_leaf(beton, k, a, b)
    )
    report = verify_beton(spec, source, rows, str(tmp_path / "d.beton"), ffcv_build(), threads=2)
    assert report["ok"], report["worst"]
    beton = BetonFile(tmp_path / "d.beton")
    assert report["content_digest"] == content_digest(beton)
    assert report["range_digest"] == range_digest(beton, 0, 2500) == range_digest(beton, 0, 2500, threads=3)
    assert sorted(hashed) == [(0, 1024), (1024, 2048), (2048, 2500)]


def test_stored_jpegs_are_decoded_by_ffcvs_own_imdecode_and_headers_read_as_jpeg_dimensions(
    tmp_path: Path, monkeypatch
):
    import io

    from ffcv.libffcv import imdecode
    from PIL import Image

    from betonbuild.beton.payloads import jpeg_dimensions
    from betonbuild.demo import colour_photos
    from betonbuild.verify.images import StoredImages, jpeg_dimensions_fast

    photos = colour_photos()
    for name in ["astronaut", "coffee"]:
        (tmp_path / "jpegs" / name).mkdir(parents=True)
        for j in range(4):  # two sizes per class: the reused output array must follow the size
            crop = np.ascontiguousarray(photos[name][30 * j : 30 * j + 40 + 8 * (j % 2), 20 * j : 20 * j + 56])
            Image.fromarray(crop).save(tmp_path / "jpegs" / name / f"{j}.jpg", quality=95)
    monkeypatch.chdir(tmp_path)
    report = write_and_verify_image_folder(tmp_path, "jpegs", {"type": "rgb_image", "write_mode": "jpg"}, workers=1)
    assert report["ok"], report["worst"]
    beton = BetonFile(tmp_path / "jpegs.beton")
    images = StoredImages(beton, "image", 0, beton.num_samples)
    for row in range(beton.num_samples):
        meta = beton.metadata["image"][row]
        height, width = int(meta["height"]), int(meta["width"])
        payload = beton.read(int(meta["data_ptr"]), images.size[row])
        expected = np.zeros((height, width, 3), dtype=np.uint8)
        assert imdecode(payload, expected, height, width, height, width, 0, 0, 1, 1, False, False) == 0
        assert np.array_equal(images.decode(row), expected)
        assert jpeg_dimensions_fast(payload) == jpeg_dimensions(payload) == (width, height)
    # A header longer than the 4 KiB prefix (a big comment before the frame): the whole payload is parsed.
    buffer = io.BytesIO()
    Image.fromarray(photos["coffee"][:33, :47]).save(buffer, format="JPEG", comment=b"x" * 9000)
    data = np.frombuffer(buffer.getvalue(), dtype=np.uint8)
    assert jpeg_dimensions(data[:4096]) is None
    assert jpeg_dimensions_fast(data) == jpeg_dimensions(data) == (47, 33)
    assert jpeg_dimensions_fast(data[:5000]) is None and jpeg_dimensions_fast(data[:100]) is None


@pytest.mark.parametrize(
    "fields, kind, ffcv_free",
    [
        ({"image": {"type": "rgb_image"}, "label": {"type": "int"}}, "image_folder", True),
        ({"image": {"type": "rgb_image", "max_resolution": 32}, "label": {"type": "int"}}, "image_folder", True),
        ({"a": {"type": "int"}, "b": {"type": "bytes"}}, "arrays", True),
        ({"t": {"type": "torch_tensor", "dtype": "float32", "shape": [2]}}, "arrays", False),
        ({"t": {"type": "custom", "class": "betonbuild.custom:FixedUTF8Field", "args": {"width": 4}}}, "arrays", False),
        ({"image": {"type": "rgb_image"}, "label": {"type": "int"}}, "webdataset", True),
        ({"a": {"type": "int"}}, "python", False),
    ],
)
def test_the_loader_batch_runs_in_a_child_process_only_when_the_comparisons_need_nothing_of_ffcv(
    fields, kind, ffcv_free, monkeypatch
):
    from betonbuild.verify import start_loader_process
    from betonbuild.verify.loader import content_without_ffcv

    monkeypatch.delitem(sys.modules, "ffcv.loader", raising=False)  # as in a verify job's own process

    source = {
        "image_folder": {"kind": "image_folder", "root": "photos"},
        "arrays": {"kind": "arrays", "columns": {name: f"{name}.npy" for name in fields}},
        "python": {"kind": "python", "factory": "m:make"},
        "webdataset": {"kind": "webdataset", "shards": "s-{0..1}.tar"},
    }[kind]
    spec = load_config({"datasets": {"d": {"source": source, "fields": fields}}}).datasets["d"]
    assert content_without_ffcv(spec) is ffcv_free
    assert start_loader_process(spec, threads=1) is None  # a one-thread job keeps to its one core
    loader = start_loader_process(spec)
    assert (loader is not None) is ffcv_free
    if loader is not None:  # never asked: closing it ends it
        loader.close()
        assert loader.process.returncode is not None
    monkeypatch.setitem(sys.modules, "ffcv.loader", sys.modules.get("ffcv.loader", object()))
    assert start_loader_process(spec) is None  # ffcv imported already (the smoke job's gate): no child


def test_a_child_started_before_the_spec_was_known_is_used_where_wanted_and_ended_where_not(monkeypatch):
    """The job scripts start the Loader's child first thing (betonbuild.loader_process); the spec
    then decides: the same process is the batch's child, or it is ended at once."""
    from betonbuild.loader_process import LoaderProcess
    from betonbuild.verify import start_loader_process

    monkeypatch.delitem(sys.modules, "ffcv.loader", raising=False)  # as in a job's own process
    entry = {"source": {"kind": "arrays", "columns": {"a": "a.npy"}}, "fields": {"a": {"type": "int"}}}
    spec = load_config({"datasets": {"d": entry}}).datasets["d"]
    started = LoaderProcess.start()
    assert start_loader_process(spec, threads=2, started=started) is started
    started.close()
    unwanted = LoaderProcess.start()
    assert start_loader_process(spec, threads=1, started=unwanted) is None  # one thread: no second process
    assert unwanted.process.returncode is not None  # ended, not left importing torch beside the job


def test_the_loader_child_can_be_started_without_importing_betonbuilds_modules():
    """What lets a job script start it before its own imports: the standard library alone."""
    import subprocess

    script = (
        "import sys; from betonbuild.loader_process import LoaderProcess; "
        "heavy = [m for m in ('numpy', 'jsonschema', 'betonbuild.verify', 'betonbuild.config.spec') "
        "if m in sys.modules]; "
        "child = LoaderProcess.start(); child.close(); print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_the_loader_process_reports_a_file_it_cannot_read_as_a_failed_check(tmp_path: Path, monkeypatch):
    from betonbuild.verify import start_loader_process

    monkeypatch.delitem(sys.modules, "ffcv.loader", raising=False)  # as in a verify job's own process

    spec = load_config(
        {"datasets": {"d": {"source": {"kind": "arrays", "columns": {"a": "a.npy"}}, "fields": {"a": {"type": "int"}}}}}
    ).datasets["d"]
    (tmp_path / "junk.beton").write_bytes(b"not a beton file")
    loader = start_loader_process(spec)
    ok, detail = loader.request(str(tmp_path / "junk.beton"), spec).result()
    loader.close()
    assert not ok and "junk.beton" in detail


def test_verifying_an_image_folder_never_imports_ffcv_in_the_verifying_process(tmp_path: Path, monkeypatch):
    """The rows are decoded through ffcv's compiled library alone; the Loader batch runs in a child."""
    import subprocess
    import sys

    from conftest import make_photo_folder

    make_photo_folder(tmp_path / "photos", per_class=3)
    monkeypatch.chdir(tmp_path)
    config = {
        "datasets": {
            "d": {
                "source": {"kind": "image_folder", "root": "photos"},
                "fields": {"image": {"type": "rgb_image", "write_mode": "jpg"}, "label": {"type": "int"}},
                "verify": {"mode": "full"},
            }
        }
    }
    spec = load_config(config).datasets["d"]
    script = textwrap.dedent(f"""
        import json, sys
        import numpy as np
        from betonbuild.provenance import ffcv_build
        from betonbuild.sources import open_source
        from betonbuild.config.spec import DatasetSpec
        from betonbuild.config.load import spec_from_dict
        from betonbuild.verify import verify_beton
        spec = spec_from_dict({spec.to_dict()!r})
        source = open_source(spec)
        report = verify_beton(spec, source, np.arange(len(source)), "d.beton", ffcv_build(), threads=2)
        loaded = [m for m in sys.modules if m.startswith(("ffcv", "torch"))]
        print(json.dumps({{"ok": report["ok"], "worst": report["worst"], "ffcv": loaded,
                          "loader": next(c for c in report["checks"] if c["name"] == "loader_batch")["detail"]}}))
    """)
    source = open_source(spec, tmp_path)
    with open(os.devnull, "w") as quiet:
        write_beton(spec, source, np.arange(len(source)), tmp_path / "d.beton", 1, log=quiet)
    found = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, check=True)
    result = json.loads(found.stdout.strip().splitlines()[-1])
    assert result["ok"], result["worst"]
    assert result["ffcv"] == []
    assert result["loader"] == "ffcv.Loader read 6 samples, equal to the file's decoded content"
