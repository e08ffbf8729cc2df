"""gray_image's centre-crop decoder through the real ffcv.Loader (2 workers, random order, the last
partial batch kept), raw and JPEG, shrinking and enlarging crops: every image against PIL's centre
crop of the same decoded image, resized with OpenCV's INTER_AREA (what ffcv's C resize does for
RGB): exactly where the crop shrinks, within 1 level on average (3 per image) where it enlarges
(OpenCV then interpolates bilinearly, the area mean mixes the 1-2 pixels each output pixel covers)."""

from __future__ import annotations

import numpy as np
import pytest

from betonbuild.config.load import load_config
from betonbuild.fields.gray_crop import center_crop_decoder
from betonbuild.loading import loader_fields, loader_pipelines, unpad
from betonbuild.sources import open_source
from betonbuild.write.writer import write_beton

ADAPTER = """
import numpy as np
from skimage import data

PHOTOS = [data.camera(), data.coins(), data.moon(), data.page()]


class Photos:
    def __len__(self):
        return 21

    def __getitem__(self, i):
        photo = PHOTOS[i % 4]
        return {"photo": np.ascontiguousarray(photo[i : 60 + 7 * i, 3 * i : 100 - i]), "label": i}


def make():
    return Photos()
"""


def loader(path, order, pipelines):
    from ffcv.loader import Loader, OrderOption

    return Loader(
        str(path),
        batch_size=4,
        num_workers=2,
        order=getattr(OrderOption, order),
        drop_last=False,
        custom_fields=loader_fields(path),
        pipelines=pipelines,
    )


@pytest.mark.parametrize("write_mode", ["raw", "jpg"])
@pytest.mark.parametrize("output_size, ratio", [((24, 32), 0.875), ((80, 80), 1.0)])
def test_every_centre_crop_equals_pil_on_the_decoded_image(tmp_path, monkeypatch, write_mode, output_size, ratio):
    import cv2
    from ffcv.transforms import ToTensor
    from PIL import Image

    (tmp_path / "photos_adapter.py").write_text(ADAPTER)
    monkeypatch.chdir(tmp_path)
    fields = {"photo": {"type": "gray_image", "write_mode": write_mode, "jpeg_quality": 90}, "label": {"type": "int"}}
    config = {"datasets": {"p": {"source": {"kind": "python", "factory": "photos_adapter:make"}, "fields": fields}}}
    spec = load_config(config).datasets["p"]
    source = open_source(spec)
    path = tmp_path / "p.beton"
    write_beton(spec, source, np.arange(len(source)), path, 2, log=open("/dev/null", "w"))

    decoded = {}  # the full images as the Loader decodes them (the JPEG's own error left out)
    for photo, label, shape in loader(path, "SEQUENTIAL", loader_pipelines(path)):
        for i, image in zip(label.numpy().reshape(-1), unpad(photo, shape)):
            decoded[int(i)] = np.array(image[:, :, 0])  # a copy: the Loader reuses its buffers
    if write_mode == "raw":
        assert all(np.array_equal(decoded[i], source[i]["photo"]) for i in decoded)

    enlarged, shrunk = [], 0
    crop = {"photo": [center_crop_decoder(output_size, ratio), ToTensor()]}
    for photo, label in loader(path, "RANDOM", crop):
        assert photo.shape[1:] == (*output_size, 1)
        for i, got in zip(label.numpy().reshape(-1), photo.numpy()):
            full = decoded.pop(int(i))
            height, width = full.shape
            side = int(ratio * min(height, width))
            top, left = (height - side) // 2, (width - side) // 2
            want = np.asarray(Image.fromarray(full).crop((left, top, left + side, top + side)))
            want = cv2.resize(want, output_size[::-1], interpolation=cv2.INTER_AREA).astype(np.int16)
            error = np.abs(got[:, :, 0].astype(np.int16) - want)
            if side >= max(output_size):
                assert not error.any(), f"sample {i}: a shrinking crop differs from INTER_AREA"
                shrunk += 1
            else:
                enlarged.append(error)
    assert not decoded, "every image once, the last partial batch included"
    assert shrunk and enlarged, "these images give both kinds of crop at either output size"
    assert float(np.mean([e.mean() for e in enlarged])) <= 1.0
    assert max(float(e.mean()) for e in enlarged) <= 3.0


def test_an_output_size_or_ratio_that_cannot_crop_is_refused():
    with pytest.raises(ValueError, match="output_size"):
        center_crop_decoder((0, 8))
    with pytest.raises(ValueError, match="ratio"):
        center_crop_decoder((8, 8), ratio=1.5)
