"""The benchmark inputs, prepared once under ``bench/cache/harness/data/`` and reused while their spec holds.

Every image is a 256x256 crop, at a seeded random position and mirrored half of the time, of one
of the 10 real colour photographs bundled with scikit-image and scikit-learn
(``betonbuild.demo.colour_photos``); its label is the photograph's index. Real photos, because
JPEG encode and decode times depend on image content, and noise or flat colour would mislead.

- ``crops(n)``: a ``.npy`` of n x 256 x 256 x 3 uint8 (read memory-mapped) + labels ``.npy``;
- ``shards(n, k)``: the same kind of crops as k WebDataset shards (JPEG q90 ``jpg`` + ``cls``);
- ``image_folder(n)``: ``root/<photo>/<k>.jpg`` (JPEG q95, one class per photograph);
- ``merge_parts(parts, mib)``: part files written by plain ffcv, as ``betonbuild.beton.merge`` receives them.

The scaling benchmark's inputs (``tiny_jpegs``, ``scale_folder``, ``scale_shards``, ``scale_arrays``)
are written into that benchmark's own directory and removed after each case: they are GBs and
quick to make again.

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
    return marker.exists() and json.loads(marker.read_text()) == json.loads(json.dumps(spec))  # tuples as lists


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


TINY = 32
SCALE_CLASSES = 1000


def tiny_jpegs(count: int, seed: int = 9) -> list[bytes]:
    """``count`` distinct 32x32 JPEGs (q90): seeded 256x256 photo crops, box-downscaled, as ImageNet's
    downsampled variants are made."""
    from PIL import Image

    encoded = []
    for image, _, _ in photo_crops(count, seed):
        jpeg = io.BytesIO()
        Image.fromarray(image).resize((TINY, TINY), Image.Resampling.BOX).save(jpeg, format="JPEG", quality=90)
        encoded.append(jpeg.getvalue())
    return encoded


def with_comment(jpeg: bytes, text: bytes) -> bytes:
    """The JPEG with a COM segment (``text``) after its JFIF header: other bytes, the same pixels, still a
    valid JPEG. It makes every sample's file unique (its sha256) without encoding every sample."""
    at = 4 + int.from_bytes(jpeg[4:6], "big") if jpeg[2:4] == b"\xff\xe0" else 2
    return jpeg[:at] + b"\xff\xfe" + (len(text) + 2).to_bytes(2, "big") + text + jpeg[at:]


def scale_sample(pool: list[bytes], k: int) -> tuple[bytes, int]:
    """Sample k of the scaling data: (JPEG bytes, label). Its pixels are pool image k % len(pool), its
    label (class) k % 1000, its bytes unique (a comment naming k)."""
    return with_comment(pool[k % len(pool)], b"sample %d" % k), k % SCALE_CLASSES


def scale_folder(directory: Path, n: int, pool: list[bytes]) -> Path:
    """An ImageNet layout: ``n%08d/`` class folders (min(n, 1000) of them), ``<class>_<k>.JPEG`` files."""
    classes = [f"n{c:08d}" for c in range(min(n, SCALE_CLASSES))]
    for name in classes:
        (directory / name).mkdir(parents=True, exist_ok=True)
    for k in range(n):
        jpeg, label = scale_sample(pool, k)
        (directory / classes[label] / f"{classes[label]}_{k:08d}.JPEG").write_bytes(jpeg)
    return directory


def _tar_member(tar, name: str, payload: bytes) -> None:
    import tarfile

    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(payload), 0, 0o644
    tar.addfile(info, io.BytesIO(payload))


def scale_shards(directory: Path, n: int, pool: list[bytes], per_shard: int = 1000) -> str:
    """WebDataset shards of ``per_shard`` samples (``jpg`` + ``cls``), in the order of ``scale_folder``'s
    labels; returns the brace pattern."""
    import tarfile

    directory.mkdir(parents=True, exist_ok=True)
    count = max(1, -(-n // per_shard))
    for s in range(count):
        with tarfile.open(directory / f"train-{s:06d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for k in range(s * per_shard, min(n, (s + 1) * per_shard)):
                jpeg, label = scale_sample(pool, k)
                _tar_member(tar, f"{k:09d}.jpg", jpeg)
                _tar_member(tar, f"{k:09d}.cls", str(label).encode())
    return str(directory / f"train-{{{0:06d}..{count - 1:06d}}}.tar")


def scale_arrays(directory: Path, n: int, seed: int = 11, block: int = 1 << 20) -> tuple[Path, Path]:
    """(x.npy float32[n, 4] seeded normal, label.npy int64 k % 1000), written in blocks (20M rows: 480 MB)."""
    directory.mkdir(parents=True, exist_ok=True)
    x = np.lib.format.open_memmap(directory / "x.npy", mode="w+", dtype=np.float32, shape=(n, 4))
    label = np.lib.format.open_memmap(directory / "label.npy", mode="w+", dtype=np.int64, shape=(n,))
    rng = np.random.default_rng(seed)
    for start in range(0, n, block):
        stop = min(n, start + block)
        x[start:stop] = rng.standard_normal((stop - start, 4), dtype=np.float32)
        label[start:stop] = np.arange(start, stop) % SCALE_CLASSES
    x.flush(), label.flush()
    del x, label
    return directory / "x.npy", directory / "label.npy"
