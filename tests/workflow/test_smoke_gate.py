"""The smoke gate: the smoke write and its read-back run in one job (rule `smoke`), and a smoke
file that does not read back within the tolerances stops the build before the full write."""

from __future__ import annotations

import json

from conftest import make_photo_folder, run_snakemake, write_config

from betonbuild.workflow.status import plan


def photos(tolerance: float) -> dict:
    """JPEG-stored photos: their read-back differs from the source by a few levels, so a tolerance
    of 0 fails the gate although every sample was written."""
    return {
        "photos": {
            "source": {"kind": "image_folder", "root": "photos"},
            "fields": {
                "image": {"type": "rgb_image", "write_mode": "jpg", "jpeg_quality": 90},
                "label": {"type": "int"},
            },
            "smoke": {"samples": 2},
            "verify": {"jpeg_mean_abs_error": tolerance},
        }
    }


def jobs(result) -> set[str]:
    return {rule for rule, _ in plan(result.stdout + result.stderr).get("photos", [])}


def test_a_failing_gate_stops_the_build_before_the_full_write_and_a_fix_reruns_it(tmp_path):
    make_photo_folder(tmp_path / "photos", per_class=2, size=48)
    write_config(tmp_path, photos(0.0))
    failed = run_snakemake(tmp_path, "all", check=False)
    output = failed.stdout + failed.stderr
    assert failed.returncode != 0, output[-3000:]
    results = tmp_path / "results" / "photos"
    assert "write" in jobs(failed), jobs(failed)  # its smoke stage comes first, then the full write
    log = (tmp_path / "logs" / "write" / "photos.log").read_text()
    assert "photos (smoke): 4/4 samples" in log and "photos (full)" not in log, "the full write must not start"
    assert not (results / "photos.beton").exists() and not (results / "smoke.verify.json").exists()
    # Snakemake removes the failed job's outputs: no smoke file stands as if it had passed
    assert not (results / "smoke.beton").exists() and not (results / "smoke.write.json").exists()
    report = json.loads((results / "failed" / "smoke.verify.json").read_text())
    assert report["ok"] is False and report["stage"] == "smoke"
    assert "betonbuild error: dataset 'photos': verification of" in output
    assert "failed/smoke.verify.json" in output

    write_config(tmp_path, photos(8.0))  # the tolerance is a parameter of the write job (its gate): it reruns
    fixed = run_snakemake(tmp_path, "all")
    assert {"write", "verify"} <= jobs(fixed), jobs(fixed)
    gate = json.loads((results / "smoke.verify.json").read_text())
    assert gate["ok"] is True and gate["stage"] == "smoke" and gate["num_samples"]["found"] == 4
    assert {c["name"] for c in gate["checks"]} >= {"loader_batch", "same_ffcv_build"}
    assert json.loads((results / "photos.verify.json").read_text())["ok"] is True
    assert not (results / "failed" / "smoke.verify.json").exists(), "a passing gate removes the old failure"


def digits(samples: int, smoke: int) -> dict:
    """The first ``samples`` digits (8x8 uint8 and their labels), a smoke file of up to 2 x ``smoke``."""
    return {
        "d": {
            "source": {"kind": "arrays", "path": "digits.npz", "columns": {"image": "images", "label": "target"}},
            "fields": {"image": {"type": "ndarray", "dtype": "uint8", "shape": [8, 8]}, "label": {"type": "int"}},
            "smoke": {"samples": smoke},
            "writer": {"num_workers": 2, "indices": f"0:{samples}"},
        }
    }


def test_a_dataset_the_smoke_file_holds_whole_is_that_file_verified_by_the_gate(tmp_path, digits_npz):
    # smoke_copy: 10 samples, smoke samples 5 -> the smoke file holds all 10, in the final order
    write_config(tmp_path, digits(10, 5))
    run_snakemake(tmp_path, "all")
    results = tmp_path / "results" / "d"
    record = json.loads((results / "d.write.json").read_text())
    assert record["copied_from"] == "smoke.beton" and record["num_workers"] == 1 and record["stage"] == "full"
    assert (results / "d.beton").read_bytes() == (results / "smoke.beton").read_bytes()
    report = json.loads((results / "d.verify.json").read_text())
    gate = json.loads((results / "smoke.verify.json").read_text())
    assert report["ok"] is True and report["stage"] == "full" and report["num_samples"]["found"] == 10
    assert report["verified_as"]["report"].endswith("smoke.verify.json")
    assert report["file"]["sha256"] == gate["file"]["sha256"] and report["checks"] == gate["checks"]
    assert report["source"]["inputs"], "the full report names the source's inputs as any full report does"

    # a byte changed after the copy: no longer the gate's file, so it is verified in full, and fails
    from betonbuild.beton.format import BetonFile

    beton = results / "d.beton"
    data = bytearray(beton.read_bytes())
    data[int(BetonFile(beton).metadata["image"][3])] ^= 0xFF
    beton.write_bytes(bytes(data))
    failed = run_snakemake(tmp_path, "all", check=False)
    assert failed.returncode != 0
    worst = json.loads((results / "failed" / "d.verify.json").read_text())["worst"]
    assert "field 'image': 1 of 10 samples differ" in worst and "first: sample 3" in worst, worst
    assert not (results / "d.verify.json").exists()


def test_a_dataset_larger_than_its_smoke_file_is_written_and_verified_as_usual(tmp_path, digits_npz):
    write_config(tmp_path, digits(11, 5))  # 11 > 2 x 5
    run_snakemake(tmp_path, "all")
    results = tmp_path / "results" / "d"
    record = json.loads((results / "d.write.json").read_text())
    assert "copied_from" not in record and record["num_workers"] == 2
    report = json.loads((results / "d.verify.json").read_text())
    assert report["ok"] is True and "verified_as" not in report and report["num_samples"]["found"] == 11
