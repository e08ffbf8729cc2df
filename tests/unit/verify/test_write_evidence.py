"""What the write job measures and reads back, and what the full verification reuses of it: the
re-encoded images' JPEG error and payload CRCs (``write.image_measure``, ``verify.measured``) and the
ffcv.Loader batch (``workflow.write_evidence``). Reused only while they provably describe the file
and its source; otherwise every image is compared again, and what differs is named."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from betonbuild.beton.format import BetonFile
from betonbuild.config.load import load_config
from betonbuild.errors import VerificationError
from betonbuild.provenance import ffcv_build
from betonbuild.sources import open_source
from betonbuild.verify import verify_beton
from betonbuild.verify.measured import stored_crc_digest
from betonbuild.workflow import write_evidence
from betonbuild.workflow.stages import build, make_source_manifest, verify_dataset
from tests.conftest import make_photo_folder

# numba's dispatcher finalizer raises KeyError when ffcv.Loader objects are collected (ffcv 1.0.2, harmless).

SAMPLES = 8  # 2 classes x 4 real photo crops of 64 px, stored at 48 px


def folder_spec(root: Path, tolerance: float = 8.0, bad_samples: dict | None = None):
    entry = {
        "source": {"kind": "image_folder", "root": str(root)},
        "fields": {
            "image": {"type": "rgb_image", "write_mode": "jpg", "max_resolution": 48, "jpeg_quality": 90},
            "label": {"type": "int"},
        },
        "verify": {"mode": "full", "jpeg_mean_abs_error": tolerance},
        **({"bad_samples": bad_samples} if bad_samples else {}),
    }
    return load_config({"datasets": {"photos": entry}}).datasets["photos"]


def built(spec, tmp_path: Path, **extra) -> dict:
    """``spec``'s source manifest and full write in ``tmp_path``/results, as the workflow's jobs make
    them: the paths, and the write record as ``written``."""
    from betonbuild.workflow.stages import make_shard_list

    out = tmp_path / "results"
    out.mkdir()
    w = {"spec": spec, "manifest": str(out / "source.json"), "beton": str(out / f"{spec.name}.beton"), **extra}
    w.update(record=str(out / f"{spec.name}.write.json"), report=str(out / "v.json"), failed=str(out / "failed.json"))
    with open(os.devnull, "w") as quiet:
        if spec.source["kind"] == "webdataset":
            make_shard_list(spec, str(out / "shards.json"))
        make_source_manifest(spec, w["manifest"], plan_parts=False, log=quiet)
        w["written"] = build(spec, w["manifest"], w["beton"], w["record"], threads=2, log=quiet)
    return w


@pytest.fixture
def written(tmp_path: Path) -> dict:
    """A full write of a real photo folder, as the workflow's write job makes it."""
    folder = make_photo_folder(tmp_path / "photos", per_class=SAMPLES // 2)
    return built(folder_spec(folder), tmp_path, folder=folder)


def verify(w: dict, spec=None) -> dict:
    spec = spec or w["spec"]
    return verify_dataset(spec, w["manifest"], w["beton"], w["record"], w["report"], w["failed"], threads=2)


def check(report: dict, name: str) -> dict:
    return next(c for c in report["checks"] if c["name"] == name)


def no_source_decoding_nor_ffcv(monkeypatch) -> None:
    def refuse(*_args, **_kwargs):
        raise AssertionError("the verification decoded a source image or started ffcv's Loader")

    monkeypatch.setattr("betonbuild.verify.content.decode_source_image", refuse)
    monkeypatch.setattr("betonbuild.workflow.stages.start_loader_process", refuse)
    monkeypatch.setattr("betonbuild.verify.report.start_loader_process", refuse)
    monkeypatch.setattr("betonbuild.verify.report.import_ffcv", refuse)


def test_the_write_measures_each_image_as_an_image_by_image_verification_finds_it(written):
    measured = written["written"]["measured_images"]["image"]
    assert measured["samples"] == measured["jpeg"] == SAMPLES and measured["unmeasured"] == 0
    spec = written["spec"]
    source = open_source(spec)
    compared = verify_beton(spec, source, np.arange(SAMPLES), written["beton"], ffcv_build())  # no measurements
    stats = check(compared, "variable_fields")["fields"]["image"]
    assert "measured_at_write" not in stats and stats["compared"] == SAMPLES
    assert round(measured["jpeg_mean_abs_error_sum"] / SAMPLES, 3) == stats["jpeg_mean_abs_error_mean"]
    assert round(measured["jpeg_mean_abs_error_max"], 3) == stats["jpeg_mean_abs_error_max"]
    assert measured["jpeg_max_abs_error_max"] == stats["jpeg_max_abs_error_max"]
    with ThreadPoolExecutor(2) as pool:
        digest = stored_crc_digest(BetonFile(written["beton"]), "image", SAMPLES, pool)
    assert digest == measured["payload_crc32_sha256"]


def test_the_full_verification_decodes_no_source_image_and_imports_no_ffcv(written, monkeypatch):
    no_source_decoding_nor_ffcv(monkeypatch)
    report = verify(written)
    assert report["ok"]
    stats = check(report, "variable_fields")["fields"]["image"]
    assert stats["measured_at_write"] == stats["compared"] == SAMPLES and stats["mismatches"] == 0
    assert stats["jpeg"] == SAMPLES and 0 < stats["jpeg_mean_abs_error_mean"] <= stats["jpeg_mean_abs_error_max"]
    assert check(report, "image_decoder")["fields"]["image"] == {"ffcv_imdecode": SAMPLES, "cv2_fallback": 0}
    assert "run by the write job on this file: the same SHA-256" in check(report, "loader_batch")["detail"]
    assert written["written"]["loader_batch"]["sha256"] == report["file"]["sha256"]


def test_a_payload_changed_after_the_write_is_compared_again_and_the_sample_named(written):
    beton = BetonFile(written["beton"])
    pointer = int(beton.metadata["image"]["data_ptr"][2])
    size = int(beton.image_sizes("image", np.array([2]))[0])
    del beton
    with open(written["beton"], "r+b") as fh:  # the same size and inode: only the bytes differ
        fh.seek(pointer + size // 2)
        fh.write(bytes(range(1, 65)))
    with pytest.raises(VerificationError):
        verify(written)
    failed = json.loads(Path(written["failed"]).read_text())
    stats = check(failed, "variable_fields")["fields"]["image"]
    assert "measured_at_write" not in stats
    assert "CRC-32" in stats["measured_not_used"]
    named = [c["detail"] for c in failed["checks"] if not c["ok"]]
    assert any("sample 2" in d for d in named), named
    assert "the file changed since the write job read it through ffcv.Loader" in check(failed, "loader_batch")["detail"]


def test_measurements_above_the_tolerance_are_not_used_and_each_image_is_named(written):
    strict = folder_spec(written["folder"], tolerance=0.01)
    with pytest.raises(VerificationError):
        verify(written, strict)
    failed = json.loads(Path(written["failed"]).read_text())
    variable = check(failed, "variable_fields")
    assert "exceeds the tolerance" in variable["fields"]["image"]["measured_not_used"]
    assert "field 'image' sample 0 (source index" in variable["detail"]
    assert "(`verify.jpeg_mean_abs_error`)" in variable["detail"]


def test_measurements_of_another_source_state_are_compared_again(written, monkeypatch):
    record = json.loads(Path(written["record"]).read_text())
    manifest = json.loads(Path(written["manifest"]).read_text())
    assert write_evidence.measured_for(written["spec"], record, manifest, None) == record["measured_images"]
    stale = {**record, "source_state": "0" * 64}
    assert write_evidence.measured_for(written["spec"], stale, manifest, None) is None
    Path(written["record"]).write_text(json.dumps(stale))
    report = verify(written)
    stats = check(report, "variable_fields")["fields"]["image"]
    assert "measured_at_write" not in stats and stats["source_decoded_fast"] == SAMPLES


def test_a_failed_or_missing_loader_batch_of_the_write_is_run_again():
    assert write_evidence.written_loader_batch({}) is None
    assert write_evidence.written_loader_batch({"loader_batch": {"ok": False, "detail": "x", "sha256": None}}) is None
    batch = {"ok": True, "detail": "x", "sha256": "ab"}
    assert write_evidence.written_loader_batch({"loader_batch": batch}) == batch


def test_betonbuild_write_records_no_evidence(tmp_path: Path):
    folder = make_photo_folder(tmp_path / "photos", per_class=2)
    spec = folder_spec(folder)
    manifest, beton = str(tmp_path / "source.json"), str(tmp_path / "x.beton")
    with open(os.devnull, "w") as quiet:
        make_source_manifest(spec, manifest, plan_parts=False, log=quiet)
        record = build(spec, manifest, beton, beton + ".write.json", threads=1, log=quiet, evidence=False)
    assert "measured_images" not in record and "loader_batch" not in record


def test_skipped_samples_are_left_out_of_the_measured_digest(tmp_path: Path, monkeypatch):
    folder = make_photo_folder(tmp_path / "photos", per_class=3)
    (folder / "coffee" / "9.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    w = built(folder_spec(folder, bad_samples={"policy": "skip", "max": 1}), tmp_path)
    record = w["written"]
    assert len(record["skipped"]["samples"]) == 1
    assert record["measured_images"]["image"]["samples"] == 6
    no_source_decoding_nor_ffcv(monkeypatch)
    report = verify(w)
    assert report["ok"] and check(report, "variable_fields")["fields"]["image"]["measured_at_write"] == 6


def webdataset_build(tmp_path: Path) -> dict:
    from tests.wds_samples import photo_samples, write_shard

    samples = photo_samples()
    write_shard(tmp_path / "shards" / "a-0.tar", samples[:10])
    write_shard(tmp_path / "shards" / "a-1.tar", samples[10:])
    entry = {
        "source": {
            "kind": "webdataset",
            "shards": str(tmp_path / "shards" / "a-{0..1}.tar"),
            "keys": {"image": "jpg;png", "label": "cls"},
        },
        "fields": {"image": {"type": "rgb_image", "write_mode": "jpg"}, "label": {"type": "int"}},
        "verify": {"mode": "full"},
    }
    return built(load_config({"datasets": {"wds": entry}}).datasets["wds"], tmp_path)


def test_a_webdataset_verification_reads_its_labels_without_decoding_an_image(tmp_path: Path, monkeypatch):
    from betonbuild.sources.webdataset import WebDatasetSource

    w = webdataset_build(tmp_path)
    real = WebDatasetSource.decode_field

    def labels_only(self, field, ext, payload, where):
        assert field.name != "image", "the verification decoded a shard's image"
        return real(self, field, ext, payload, where)

    monkeypatch.setattr(WebDatasetSource, "decode_field", labels_only)
    report = verify(w)
    assert report["ok"], report["worst"]
    assert check(report, "fixed_fields")["fields"]["label"] == {"compared": 20, "mismatches": 0}
    assert check(report, "variable_fields")["fields"]["image"]["measured_at_write"] == 20

    real_some = WebDatasetSource.some_fields

    def one_label_off(self, index, columns):  # the labels read this way are the ones compared
        values = real_some(self, index, columns)
        return {**values, 1: values[1] + 1} if index == 3 else values

    monkeypatch.setattr(WebDatasetSource, "some_fields", one_label_off)
    with pytest.raises(VerificationError):
        verify(w)
    failed = json.loads(Path(w["failed"]).read_text())
    assert "(first: sample 3, source index 3)" in check(failed, "fixed_fields")["detail"]


def keep_build(tmp_path: Path) -> dict:
    """A write of real photo JPEGs with ``source_jpeg: keep``: baseline, progressive and greyscale ones
    kept, one larger than max_resolution re-encoded."""
    from PIL import Image

    pngs = make_photo_folder(tmp_path / "pngs", per_class=3, size=64)
    folder = tmp_path / "jpegs"
    for k, png in enumerate(sorted(pngs.rglob("*.png"))):
        (folder / png.parent.name).mkdir(parents=True, exist_ok=True)
        image = Image.open(png).convert("RGB")
        if k == 1:
            image = image.convert("L")
        if k == 4:
            image = image.resize((96, 96))  # above max_resolution 64: re-encoded
        image.save(folder / png.parent.name / f"{k}.jpg", quality=90, progressive=k == 2)
    entry = {
        "source": {"kind": "image_folder", "root": str(folder)},
        "fields": {
            "image": {
                "type": "rgb_image",
                "write_mode": "jpg",
                "max_resolution": 64,
                "source_jpeg": "keep",
                "image_mode": "convert",
            },
            "label": {"type": "int"},
        },
        "verify": {"mode": "full"},
    }
    return built(load_config({"datasets": {"kept": entry}}).datasets["kept"], tmp_path)


def test_kept_jpegs_are_measured_at_write_and_verified_without_reading_the_source(tmp_path: Path, monkeypatch):
    w = keep_build(tmp_path)
    measured = w["written"]["measured_images"]["image"]
    assert (measured["kept"], measured["jpeg"], measured["unmeasured"]) == (5, 1, 0)
    assert w["written"]["source_jpeg"]["image"]["kept"] == 5
    image_by_image = check(
        verify_beton(w["spec"], open_source(w["spec"]), np.arange(6), w["beton"], ffcv_build()), "variable_fields"
    )
    no_source_decoding_nor_ffcv(monkeypatch)
    monkeypatch.setattr("betonbuild.verify.content.keep_or_reason", lambda *a: pytest.fail("read a source JPEG"))
    report = verify(w)
    assert report["ok"], report["worst"]
    stats = check(report, "variable_fields")["fields"]["image"]
    assert stats["measured_at_write"] == 6 and (stats["kept"], stats["reencoded"]) == (5, 1)
    unmeasured = image_by_image["fields"]["image"]
    assert (unmeasured["kept"], unmeasured["reencoded"]) == (5, 1)
    assert stats["jpeg_max_abs_error_max"] == unmeasured["jpeg_max_abs_error_max"]
    assert check(report, "image_decoder")["fields"]["image"] == {"ffcv_imdecode": 6, "cv2_fallback": 0}


def test_a_kept_jpeg_changed_after_the_write_is_compared_with_its_source_and_named(tmp_path: Path):
    w = keep_build(tmp_path)
    beton = BetonFile(w["beton"])
    pointer = int(beton.metadata["image"]["data_ptr"][0])
    size = int(beton.image_sizes("image", np.array([0]))[0])
    del beton
    with open(w["beton"], "r+b") as fh:  # the entropy-coded data of a kept JPEG: same size, other bytes
        fh.seek(pointer + size - 40)
        fh.write(bytes(range(7, 37)))
    with pytest.raises(VerificationError):
        verify(w)
    failed = json.loads(Path(w["failed"]).read_text())
    stats = check(failed, "variable_fields")["fields"]["image"]
    assert "CRC-32" in stats["measured_not_used"]
    assert "kept JPEG's" in check(failed, "variable_fields")["detail"]
    assert "sample 0" in check(failed, "variable_fields")["detail"]


@pytest.mark.slow
def test_the_write_jobs_loader_batch_runs_in_a_child_and_the_job_imports_no_ffcv(tmp_path: Path):
    """The write job imports no ffcv (torch): its Loader batch runs in a child process it started
    before the write, and the record holds the batch's verdict bound to the file's SHA-256."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from tests.conftest import make_photo_folder
        from tests.unit.verify.test_write_evidence import built, folder_spec

        tmp = Path({str(tmp_path)!r})
        w = built(folder_spec(make_photo_folder(tmp / "photos", per_class=2)), tmp)
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("ffcv", "torch")))
        print(w["written"]["loader_batch"]["ok"], w["written"]["loader_batch"]["sha256"])
        """
    )
    repo = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", script], cwd=repo, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    modules, batch = done.stdout.strip().splitlines()[-2:]
    assert modules == "[]"
    from betonbuild.sources import sha256_file

    assert batch == f"True {sha256_file(tmp_path / 'results' / 'photos.beton')}"
