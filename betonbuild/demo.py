"""Materialises the demo data from real data that ships inside scikit-learn and scikit-image.

- digits.npz: sklearn ``load_digits``, 1797 real 8x8 handwritten digits (uint8 0..16) + labels;
- faces/images.npy, faces/labels.npy: scikit-image ``lfw_subset``, 200 real 25x25 crops
  (float32; label 1 = face, 0 = not a face);
- photos/<photo>/<crop>.png: 256x256 crops of the colour photographs bundled by both packages;
- wds/photos-000N.tar: the same crops as WebDataset shards (JPEG, class label, JSON metadata).
The wine table is read at build time by ``adapters/tables.py`` (a user-style python factory).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

from betonbuild.atomic import atomic_path

CROP = 256
CROPS_PER_PHOTO = 4
SKIMAGE_PHOTOS = (
    "astronaut",
    "coffee",
    "chelsea",
    "rocket",
    "immunohistochemistry",
    "retina",
    "hubble_deep_field",
    "stereo_motorcycle",
)


def colour_photos() -> dict[str, np.ndarray]:
    """Name -> HxWx3 uint8 photograph, from the files bundled with scikit-image and scikit-learn."""
    import skimage.data
    from sklearn.datasets import load_sample_images

    photos = {}
    for name in SKIMAGE_PHOTOS:
        image = getattr(skimage.data, name)()
        photos[name] = image[0] if isinstance(image, tuple) else image  # stereo: left view
    sample = load_sample_images()
    for path, image in zip(sample.filenames, sample.images):
        photos[Path(path).stem] = image
    return photos


def crops(image: np.ndarray, size: int = CROP, count: int = CROPS_PER_PHOTO) -> list[np.ndarray]:
    """``count`` size x size crops at fixed positions along the diagonal (deterministic)."""
    height, width = image.shape[:2]
    out = []
    for k in range(count):
        frac = k / max(count - 1, 1)
        top, left = int(frac * (height - size)), int(frac * (width - size))
        out.append(np.ascontiguousarray(image[top : top + size, left : left + size]))
    return out


def write_digits(path: Path) -> None:
    from sklearn.datasets import load_digits

    digits = load_digits()
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.savez(fh, images=digits.images.astype(np.uint8), target=digits.target.astype(np.int64))


def write_faces(images_path: Path, labels_path: Path) -> None:
    import skimage.data

    faces = skimage.data.lfw_subset().astype(np.float32)
    labels = np.array([1] * 100 + [0] * (len(faces) - 100), dtype=np.int64)
    for path, array in ((images_path, faces), (labels_path, labels)):
        with atomic_path(path) as tmp, open(tmp, "wb") as fh:
            np.save(fh, array)


def write_photo_shards(paths: list[str]) -> None:
    """The same crops as WebDataset shards (jpg + cls + json members), spread over ``paths``."""
    import io

    import webdataset as wds
    from PIL import Image

    samples = []
    for label, (name, image) in enumerate(sorted(colour_photos().items())):
        for k, crop in enumerate(crops(image)):
            jpeg = io.BytesIO()
            Image.fromarray(crop).save(jpeg, format="JPEG", quality=95)
            samples.append(
                {"__key__": f"{name}_{k}", "jpg": jpeg.getvalue(), "cls": label, "json": {"photo": name, "crop": k}}
            )
    per_shard = -(-len(samples) // len(paths))
    for i, path in enumerate(paths):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp, wds.TarWriter(str(tmp)) as sink:
            for sample in samples[i * per_shard : (i + 1) * per_shard]:
                sink.write(sample)


def write_photos(root: Path) -> None:
    """Writes the crops as lossless PNGs into a temp folder, then renames it into place."""
    from PIL import Image

    root = Path(root)
    tmp = root.with_name(f".{root.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    for name, image in sorted(colour_photos().items()):
        folder = tmp / name
        folder.mkdir(parents=True)
        for k, crop in enumerate(crops(image)):
            Image.fromarray(crop).save(folder / f"{name}_{k}.png")
    shutil.rmtree(root, ignore_errors=True)
    os.replace(tmp, root)


GRAY_PHOTOS = ("camera", "coins", "moon", "page", "text")  # scikit-image's greyscale photographs
GRAY_CROP = 64


class GrayTokens:
    """The ``gray_tokens`` demo, read at build time (as the wine table is): each of the 1797 digits as
    a greyscale image, a 64x64 crop of one of scikit-image's greyscale photos, and a variable-length
    token list made from a row of the wine table (the ids of its features above their median)
    with the same tokens as text."""

    def __init__(self, n: int | None = None):
        import skimage.data
        from sklearn.datasets import load_digits, load_wine

        digits = load_digits()
        self.digits = np.round(digits.images * (255 / 16)).astype(np.uint8)  # 0..16 -> 0..255
        self.labels = digits.target.astype(np.int64)
        wine = load_wine()
        above = wine.data > np.median(wine.data, axis=0)
        self.tokens = [np.flatnonzero(row).astype(np.int16) for row in above]
        self.words = [f"{wine.target_names[c]}:" for c in wine.target]
        self.feature_names = list(wine.feature_names)
        self.photos = [getattr(skimage.data, name)() for name in GRAY_PHOTOS]
        self.n = len(self.digits) if n is None else min(int(n), len(self.digits))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index) -> dict:
        i = int(index)
        row = i % len(self.tokens)
        photo = self.photos[i % len(self.photos)]
        top = (37 * i) % (photo.shape[0] - GRAY_CROP)
        left = (53 * i) % (photo.shape[1] - GRAY_CROP)
        return {
            "digit": self.digits[i],
            "photo": np.ascontiguousarray(photo[top : top + GRAY_CROP, left : left + GRAY_CROP]),
            "tokens": self.tokens[row],
            "caption": " ".join([self.words[row]] + [self.feature_names[t] for t in self.tokens[row]]),
            "label": int(self.labels[i]),
        }


def gray_tokens(n: int | None = None) -> GrayTokens:
    """The factory the demo config names (``factory: "betonbuild.demo:gray_tokens"``)."""
    return GrayTokens(n)
