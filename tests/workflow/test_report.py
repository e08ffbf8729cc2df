"""The HTML report shows what is IN the .beton: its contact sheet is decoded from the file."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest
from conftest import make_digits_npz, run_snakemake, write_config
from PIL import Image, ImageDraw

from betonbuild.report import CELL, COLUMNS, LABEL_HEIGHT

PURE = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("report")
    from betonbuild.demo import colour_photos, crops

    # class folders sort as: a_red, b_green, c_blue, d_photo -> labels 0, 1, 2, 3
    for prefix, (name, rgb) in zip("abc", PURE.items()):
        (workdir / "images" / f"{prefix}_{name}").mkdir(parents=True)
        Image.new("RGB", (40, 30), rgb).save(workdir / "images" / f"{prefix}_{name}" / "0.png")
    (workdir / "images" / "d_photo").mkdir()
    for k, crop in enumerate(crops(colour_photos()["astronaut"], size=48, count=2)):
        Image.fromarray(crop).save(workdir / "images" / "d_photo" / f"{k}.png")
    make_digits_npz(workdir / "digits.npz", n=100)
    write_config(
        workdir,
        {
            "colours": {
                "source": {"kind": "image_folder", "root": "images"},
                "fields": {"image": {"type": "rgb_image", "write_mode": "raw"}, "label": {"type": "int"}},
                "smoke": {"samples": 2},
            },
            # the same images stored as JPEG: the contact sheet decodes them (ffcv's JPEG path, not raw)
            "jpeg_colours": {
                "source": {"kind": "image_folder", "root": "images"},
                "fields": {
                    "image": {"type": "rgb_image", "write_mode": "jpg", "jpeg_quality": 90},
                    "label": {"type": "int"},
                },
                "smoke": {"samples": 2},
            },
            "digits": {
                "source": {"kind": "arrays", "path": "digits.npz", "columns": {"image": "images", "label": "target"}},
                "fields": {"image": {"type": "ndarray", "dtype": "uint8", "shape": [8, 8]}, "label": {"type": "int"}},
                "smoke": {"samples": 2},
            },
        },
    )
    run_snakemake(workdir, "all")
    run_snakemake(workdir, "--report", str(workdir / "report.zip"))
    return workdir


def cell(sheet: np.ndarray, k: int) -> np.ndarray:
    x, y = (k % COLUMNS) * CELL, (k // COLUMNS) * (CELL + LABEL_HEIGHT)
    return sheet[y : y + CELL, x : x + CELL]


def caption_strip(sheet: np.ndarray, k: int) -> np.ndarray:
    x, y = (k % COLUMNS) * CELL, (k // COLUMNS) * (CELL + LABEL_HEIGHT) + CELL
    return sheet[y : y + LABEL_HEIGHT, x : x + CELL]


def rendered_caption(text: str) -> np.ndarray:
    """The strip a caption should give: PIL's default font, black on white, 2 px in."""
    strip = Image.new("RGB", (CELL, LABEL_HEIGHT), "white")
    ImageDraw.Draw(strip).text((2, 2), text, fill="black")
    return np.asarray(strip)


def centre(sheet: np.ndarray, k: int) -> np.ndarray:
    return cell(sheet, k)[CELL // 2 - 5 : CELL // 2 + 5, CELL // 2 - 5 : CELL // 2 + 5]


def test_contact_sheet_pixels_are_the_images_read_back_in_order(reported):
    sheet = np.asarray(Image.open(reported / "results/colours/report/preview.png").convert("RGB"))
    for k, rgb in enumerate(PURE.values()):
        shown = centre(sheet, k)
        assert np.all(shown == np.array(rgb, dtype=np.uint8)), (k, rgb, shown[0, 0])
    photo = np.asarray(Image.open(reported / "images/d_photo/0.png").convert("RGB")).astype(int)
    shown = cell(sheet, 3)[(CELL - 48) // 2 : (CELL - 48) // 2 + 48, (CELL - 48) // 2 : (CELL - 48) // 2 + 48]
    assert np.abs(shown.astype(int) - photo).mean() < 1.0  # raw storage: the photo itself, not BGR


def test_jpeg_images_keep_their_colours_in_the_contact_sheet(reported):
    """A pure-red source stored as JPEG is red in the sheet: no BGR swap on the JPEG decode path."""
    sheet = np.asarray(Image.open(reported / "results/jpeg_colours/report/preview.png").convert("RGB")).astype(int)
    for k, (name, rgb) in enumerate(PURE.items()):
        shown = centre(sheet, k)
        error = np.abs(shown - np.array(rgb)).max()
        assert error <= 12, f"{name} source shows as {shown[0, 0]} (largest channel error {error})"
        assert shown[..., int(np.argmax(rgb))].min() > 200, (name, shown[0, 0])
    photo = np.asarray(Image.open(reported / "images/d_photo/0.png").convert("RGB")).astype(int)
    shown = cell(sheet, 3)[(CELL - 48) // 2 : (CELL - 48) // 2 + 48, (CELL - 48) // 2 : (CELL - 48) // 2 + 48]
    assert np.abs(shown - photo).mean() < 8.0  # JPEG q90: near the photo, and in RGB order


@pytest.mark.parametrize("dataset", ["colours", "jpeg_colours"])
def test_each_image_is_captioned_with_its_row_and_label(reported, dataset):
    sheet = np.asarray(Image.open(reported / f"results/{dataset}/report/preview.png").convert("RGB"))
    # rows in file order: a_red, b_green, c_blue, then the two photo crops -> labels 0, 1, 2, 3, 3
    for row, label in enumerate([0, 1, 2, 3, 3]):
        expected = rendered_caption(f"#{row} label={label}")
        assert (expected < 128).any()
        assert np.array_equal(caption_strip(sheet, row), expected), f"{dataset}: caption of row {row}"


def test_numeric_dataset_gets_a_plot(reported):
    plot = Image.open(reported / "results/digits/report/preview.png")
    assert plot.width > 300 and plot.height > 150


def test_summary_page_lists_fields_checks_provenance_and_timings(reported):
    page = (reported / "results/colours/report/summary.html").read_text()
    assert "colours: verified OK" in page
    for text in (
        "rgb_image",
        "fixed_fields",
        "same_ffcv_build",
        "libffcv_sha256",
        "write",
        "verify",
        "content digest sha256 ",
    ):
        assert text in page
    # the timings table: every earlier stage's benchmark file, then the verify job's own row,
    # measured by that job (it makes this page; its benchmark file comes after it)
    stages = [cells.split("</td>")[0] for cells in page.split("<h3>Build timings</h3>")[1].split("<tr><td>")[1:]]
    assert stages == ["file_list", "source_manifest", "write", "verify (this job, up to this page)"]


def test_snakemake_report_holds_every_dataset(reported):
    with zipfile.ZipFile(reported / "report.zip") as archive:
        names = archive.namelist()
        text = "".join(archive.read(n).decode("utf-8", "replace") for n in names if n.endswith((".js", ".html")))
    assert sum(n.endswith("/preview.png") for n in names) == 3
    assert sum(n.endswith("/summary.html") for n in names) == 3
    for ds in ("colours", "jpeg_colours", "digits"):
        assert ds in text
