"""The direct libjpeg-turbo decode of plain JPEGs (betonbuild.sources.jpeg) against webdataset's
rgb8 (PIL): real photos, every JPEG flavour, PNG, and seeded damage; cv2 where the library is absent."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from wds_samples import image_payloads, rgb8, wds_spec, write_shard

import betonbuild.sources.jpeg as jpeg_module
from betonbuild.sources.jpeg import cv2_rgb8, jpeg_kind
from betonbuild.sources.shards import shard_list
from betonbuild.sources.webdataset import WebDatasetSource

pytest.importorskip("webdataset")


@pytest.fixture
def image_source(tmp_path, monkeypatch):
    """A WebDatasetSource over one shard of all image_payloads(), with the direct decoder's calls counted."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(jpeg_module, "JPEG_KINDS", {})
    calls: list[int] = []
    real = jpeg_module.fast_rgb8
    monkeypatch.setattr(jpeg_module, "fast_rgb8", lambda data: calls.append(1) or real(data))
    samples = [
        {"__key__": f"{i:03d}_{name}", ext: payload}
        for i, (name, (ext, payload, _)) in enumerate(image_payloads().items())
    ]
    write_shard(tmp_path / "images.tar", samples)
    spec = wds_spec("images.tar", keys={"image": "jpg;jpeg;png"}, fields={"image": {"type": "rgb_image"}})
    Path("shards.json").write_text(json.dumps(shard_list(spec, "cache.json")))
    return WebDatasetSource(spec, "shards.json"), calls


def test_jpeg_kind_admits_plain_jpegs_only():
    for name, (_, payload, plain) in image_payloads().items():
        assert (jpeg_kind(payload) is not None) == plain, name
    jpeg = image_payloads()["astronaut-420"][1]
    for damaged in (jpeg[:-1], jpeg[:-2], jpeg + b"\0", jpeg[:400] + b"\xff\xd9" + jpeg[400:], jpeg[:2] + jpeg[4:]):
        assert jpeg_kind(damaged) is None


def test_rgb8_decode_gives_webdataset_s_arrays_directly_for_plain_jpegs(image_source):
    source, calls = image_source
    payloads = list(image_payloads().items())
    assert len(source) == len(payloads)
    for index, (name, (ext, payload, _plain)) in enumerate(payloads):
        (image,) = source[index]
        expected = rgb8(ext, payload)
        assert image.dtype == expected.dtype == np.uint8 and image.shape == expected.shape, name
        assert image.shape[2] == 3 and np.array_equal(image, expected), name
    assert len(calls) == sum(plain for _, (_, _, plain) in payloads)  # decoded directly: every plain JPEG
    assert len(jpeg_module.JPEG_KINDS) >= 5 and all(jpeg_module.JPEG_KINDS.values()), jpeg_module.JPEG_KINDS


def test_a_direct_decode_that_disagrees_with_pil_leaves_that_kind_to_pil(image_source, monkeypatch):
    source, _ = image_source
    real = jpeg_module.fast_rgb8
    monkeypatch.setattr(jpeg_module, "fast_rgb8", lambda data: real(data) ^ np.uint8(1))  # another libjpeg
    for index, (name, (ext, payload, _)) in enumerate(image_payloads().items()):
        assert np.array_equal(source[index][0], rgb8(ext, payload)), name
    assert jpeg_module.JPEG_KINDS and not any(jpeg_module.JPEG_KINDS.values())


@pytest.mark.filterwarnings("ignore:Tag data larger than file")  # PIL, reading a damaged EXIF block
def test_a_damaged_jpeg_decodes_or_fails_exactly_as_with_webdataset(image_source):
    """Seeded byte damage to real JPEGs: where PIL raises, cv2 alone often returns pixels."""
    source, _ = image_source
    rng = np.random.default_rng(7)
    plain = [payload for ext, payload, fast in image_payloads().values() if fast]
    outcomes, cv2_alone_would_differ = {}, 0
    for trial in range(400):
        damaged = bytearray(plain[trial % len(plain)])
        for _ in range(int(rng.integers(1, 4))):
            damaged[int(rng.integers(2, len(damaged)))] = 0xFF if rng.random() < 0.3 else int(rng.integers(256))
        if trial % 10 == 0:  # cut, with or without an end marker
            damaged = damaged[: int(rng.integers(2, len(damaged)))] + (b"\xff\xd9" if trial % 20 else b"")
        damaged = bytes(damaged)
        try:
            expected = rgb8("jpg", damaged)
        except Exception as exc:  # noqa: BLE001 - whatever PIL raises, the source must raise too
            with pytest.raises(type(exc)):
                source.decode1("jpg", damaged)
            cv2_alone_would_differ += cv2_rgb8(damaged) is not None
            outcomes["fails"] = outcomes.get("fails", 0) + 1
            continue
        assert np.array_equal(source.decode1("jpg", damaged), expected), trial
        outcomes["decodes"] = outcomes.get("decodes", 0) + 1
    assert outcomes.get("fails", 0) > 20 and outcomes.get("decodes", 0) > 20, outcomes
    assert cv2_alone_would_differ > 0, outcomes


def test_a_jpeg_the_library_refuses_leaves_the_next_ones_decoded_directly():
    """libturbojpeg 2.1.5 keeps failing on a handle whose header read failed; the handle is renewed."""
    good = image_payloads()["astronaut-420"][1]
    sof = good.index(b"\xff\xc0")
    refused = good[: sof + 1] + b"\xcf" + good[sof + 2 :]  # an arithmetic lossless frame: unsupported
    assert jpeg_module.fast_rgb8(refused) is None
    for _ in range(2):
        assert np.array_equal(jpeg_module.fast_rgb8(good), rgb8("jpg", good))
