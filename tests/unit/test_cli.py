"""`betonbuild inspect` on any .beton, and `betonbuild verify` giving the workflow's report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import ListDataset

from betonbuild.cli import main
from betonbuild.custom import FixedUTF8Field

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def plain_ffcv_file(tmp_path_factory) -> Path:
    """A .beton written by plain ffcv, not by betonbuild: a custom field among built-in ones."""
    from ffcv.fields import BytesField, IntField, JSONField, NDArrayField, RGBImageField
    from ffcv.writer import DatasetWriter

    from betonbuild.custom import FixedUTF8Field
    from betonbuild.demo import colour_photos

    photo = colour_photos()["coffee"]
    samples = [
        (
            i,
            f"tïtle {i}",
            np.full((2, 3), i, dtype=np.int16),
            np.frombuffer(bytes([i] * (i + 1)), np.uint8),
            {"i": i},
            np.ascontiguousarray(photo[10 * i : 10 * i + 32, :48]),
        )
        for i in range(6)
    ]
    path = tmp_path_factory.mktemp("plain") / "plain.beton"
    fields = {
        "n": IntField(),
        "title": FixedUTF8Field(16),
        "arr": NDArrayField(np.dtype("int16"), (2, 3)),
        "blob": BytesField(),
        "meta": JSONField(),
        "img": RGBImageField(write_mode="jpg"),
    }
    DatasetWriter(str(path), fields, page_size=1 << 21, num_workers=1).from_indexed_dataset(ListDataset(samples))
    return path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(
    "command, expected",
    [
        ("inspect", ["--samples N", "--json", "--digest", "--custom NAME=pkg.module:Class", "any .beton"]),
        ("verify", ["--config", "--dataset", "--record", "--threads", "--mode", "--output", "--smoke"]),
    ],
)
def test_help_of_each_command(command, expected):
    result = subprocess.run([str(BIN / "betonbuild"), command, "--help"], capture_output=True, text=True)
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    for option in expected:
        assert option in text, f"`betonbuild {command} --help` does not mention {option}"


def test_inspect_describes_a_file_betonbuild_did_not_write(plain_ffcv_file: Path, capsys):
    code, out, _ = run(
        capsys, "inspect", str(plain_ffcv_file), "--custom", "title=betonbuild.custom:FixedUTF8Field", "--samples", "2"
    )
    assert code == 0
    assert "format        version 2, page size 2.0 MiB (2097152 bytes)" in out
    assert "samples       6" in out
    assert "data region   bytes [2097152, 4194304): 1 pages, 1 used, fill ratio" in out
    assert "class=betonbuild.custom.FixedUTF8Field" in out and "dtype=<i2, shape=[2, 3]" in out
    assert "jpeg 6, raw 0" in out
    assert "structure     ok" in out
    assert "first 2 samples" in out and "'tïtle 1'" in out and '{"i":1}' in out and "2 bytes: 01 01" in out
    assert "[2]" not in out


def test_inspect_json_has_header_pages_bytes_per_field_and_samples(plain_ffcv_file: Path, capsys):
    code, out, _ = run(
        capsys,
        "inspect",
        str(plain_ffcv_file),
        "--json",
        "--digest",
        "--samples",
        "6",
        "--custom",
        "title=betonbuild.custom:FixedUTF8Field",
    )
    info = json.loads(out)
    assert code == 0 and info["structure_ok"] is True
    assert info["header"] == {
        "version": 2,
        "page_size": 2097152,
        "num_samples": 6,
        "num_fields": 6,
        "alloc_table_ptr": 4194304,
    }
    fields = {f["name"]: f for f in info["fields"]}
    assert fields["arr"]["data_bytes"] == 6 * 12 and fields["blob"]["data_bytes"] == sum(range(1, 7))
    assert fields["title"]["metadata_bytes"] == 6 * 16 and fields["title"]["data_bytes"] == 0
    assert info["layout"]["allocations"] == 6 * 4 and 0 < info["layout"]["fill_ratio"] < 0.01
    assert [s["fields"]["n"] for s in info["samples"]] == list(range(6))
    assert len(info["content_digest"]) == 64


def test_inspect_without_a_custom_class_shows_the_header_and_how_to_register_it(plain_ffcv_file: Path, capsys):
    code, out, _ = run(capsys, "inspect", str(plain_ffcv_file))
    assert code == 0
    assert "  1  title            custom       type id 255" in out
    assert "--custom title=module:Class" in out


def test_inspect_of_a_file_the_writer_never_finished_is_an_error(plain_ffcv_file: Path, tmp_path: Path, capsys):
    data = bytearray(plain_ffcv_file.read_bytes())
    data[16:24] = bytes(8)
    broken = tmp_path / "broken.beton"
    broken.write_bytes(bytes(data))
    code, out, err = run(capsys, "inspect", str(broken))
    assert code == 1 and out == ""
    assert "betonbuild error:" in err and "allocation table pointer is 0: the writer never finished this file" in err


def test_inspect_exit_status_2_when_a_structural_check_fails(plain_ffcv_file: Path, tmp_path: Path, capsys):
    from betonbuild.beton.format import BetonFile

    beton = BetonFile(plain_ffcv_file, custom_handlers={"title": FixedUTF8Field})
    at = beton.metadata_start + beton.metadata_type.fields["blob"][1]  # sample 0's blob pointer
    data = bytearray(plain_ffcv_file.read_bytes())
    data[at : at + 8] = np.uint64(int(beton.metadata["blob"][1]["ptr"])).tobytes()
    bad = tmp_path / "bad.beton"
    bad.write_bytes(bytes(data))
    code, out, _ = run(capsys, "inspect", str(bad), "--custom", "title=betonbuild.custom:FixedUTF8Field")
    assert code == 2
    assert "structure     PROBLEMS" in out and "metadata_pointers: field 'blob': sample 0's" in out


def test_inspect_with_a_malformed_custom_option_says_how_to_write_it(plain_ffcv_file: Path, capsys):
    code, out, err = run(capsys, "inspect", str(plain_ffcv_file), "--custom", "title")
    assert code == 1 and out == ""
    assert "betonbuild error: --custom 'title': write NAME=pkg.module:Class" in err


def test_the_command_line_starts_without_numpy_yaml_or_ffcv():
    """The function-local imports in cli.py exist for this: `betonbuild --help` stays quick."""
    code = (
        "import sys, betonbuild.cli; print(sorted({'numpy', 'yaml', 'jsonschema', 'ffcv', 'torch'} & set(sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.fixture
def cli_project(tmp_path: Path, monkeypatch):
    from conftest import make_digits_npz

    make_digits_npz(tmp_path / "digits.npz", n=120)
    (tmp_path / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "datasets": {
                    "digits": {
                        "source": {
                            "kind": "arrays",
                            "path": "digits.npz",
                            "columns": {"image": "images", "label": "target"},
                        },
                        "fields": {
                            "image": {"type": "ndarray", "dtype": "uint8", "shape": [8, 8]},
                            "label": {"type": "int"},
                        },
                        "writer": {"shuffle": True, "seed": 5},
                    }
                }
            }
        )
    )
    monkeypatch.chdir(tmp_path)
    assert (
        main(["write", "--config", "config.yaml", "--dataset", "digits", "--output", "digits.beton", "--workers", "2"])
        == 0
    )
    return tmp_path


def test_verify_prints_the_workflows_report(cli_project: Path, capsys):
    capsys.readouterr()
    code, out, err = run(
        capsys, "verify", "digits.beton", "--config", "config.yaml", "--dataset", "digits", "--threads", "2"
    )
    report = json.loads(out)
    assert code == 0, err
    assert report["ok"] is True and report["stage"] == "full" and report["mode"] == "full"
    assert report["num_samples"] == {"expected": 120, "found": 120}
    assert len(report["content_digest"]) == 64  # a value of the report, not a check
    assert [c["name"] for c in report["checks"]] == [
        "format_version",
        "num_samples",
        "fields",
        "allocations",
        "fixed_fields",
        "loader_batch",
        "same_ffcv_build",
    ]
    assert report["source"]["kind"] == "arrays" and report["source"]["inputs"]["files"] == 1
    assert report["config"]["writer"]["seed"] == 5 and report["write"]["num_workers"] == 2
    assert report["provenance"]["writer"]["libffcv_sha256"] == report["provenance"]["reader"]["libffcv_sha256"]


def test_verify_of_a_corrupted_file_prints_the_failed_report_and_exits_1(cli_project: Path, capsys):
    from betonbuild.beton.format import BetonFile

    ptr = int(BetonFile("digits.beton").metadata["image"][17])
    data = bytearray(Path("digits.beton").read_bytes())
    data[ptr] ^= 0xFF
    Path("digits.beton").write_bytes(bytes(data))
    capsys.readouterr()
    code, _, err = run(
        capsys,
        "verify",
        "digits.beton",
        "--config",
        "config.yaml",
        "--dataset",
        "digits",
        "--mode",
        "sample",
        "--output",
        "report.json",
    )
    report = json.loads(Path("report.json").read_text())
    assert code == 1 and report["ok"] is False and report["mode"] == "sample"
    assert "field 'image': 1 of 120 samples differ from the source (first: sample 17" in report["worst"]
    assert "betonbuild error:" in err and "fixed_fields: field 'image': 1 of 120 samples differ" in err


def test_verify_without_a_write_record_says_where_it_looked(cli_project: Path, capsys):
    Path("digits.beton.write.json").unlink()
    capsys.readouterr()
    code, out, err = run(capsys, "verify", "digits.beton", "--config", "config.yaml", "--dataset", "digits")
    assert code == 1 and out == ""
    assert "no write record for digits.beton (looked for digits.write.json and digits.beton.write.json)" in err


@pytest.mark.slow  # a fresh process that imports ffcv and runs its Loader
def test_verify_in_a_fresh_process_on_two_threads(tmp_path: Path):
    """A new interpreter imports ffcv during the report: its pool threads must not import it concurrently."""
    from conftest import make_photo_folder

    make_photo_folder(tmp_path / "photos", per_class=6)
    (tmp_path / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "datasets": {
                    "p": {
                        "source": {"kind": "image_folder", "root": "photos"},
                        "fields": {"image": {"type": "rgb_image", "write_mode": "jpg"}, "label": {"type": "int"}},
                    }
                }
            }
        )
    )
    cli = str(BIN / "betonbuild")
    subprocess.run(
        [cli, "write", "--config", "config.yaml", "--dataset", "p", "--output", "p.beton"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    result = subprocess.run(
        [cli, "verify", "--config", "config.yaml", "--dataset", "p", "p.beton", "--threads", "2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["ok"] and report["threads"] == 2 and report["mode"] == "full"


def test_write_counts_its_inputs_without_reading_them_for_a_digest_and_verify_hashes_them(
    cli_project: Path, capsys, monkeypatch
):
    import betonbuild.sources.files as files

    hashed = []
    real = files.sha256_file
    monkeypatch.setattr(files, "sha256_file", lambda path, raw=False: hashed.append(str(path)) or real(path, raw))
    args = ["--config", "config.yaml", "--dataset", "digits"]
    assert main(["write", *args, "--output", "again.beton"]) == 0
    assert not [p for p in hashed if p.endswith("digits.npz")], "nothing of a direct write keeps the digest"
    capsys.readouterr()
    code, out, _ = run(capsys, "verify", "again.beton", *args)
    report = json.loads(out)
    assert code == 0 and len(report["source"]["inputs"]["sha256"]) == 64  # the report names what it checked
    assert [p for p in hashed if p.endswith("digits.npz")]
