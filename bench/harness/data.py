"""The benchmark inputs, prepared once under ``bench/cache/harness/data/`` and reused while their spec holds.

Every image is a 256x256 crop, at a seeded random position and mirrored half of the time, of one
of the 10 real colour photographs bundled with scikit-image and scikit-learn
(``betonbuild.demo.colour_photos``); its label is the photograph's index. Real photos, because
JPEG encode and decode times depend on image content, and noise or flat colour would mislead.

- ``crops(n)``: a ``.npy`` of n x 256 x 256 x 3 uint8 (read memory-mapped) + labels ``.npy``;
- ``shards(n, k)``: the same kind of crops as k WebDataset shards (JPEG q90 ``jpg`` + ``cls``);
- ``image_folder(n)``: ``root/<photo>/<k>.jpg`` (JPEG q95, one class per photograph);
- ``merge_parts(parts, mib)``: part files written by plain ffcv, as ``betonbuild.beton.merge`` receives them.

Each is written to a temporary name, then renamed; a ``spec.json`` records what was asked for,
so a change of size regenerates it.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np

CROP = 256
CROP_BYTES = CROP * CROP * 3


def _ready(directory: Path, spec: dict) -> bool:
    marker = directory / "spec.json"
    return marker.exists() and json.loads(marker.read_text()) == spec


def _fresh(directory: Path) -> Path:
    tmp = directory.with_name(f".{directory.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def _publish(tmp: Path, directory: Path, spec: dict) -> Path:
    (tmp / "spec.json").write_text(json.dumps(spec))
    shutil.rmtree(directory, ignore_errors=True)
    tmp.rename(directory)
    return directory


def photo_crops(n: int, seed: int) -> Iterator[tuple[np.ndarray, int, str]]:
    """n seeded crops: (256x256x3 uint8 image, label, photo name)."""
    from betonbuild.demo import colour_photos

    photos = sorted((name, image[..., :3]) for name, image in colour_photos().items())
    rng = np.random.default_rng(seed)
    for _ in range(n):
        label = int(rng.integers(len(photos)))
        name, photo = photos[label]
        top = int(rng.integers(photo.shape[0] - CROP + 1))
        left = int(rng.integers(photo.shape[1] - CROP + 1))
        crop = photo[top : top + CROP, left : left + CROP]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        yield np.ascontiguousarray(crop), label, name


def crops(root: Path, n: int, seed: int = 1) -> tuple[Path, Path]:
    """(images.npy, labels.npy) of n crops; images are read memory-mapped by every side."""
    directory = root / f"crops-{n}-{seed}"
    spec = {"kind": "crops", "n": n, "seed": seed}
    if not _ready(directory, spec):
        print(f"  preparing {n} crops ({n * CROP_BYTES / 2**30:.1f} GiB) in {directory}", flush=True)
        tmp = _fresh(directory)
        images = np.lib.format.open_memmap(tmp / "images.npy", mode="w+", dtype=np.uint8, shape=(n, CROP, CROP, 3))
        labels = np.empty(n, dtype=np.int64)
        for k, (image, label, _) in enumerate(photo_crops(n, seed)):
            images[k], labels[k] = image, label
        images.flush()
        del images
        np.save(tmp / "labels.npy", labels)
        _publish(tmp, directory, spec)
    return directory / "images.npy", directory / "labels.npy"


def raw_samples(nbytes: int) -> int:
    """Crops needed for at least ``nbytes`` of raw pixels."""
    return max(1, math.ceil(nbytes / CROP_BYTES))


def shards(root: Path, n: int, count: int, seed: int = 2) -> tuple[Path, str]:
    """(directory, brace pattern) of ``count`` WebDataset shards holding n JPEG q90 crops in total."""
    import webdataset as wds
    from PIL import Image

    directory = root / f"shards-{n}x{count}-{seed}"
    spec = {"kind": "shards", "n": n, "count": count, "seed": seed, "quality": 90}
    pattern = str(directory / f"train-{{0000..{count - 1:04d}}}.tar")
    if _ready(directory, spec):
        return directory, pattern
    print(f"  preparing {count} WebDataset shards of {n} crops in {directory}", flush=True)
    tmp = _fresh(directory)
    per_shard = -(-n // count)
    crop_iter = photo_crops(n, seed)
    for s in range(count):
        with wds.TarWriter(str(tmp / f"train-{s:04d}.tar")) as sink:
            for k in range(s * per_shard, min(n, (s + 1) * per_shard)):
                image, label, _ = next(crop_iter)
                jpeg = io.BytesIO()
                Image.fromarray(image).save(jpeg, format="JPEG", quality=90)
                sink.write({"__key__": f"s{s:04d}_{k:06d}", "jpg": jpeg.getvalue(), "cls": label})
    return _publish(tmp, directory, spec), pattern


def image_folder(root: Path, n: int, seed: int = 3) -> Path:
    """root/<photo>/<k>.jpg: n JPEG q95 crops, one class folder per photograph."""
    from PIL import Image

    directory = root / f"folder-{n}-{seed}"
    spec = {"kind": "image_folder", "n": n, "seed": seed, "quality": 95}
    if _ready(directory, spec):
        return directory
    print(f"  preparing an image folder of {n} JPEG crops in {directory}", flush=True)
    tmp = _fresh(directory)
    for k, (image, _, name) in enumerate(photo_crops(n, seed)):
        (tmp / name).mkdir(exist_ok=True)
        Image.fromarray(image).save(tmp / name / f"{k:06d}.jpg", quality=95)
    return _publish(tmp, directory, spec)


class _RandomRows:
    """Samples of one merge part: (global index, 1 MiB of seeded random bytes)."""

    def __init__(self, part: int, n: int, sample_bytes: int, seed: int):
        self.part, self.n, self.sample_bytes, self.seed = part, n, sample_bytes, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index):
        rng = np.random.default_rng([self.seed, self.part, int(index)])
        return int(self.part * self.n + index), rng.integers(0, 256, self.sample_bytes, dtype=np.uint8)


class _Concatenated:
    def __init__(self, parts: list[_RandomRows]):
        self.parts = parts

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    def __getitem__(self, index):
        part, row = divmod(int(index), len(self.parts[0]))
        return self.parts[part][row]


def merge_parts(root: Path, parts: int, part_mib: int, sample_bytes: int = 1 << 20, seed: int = 4) -> dict:
    """Parts as ffcv writes them (1 worker, 8 MiB pages): ``label`` int + ``data`` uint8[1 MiB] random bytes.

    Also ``whole.beton``, the same samples written as ONE file by plain ffcv: the merge of the parts
    must have its content digest (checked once here).
    """
    from ffcv.fields import IntField, NDArrayField
    from ffcv.writer import DatasetWriter

    from betonbuild.beton.merge import merge_betons

    from .runner import digest

    per_part = max(1, (part_mib << 20) // sample_bytes)
    directory = root / f"merge-{parts}x{per_part}-{seed}"
    spec = {"kind": "merge_parts", "parts": parts, "per_part": per_part, "sample_bytes": sample_bytes, "seed": seed}
    paths = [directory / f"part{k}.beton" for k in range(parts)]
    info = {
        "parts": paths,
        "reference": directory / "reference.beton",
        "per_part": per_part,
        "payload_bytes": parts * per_part * sample_bytes,
    }
    if _ready(directory, spec):
        info["digest"] = json.loads((directory / "digest.json").read_text())["digest"]
        return info
    print(f"  preparing {parts} merge parts of {per_part} MiB in {directory}", flush=True)
    tmp = _fresh(directory)

    def fields():
        return {"label": IntField(), "data": NDArrayField(np.dtype("u1"), (sample_bytes,))}

    rows = [_RandomRows(k, per_part, sample_bytes, seed) for k in range(parts)]
    with contextlib.redirect_stderr(io.StringIO()):  # ffcv's progress bars
        for k, part_rows in enumerate(rows):
            DatasetWriter(str(tmp / paths[k].name), fields(), num_workers=1).from_indexed_dataset(part_rows)
        merge_betons([tmp / p.name for p in paths], tmp / "reference.beton")
        DatasetWriter(str(tmp / "whole.beton"), fields(), num_workers=1).from_indexed_dataset(_Concatenated(rows))
    merged, whole = digest(tmp / "reference.beton"), digest(tmp / "whole.beton")
    if merged != whole:
        raise RuntimeError(f"the merge of the parts has digest {merged}, the same samples written whole {whole}")
    (tmp / "whole.beton").unlink()
    (tmp / "digest.json").write_text(json.dumps({"digest": merged}))
    _publish(tmp, directory, spec)
    info["digest"] = merged
    return info
