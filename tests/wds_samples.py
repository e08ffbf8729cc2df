"""Real samples, shards and damaged tars for the webdataset tests (tests/unit/sources/test_tar.py,
test_shards.py, test_jpeg.py, test_webdataset_source.py and tests/workflow/test_webdataset.py).

Shards are written with webdataset's own TarWriter from real data: 64x64 crops of the colour
photographs bundled with scikit-image/scikit-learn (JPEG, one as PNG) with a class and JSON
metadata, and sklearn's handwritten digits (.npy + class).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from betonbuild.config.load import load_config


def _jpeg(image: np.ndarray, quality: int = 95, fmt: str = "JPEG") -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(image).save(out, format=fmt, **({"quality": quality} if fmt == "JPEG" else {}))
    return out.getvalue()


_PHOTO_CACHE: list[dict] = []


def photo_samples() -> list[dict]:
    """20 samples: 2 crops (64x64) of each of the 10 bundled photos; jpg (one png), cls, json."""
    if not _PHOTO_CACHE:
        from betonbuild.demo import colour_photos, crops

        for label, (name, image) in enumerate(sorted(colour_photos().items())):
            for k, crop in enumerate(crops(image, size=64, count=2)):
                sample = {"__key__": f"{name}_{k}", "cls": label, "json": {"photo": name, "crop": k}}
                if name == "coffee" and k == 1:
                    sample["png"] = _jpeg(crop, fmt="PNG")  # the `jpg;png` alternative
                else:
                    sample["jpg"] = _jpeg(crop)
                _PHOTO_CACHE.append(sample)
    return [dict(s) for s in _PHOTO_CACHE]


def digit_samples(n: int = 60) -> list[dict]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    return [
        {"__key__": f"digit{i:04d}", "npy": digits.images[i].astype(np.uint8), "cls": int(digits.target[i])}
        for i in range(n)
    ]


def write_shard(path: Path, samples: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    import webdataset as wds

    with wds.TarWriter(str(path)) as sink:
        for sample in samples:
            sink.write(sample)
    return path


def decoded_image(sample: dict) -> np.ndarray:
    from PIL import Image

    payload = sample.get("jpg", sample.get("png"))
    return np.asarray(Image.open(io.BytesIO(payload)).convert("RGB"))


PHOTO_FIELDS = {"image": {"type": "rgb_image", "write_mode": "jpg"}, "label": {"type": "int"}, "meta": {"type": "json"}}
PHOTO_KEYS = {"image": "jpg;png", "label": "cls", "meta": "json"}


def photo_dataset(shards, **extra) -> dict:
    return {
        "source": {"kind": "webdataset", "shards": shards, "keys": PHOTO_KEYS, **extra},
        "fields": PHOTO_FIELDS,
        "smoke": {"samples": 3},
    }


def wds_spec(shards, keys=PHOTO_KEYS, fields=PHOTO_FIELDS, name="d", **source):
    entry = {"source": {"kind": "webdataset", "shards": shards, "keys": keys, **source}, "fields": fields}
    return load_config({"datasets": {name: entry}}).datasets[name]


def tar_offsets(path: Path) -> list[tuple[str, int, int]]:
    import tarfile

    with tarfile.open(path) as tar:
        return [(m.name, m.offset, m.offset_data + m.size) for m in tar]


# -- tars of every kind tarfile writes, and damaged ones -------------------------------------


def tarfile_members(path) -> list[tuple[str, bool, int]]:
    """What webdataset reads: tarfile in stream mode."""
    import tarfile

    with tarfile.open(path, "r|*") as tar:
        return [(m.name, m.isreg(), m.size if m.isreg() else 0) for m in tar]


LONG_DIR = "d" * 90 + "/" + "e" * 70  # names past 100 bytes: a ustar prefix, a GNU 'L' or a PAX path


def odd_tar(path: Path, fmt: str, compression: str = "") -> Path:
    """Real photo bytes under every kind of name and member tarfile writes in ``fmt``."""
    import tarfile

    jpg = photo_samples()[0]["jpg"]
    files = [
        ("dir.v1/0001.jpg", jpg),
        ("dir.v1/0001.cls", b"3"),  # a dot in a directory
        ("0002.JPG", jpg),
        ("0002.Seg.PNG", jpg),  # upper case, two extensions
        ("__meta__", b"{}"),
        ("__x__/0003.cls", b"1"),  # webdataset's meta members: skipped
        ("README", b"no extension: no sample key"),
        (f"{LONG_DIR}/0004.jpg", jpg),
        (f"{LONG_DIR}/0004.cls", b"4"),
        ("café/0005.jpg", jpg),
        ("0006.txt", b""),  # a non-ASCII name, an empty member
    ]
    pax = {"comment": "a global header"} if fmt == "pax" else None
    formats = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, f"w:{compression}", format=formats[fmt], pax_headers=pax) as tar:
        directory = tarfile.TarInfo("dir.v1")
        directory.type = tarfile.DIRTYPE
        tar.addfile(directory)
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1700000000.5 if fmt == "pax" else 1700000000
            tar.addfile(info, io.BytesIO(data))
        for name, kind in (("0007.jpg", tarfile.SYMTYPE), ("0008.jpg", tarfile.LNKTYPE)):
            link = tarfile.TarInfo(name)
            link.type, link.linkname = kind, "0002.JPG"
            tar.addfile(link)
    return path


def photo_shard_bytes(tmp_path: Path) -> tuple[bytes, list[tuple[str, int, int]]]:
    shard = write_shard(tmp_path / "good.tar", photo_samples()[:5])
    return shard.read_bytes(), tar_offsets(shard)


def damaged_tar(data: bytes, members, how: str) -> tuple[bytes, list[str]]:
    """A PAX shard of 5 samples damaged ``how``, and what count_shard's message must say.

    Each member is a PAX header block, its records block, then the member's header and data."""
    start = {name: first for name, first, _ in members}
    stop = {name: end for name, _, end in members}
    last = stop["china_0.json"] + (-stop["china_0.json"]) % 512  # the end of the last member's padded data
    if how == "cut_inside_payload":
        return data[: stop["astronaut_1.jpg"] - 700], [
            "truncated at byte",
            "inside member 'astronaut_1.jpg'",
            "(sample key astronaut_1)",
            "unexpected end of data",
        ]
    if how == "cut_between_samples":
        return data[: start["chelsea_0.cls"]], [
            "truncated at byte",
            "after member 'astronaut_1.json'",
            "(sample key astronaut_1)",
        ]
    if how == "cut_inside_a_header":
        return data[: start["chelsea_0.cls"] + 300], ["truncated", "after member 'astronaut_1.json'"]
    if how == "no_end_blocks":
        return data[:last], ["truncated", "after member 'china_0.json' (sample key china_0)"]
    if how == "one_end_block":
        return data[: last + 512], ["truncated", "the second end-of-archive block is missing"]
    damaged = bytearray(data)
    if how == "bad_checksum":
        header = start["chelsea_0.jpg"] + 1024
        damaged[header + 5] ^= 0x01  # one bit of the member's name
        return bytes(damaged), [
            f"corrupt at byte {header}",
            "bad checksum",
            "after member 'chelsea_0.cls' (sample key chelsea_0)",
        ]
    if how == "garbage_header":
        header = start["chelsea_0.cls"]
        damaged[header : header + 512] = bytes(range(256)) * 2
        return bytes(damaged), [f"corrupt at byte {header}", "not a tar header", "after member 'astronaut_1.json'"]
    raise ValueError(how)


DAMAGE = [
    "cut_inside_payload",
    "cut_between_samples",
    "cut_inside_a_header",
    "no_end_blocks",
    "one_end_block",
    "bad_checksum",
    "garbage_header",
]


# -- images stored the ways a shard may hold them --------------------------------------------


def _encoded(image: np.ndarray, fmt: str = "JPEG", mode: str | None = None, **options) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    picture = Image.fromarray(image)
    (picture.convert(mode) if mode else picture).save(out, format=fmt, **options)
    return out.getvalue()


def _with_orientation(image: np.ndarray) -> bytes:
    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees to display": rgb8 does not apply it
    return _encoded(image, quality=90, exif=exif.tobytes())


def _cv2_jpeg(image: np.ndarray, *flags: int) -> bytes:
    import cv2

    return cv2.imencode(".jpg", np.ascontiguousarray(image[..., ::-1]), [cv2.IMWRITE_JPEG_QUALITY, 90, *flags])[
        1
    ].tobytes()


_IMAGE_CACHE: dict[str, tuple[str, bytes, bool]] = {}


def image_payloads() -> dict[str, tuple[str, bytes, bool]]:
    """name -> (extension, payload, whether cv2 decodes it): real photos stored the ways a shard may
    hold them; crops of 90x70, not a multiple of the 16-pixel MCU."""
    if _IMAGE_CACHE:
        return _IMAGE_CACHE
    import cv2
    import skimage.data

    from betonbuild.demo import colour_photos

    out = _IMAGE_CACHE
    for name, photo in sorted(colour_photos().items()):
        crop = np.ascontiguousarray(photo[37:127, 51:121, :3])
        out[f"{name}-420"] = ("jpg", _encoded(crop, quality=90), True)
        out[f"{name}-444"] = ("jpg", _encoded(crop, quality=75, subsampling=0), True)
        out[f"{name}-422"] = ("jpeg", _encoded(crop, quality=95, subsampling=1), True)
        out[f"{name}-progressive"] = ("jpg", _encoded(crop, quality=85, progressive=True), True)
        out[f"{name}-gray"] = ("jpg", _encoded(crop, mode="L", quality=90), True)
        out[f"{name}-exif-rotated"] = ("jpg", _with_orientation(crop), True)
        out[f"{name}-cv2-restarts"] = ("jpg", _cv2_jpeg(crop, cv2.IMWRITE_JPEG_RST_INTERVAL, 3), True)
        out[f"{name}-cmyk"] = ("jpg", _encoded(crop, mode="CMYK", quality=90), False)
        out[f"{name}-png"] = ("png", _encoded(crop, fmt="PNG"), False)
        out[f"{name}-png-as-jpg"] = ("jpg", _encoded(crop, fmt="PNG"), False)  # PIL goes by content
    for name in ("camera", "coins", "moon"):
        gray = np.ascontiguousarray(getattr(skimage.data, name)()[11:101, 23:93])
        out[f"{name}-gray"] = ("jpg", _encoded(gray, quality=90), True)
        out[f"{name}-gray-progressive"] = ("jpg", _encoded(gray, quality=80, progressive=True), True)
        out[f"{name}-png-gray"] = ("png", _encoded(gray, fmt="PNG"), False)
        out[f"{name}-png-16bit"] = ("png", _encoded(gray.astype(np.uint16) * 257, fmt="PNG"), False)
        out[f"{name}-png-palette"] = ("png", _encoded(np.stack([gray] * 3, -1), fmt="PNG", mode="P"), False)
        out[f"{name}-png-rgba"] = ("png", _encoded(np.stack([gray] * 3, -1), fmt="PNG", mode="RGBA"), False)
    return out


def rgb8(ext: str, payload: bytes):
    """webdataset's own rgb8 decode."""
    import webdataset as wds

    return wds.autodecode.Decoder([wds.autodecode.imagehandler("rgb8")]).decode1(ext, payload)
