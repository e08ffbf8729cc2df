"""11. betonbuild's field kinds (issue 19): decode throughput through ffcv's Loader next to ffcv's
nearest built-in decoder on the same bytes per sample, and write throughput next to the same data
padded into an NDArrayField.

Decode pairs (one epoch after an untimed compile epoch, ``cores`` Loader threads, in-process time):
- ``ragged_ndarray`` int32, lengths uniform in 1..2M-1 (mean M) vs ``NDArrayDecoder`` on fixed int32[M]
  (``int_list`` decodes with the same compiled decoder); target >= 0.8x its samples/s (issue 19);
- ``text`` vs ``BytesDecoder`` on the same UTF-8 bytes (``bytes`` fields);
- ``gray_image`` JPEG q90 vs ``SimpleRGBImageDecoder`` on the same crops as RGB JPEG q90 (the grey
  crop in 3 channels); target >= 0.8x its pixels/s (issue 19);
- ``gray_image`` raw vs RGB raw of the same crops (pixels/s).
Write pair: ``RaggedArrayField`` vs the same arrays zero-padded into ``NDArrayField`` (plain
DatasetWriter, ``cores`` workers). Content: the decoded sums equal the data's (ragged, text, write).
"""

from __future__ import annotations

import json

import numpy as np

from . import data
from .runner import ContentMismatch, Context, Side, alternate, clean, inner_seconds, median_of, ratio, summarise, target

ID, NAME = 11, "field_kinds"
TITLE = "Field kinds: ragged/text/gray decode vs ffcv's built-in decoders, ragged vs padded write"
MEAN_ELEMENTS = 64
BATCH = 256


def _ragged(n: int, seed: int = 11) -> tuple[np.ndarray, np.ndarray]:
    """(flat int32 values, offsets) of n arrays whose lengths are uniform in 1..2*MEAN_ELEMENTS-1."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 2 * MEAN_ELEMENTS, size=n)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return rng.integers(0, 1000, size=int(offsets[-1]), dtype=np.int32), offsets


def _write(path, fields: dict, samples) -> None:
    from ffcv.writer import DatasetWriter

    class Samples:
        def __len__(self):
            return len(samples)

        def __getitem__(self, i):
            return samples[i]

    DatasetWriter(str(path), fields, num_workers=1).from_indexed_dataset(Samples(), chunksize=1000)


def prepare(ctx: Context, work, n: int, images: int) -> dict:
    """The files each side reads, written untimed by plain ffcv's writer with the fields' classes."""
    import cv2
    from ffcv.fields import BytesField, NDArrayField, RGBImageField

    from betonbuild.fields.gray_field import GrayImageField
    from betonbuild.fields.ragged_field import RaggedArrayField, TextField

    work.mkdir(parents=True, exist_ok=True)
    flat, offsets = _ragged(n)
    np.savez(work / "ragged.npz", flat=flat, offsets=offsets)
    rows = [flat[offsets[i] : offsets[i + 1]] for i in range(n)]
    _write(work / "ragged.beton", {"x": RaggedArrayField("<i4", 1, 2 * MEAN_ELEMENTS)}, [(r,) for r in rows])
    fixed = np.random.default_rng(12).integers(0, 1000, size=(n, MEAN_ELEMENTS), dtype=np.int32)
    _write(work / "fixed.beton", {"x": NDArrayField(np.dtype("<i4"), (MEAN_ELEMENTS,))}, [(r,) for r in fixed])
    texts = ["".join(chr(97 + int(v) % 26) for v in r[: len(r)]) * 4 for r in rows]  # 4 to 508 bytes
    _write(work / "text.beton", {"x": TextField(8 * MEAN_ELEMENTS)}, [(t,) for t in texts])
    _write(work / "bytes.beton", {"x": BytesField()}, [(np.frombuffer(t.encode(), np.uint8),) for t in texts])
    crops_path, _ = data.crops(ctx.cache / "data", images, seed=11)
    crops = np.load(crops_path, mmap_mode="r")
    gray = [np.ascontiguousarray(cv2.cvtColor(np.asarray(c), cv2.COLOR_RGB2GRAY)) for c in crops]
    rgb = [np.ascontiguousarray(np.repeat(g[:, :, None], 3, axis=2)) for g in gray]
    for mode in ("jpg", "raw"):
        _write(work / f"gray_{mode}.beton", {"x": GrayImageField(mode, jpeg_quality=90)}, [(g,) for g in gray])
        _write(work / f"rgb_{mode}.beton", {"x": RGBImageField(write_mode=mode, jpeg_quality=90)}, [(c,) for c in rgb])
    return {
        "ragged_sum": int(flat.sum()),
        "text_sum": int(sum(sum(t.encode()) for t in texts)),
        "pixels": int(sum(g.size for g in gray)),
    }


def _checked(expected: dict, pairs: dict):
    def check(row: dict) -> dict:
        for side, key in (("ragged", "ragged_sum"), ("text", "text_sum"), ("ragged_write", "ragged_sum")):
            if side in row and row[side]["checksum"] != expected[key]:
                raise ContentMismatch(f"{side} decoded a sum of {row[side]['checksum']}, the data's is {expected[key]}")
        for a, b in pairs.values():
            if row[a]["samples"] != row[b]["samples"]:
                raise ContentMismatch(f"{a} decoded {row[a]['samples']} samples, {b} {row[b]['samples']}")
        return {"sums_equal_the_data": True}

    return check


def _json_hook(record: dict, stdout: str, stderr: str) -> None:
    inner_seconds(record, stdout, stderr)
    info = json.loads(stdout.strip().splitlines()[-1])
    record.update(samples=info["samples"], checksum=info["checksum"])


def run(ctx: Context) -> dict:
    n = ctx.sizes["kinds_samples"]
    images = ctx.sizes["kinds_images"]
    work = ctx.cache / NAME
    expected = prepare(ctx, work, n, images)

    def decoder(name: str, file: str, ours: bool) -> Side:
        args = ["decode", work / file, "x", ctx.cores, BATCH] + (["betonbuild"] if ours else [])
        return Side(name, ctx.side_script("kinds", *args), work, after=_json_hook)

    def writer(name: str, kind: str) -> Side:
        out = work / f"{kind}_write.beton"
        command = ctx.side_script("kinds", "write", kind, work / "ragged.npz", out, ctx.cores)
        return Side(name, command, work, before=clean(out), after=_json_hook)

    pairs = {
        "ragged": ("ragged", "ndarray_fixed"),
        "text": ("text", "bytes"),
        "gray_jpeg": ("gray_jpeg", "rgb_jpeg"),
        "gray_raw": ("gray_raw", "rgb_raw"),
        "write": ("ragged_write", "padded_ndarray_write"),
    }
    sides = [
        decoder("ragged", "ragged.beton", True),
        decoder("ndarray_fixed", "fixed.beton", False),
        decoder("text", "text.beton", True),
        decoder("bytes", "bytes.beton", False),
        decoder("gray_jpeg", "gray_jpg.beton", True),
        decoder("rgb_jpeg", "rgb_jpg.beton", False),
        decoder("gray_raw", "gray_raw.beton", True),
        decoder("rgb_raw", "rgb_raw.beton", False),
        writer("ragged_write", "ragged"),
        writer("padded_ndarray_write", "padded"),
    ]
    rounds = alternate(ctx, NAME, sides, check=_checked(expected, pairs))
    # rate ours / theirs = their time / our time (same samples, same pixels per image on both sides)
    ratios = {
        key: ratio(rounds, b, a, "in_process_seconds", " (samples/s ours / theirs)") for key, (a, b) in pairs.items()
    }
    per_second = {
        side.name: round(
            (images if "gray" in side.name or "rgb" in side.name else n)
            / median_of(rounds, side.name, "in_process_seconds")
        )
        for side in sides
    }
    return {
        "id": ID,
        "name": NAME,
        "title": TITLE,
        "data": f"{n} int32 arrays of 1..{2 * MEAN_ELEMENTS - 1} elements (mean {MEAN_ELEMENTS}) and the same "
        f"as text; {images} 256x256 grey crops of real photos; batch {BATCH}, {ctx.cores} Loader threads / writers",
        "sides": summarise(ctx, rounds, sides),
        "ratios": list(ratios.values()),
        "targets": [
            target(
                "ragged >= 0.8x NDArrayDecoder samples/s (issue 19)",
                ratios["ragged"]["of"],
                ">=",
                0.8,
                ratios["ragged"]["median"],
            ),
            target(
                "gray JPEG >= 0.8x RGB JPEG pixels/s (issue 19)",
                ratios["gray_jpeg"]["of"],
                ">=",
                0.8,
                ratios["gray_jpeg"]["median"],
            ),
        ],
        "content": "the ragged and text decodes and the ragged write sum to the data's values; "
        "both sides of a pair decode as many samples",
        "rounds": rounds,
        "notes": [
            "samples/s (images/s for the image sides), in-process: "
            + ", ".join(f"{k} {v}" for k, v in per_second.items()),
            f"pixels per image: {expected['pixels'] // images} on both image sides (RGB: the grey crop in 3 channels)",
        ],
    }
