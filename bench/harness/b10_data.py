"""The input of benchmark 10: an ImageNet-like image folder made from the bundled photographs.

``imagenet_like(root, n, classes)``: ``root/n%08d/<class>_<k>.JPEG``, n files in ``classes`` class
folders. Each file is a seeded random crop (a quarter to all of the shorter side, mirrored half of
the time) of one of the 10 colour photographs bundled with scikit-image and scikit-learn, resized
(INTER_AREA) so that its larger side is 200-800 px, saved as JPEG at quality 75-95, 4:2:0, a
tenth of them progressive. ImageNet's train set's quirks are planted at fixed places: one CMYK
JPEG (k = 1), greyscale JPEGs (every 97th file), and one PNG named ``.JPEG`` (k = 2).
Written to a temporary name and renamed; ``spec.json`` records what was asked for.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from .data import _fresh, _publish, _ready

SIDES = (200, 800)
QUALITY = (75, 95)
GREY_EVERY, CMYK_AT, PNG_AT = 97, 1, 2


def imagenet_like(root: Path, n: int, classes: int = 100, seed: int = 18) -> Path:
    import cv2
    from PIL import Image

    from betonbuild.demo import colour_photos

    directory = root / f"imagenet-like-{n}-{classes}-{seed}"
    spec = {"kind": "imagenet_like", "n": n, "classes": classes, "seed": seed, "sides": SIDES, "quality": QUALITY}
    if _ready(directory, spec):
        return directory
    print(f"  preparing an ImageNet-like folder of {n} JPEGs in {directory}", flush=True)
    photos = [image[..., :3] for _, image in sorted(colour_photos().items())]
    rng = np.random.default_rng(seed)
    tmp = _fresh(directory)
    for k in range(n):
        photo = photos[int(rng.integers(len(photos)))]
        height, width = photo.shape[:2]
        side = int(rng.integers(min(height, width) // 4, min(height, width) + 1))
        crop_w = min(width, int(side * rng.uniform(0.75, 1.33)))
        top, left = int(rng.integers(height - side + 1)), int(rng.integers(width - crop_w + 1))
        crop = photo[top : top + side, left : left + crop_w]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        scale = int(rng.integers(SIDES[0], SIDES[1] + 1)) / max(crop.shape[:2])
        size = (max(1, round(crop.shape[1] * scale)), max(1, round(crop.shape[0] * scale)))
        image = Image.fromarray(np.ascontiguousarray(cv2.resize(crop, size, interpolation=cv2.INTER_AREA)))
        label = k % classes
        folder = tmp / f"n{label:08d}"
        folder.mkdir(exist_ok=True)
        path = folder / f"n{label:08d}_{k}.JPEG"
        quality, progressive = int(rng.integers(QUALITY[0], QUALITY[1] + 1)), bool(rng.random() < 0.1)
        if k == PNG_AT:
            image.save(path, format="PNG")
        elif k == CMYK_AT:
            image.convert("CMYK").save(path, format="JPEG", quality=quality)
        else:
            if k % GREY_EVERY == GREY_EVERY - 1:
                image = image.convert("L")
            out = io.BytesIO()
            image.save(out, format="JPEG", quality=quality, progressive=progressive)
            path.write_bytes(out.getvalue())
    return _publish(tmp, directory, spec)
