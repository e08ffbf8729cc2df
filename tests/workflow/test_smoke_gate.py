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
    assert "smoke" in jobs(failed) and "write" not in jobs(failed), jobs(failed)
    assert not (tmp_path / "logs" / "write").exists(), "the full write must not start"
    assert not (results / "photos.beton").exists() and not (results / "smoke.verify.json").exists()
    # Snakemake removes the failed job's outputs: no smoke file stands as if it had passed
    assert not (results / "smoke.beton").exists() and not (results / "smoke.write.json").exists()
    report = json.loads((results / "failed" / "smoke.verify.json").read_text())
    assert report["ok"] is False and report["stage"] == "smoke"
    assert "betonbuild error: dataset 'photos': verification of" in output
    assert "failed/smoke.verify.json" in output

    write_config(tmp_path, photos(8.0))  # the tolerance is a parameter of the smoke job: it reruns
    fixed = run_snakemake(tmp_path, "all")
    assert {"smoke", "write", "verify"} <= jobs(fixed), jobs(fixed)
    gate = json.loads((results / "smoke.verify.json").read_text())
    assert gate["ok"] is True and gate["stage"] == "smoke" and gate["num_samples"]["found"] == 4
    assert {c["name"] for c in gate["checks"]} >= {"loader_batch", "same_ffcv_build"}
    assert json.loads((results / "photos.verify.json").read_text())["ok"] is True
    assert not (results / "failed" / "smoke.verify.json").exists(), "a passing gate removes the old failure"
