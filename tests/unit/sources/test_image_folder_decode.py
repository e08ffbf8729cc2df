"""An image folder's images decoded by libjpeg-turbo directly (betonbuild.sources.jpeg) where that
gives PIL's pixels, and by PIL otherwise: real photos in every JPEG flavour, grey, CMYK and PNG
files, the image modes the field's contract judges, and a write equal to plain ffcv's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from wds_samples import image_payloads

import betonbuild.sources.jpeg as jpeg_module
from betonbuild.config.load import load_config
from betonbuild.errors import SampleError
from betonbuild.sources import open_source
from betonbuild.sources.jpeg import jpeg_kind
from betonbuild.write.writer import write_beton


def folder_spec(root: Path, **image):
    entry = {
        "source": {"kind": "image_folder", "root": str(root)},
        "fields": {"image": {"type": "rgb_image", "write_mode": "jpg", **image}, "label": {"type": "int"}},
    }
    return load_config({"datasets": {"photos": entry}}).datasets["photos"]


@pytest.fixture
def photos(tmp_path: Path, monkeypatch) -> tuple[Path, list[str], list[int]]:
    """Every payload of ``image_payloads`` as a file of class ``c``, in file order; the direct
    decoder's calls counted, the process's agreement record emptied."""
    root = tmp_path / "photos"
    (root / "c").mkdir(parents=True)
    names = sorted(image_payloads())
    for name in names:
        ext, payload, _ = image_payloads()[name]
        (root / "c" / f"{name}.{ext}").write_bytes(payload)
    monkeypatch.setattr(jpeg_module, "JPEG_KINDS", {})
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 89_478_485)  # PIL's default: another test's adapter lowers it
    calls: list[int] = []
    real = jpeg_module.fast_rgb8
    monkeypatch.setattr(jpeg_module, "fast_rgb8", lambda data: calls.append(1) or real(data))
    return root, names, calls


def pil_decode(path: Path):
    with Image.open(path) as image:
        image.load()
        return image.copy()


def test_colour_jpegs_are_pil_s_pixels_and_the_rest_pil_s_images(photos):
    root, names, calls = photos
    source = open_source(folder_spec(root))
    files = source.files
    direct = 0
    for index, name in enumerate(names):
        image, label = source[index]
        expected = pil_decode(Path(files[index]))
        assert label == 0
        if isinstance(image, np.ndarray):
            direct += 1
            assert expected.mode == "RGB", name
            assert image.dtype == np.uint8 and np.array_equal(image, np.asarray(expected)), name
        else:  # grey, CMYK, PNG: PIL's own image, of PIL's mode, naming its file
            assert image.mode == expected.mode and np.array_equal(np.asarray(image), np.asarray(expected)), name
            assert image.filename == files[index]
    colour = [n for n in names if (k := jpeg_kind(image_payloads()[n][1])) is not None and k[1] == 3]
    kinds = {jpeg_kind(image_payloads()[n][1]) for n in colour}
    assert len(colour) >= 20 and len(calls) == len(colour)  # every colour JPEG went through the direct decode
    assert direct == len(colour) - len(kinds)  # the first of each kind is PIL's, compared with the direct one
    assert all(jpeg_module.JPEG_KINDS.values()) and len(jpeg_module.JPEG_KINDS) == len(kinds)


def test_a_grey_jpeg_is_still_refused_under_strict_and_converted_under_convert(photos):
    from betonbuild.write.contract import check_sample

    root, names, _ = photos
    grey = names.index("camera-gray")
    strict = folder_spec(root)
    with pytest.raises(SampleError, match="mode L"):
        check_sample(strict, open_source(strict)[grey], grey)
    converting = folder_spec(root, image_mode="convert")
    image, _ = check_sample(converting, open_source(converting)[grey], grey)
    assert np.array_equal(image, np.asarray(pil_decode(Path(open_source(converting).files[grey])).convert("RGB")))


def test_the_write_holds_plain_ffcv_s_bytes(photos, tmp_path: Path):
    """One worker, the colour photos re-encoded: byte for byte the file ffcv's own writer makes of
    PIL's images (its RGBImageField encodes what it is given; the direct decode gave it the same pixels)."""
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    root, names, _ = photos
    for name in names:  # the colour JPEGs only: a plain write refuses the rest
        path = next((root / "c").glob(f"{name}.*"))
        kind = jpeg_kind(path.read_bytes())
        if kind is None or kind[1] != 3:
            path.unlink()
    spec = folder_spec(root)
    source = open_source(spec)
    ours = tmp_path / "ours.beton"
    write_beton(spec, source, np.arange(len(source)), ours, 1)

    class Plain:
        def __len__(self):
            return len(source)

        def __getitem__(self, index):
            return pil_decode(Path(source.files[index])), 0

    theirs = tmp_path / "plain.beton"
    fields = {"image": RGBImageField(write_mode="jpg"), "label": IntField()}
    DatasetWriter(str(theirs), fields, num_workers=1).from_indexed_dataset(Plain())
    assert sum(isinstance(source[i][0], np.ndarray) for i in range(len(source))) > len(source) // 2  # decoded directly
    assert ours.read_bytes() == theirs.read_bytes()


def test_a_jpeg_that_source_jpeg_keep_re_encodes_is_decoded_as_reencode_decodes_it(photos):
    """Under ``source_jpeg: keep``, an image that is not kept (here every one: all are larger than
    ``max_resolution``) is decoded as ``reencode`` decodes it: a colour JPEG directly, with PIL's
    pixels, the rest by PIL, so keep writes it as reencode does, without PIL's slower image."""
    from betonbuild.fields.kept_jpeg import Reencode  # why: only this test looks inside keep's values

    root, names, calls = photos
    keeping = open_source(folder_spec(root, source_jpeg="keep", max_resolution=64, image_mode="convert"))
    reencoding = open_source(folder_spec(root, max_resolution=64, image_mode="convert"))
    for index in range(len(names)):  # the first JPEG of each kind is PIL's, compared with the direct decode
        keeping[index]
    direct = 0
    for index, name in enumerate(names):
        kept, _ = keeping[index]
        expected, _ = reencoding[index]
        assert isinstance(kept, Reencode), name
        assert type(kept.image) is type(expected), name
        assert np.array_equal(np.asarray(kept.image), np.asarray(expected)), name
        if isinstance(kept.image, np.ndarray):
            direct += 1
            assert kept.reason == "larger_than_max_resolution", name
    assert direct > len(names) // 3 and len(calls) >= 2 * direct  # both sources went through the direct decode
