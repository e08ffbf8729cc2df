"""libturbojpeg's encode of the RGB pixels gives ffcv's JPEG bytes (cv2.imencode of the BGR copy), and
a process where it does not (or has no libturbojpeg) uses cv2's."""

from __future__ import annotations

import numpy as np
import pytest

from betonbuild._compat import turbojpeg_encode
from betonbuild._compat.turbojpeg_encode import cv2_encode, encode_jpeg, encoder_in_use
from betonbuild.demo import colour_photos


@pytest.fixture(autouse=True)
def forget_proofs():
    turbojpeg_encode._proven.cache_clear()
    yield
    turbojpeg_encode._proven.cache_clear()


def views(photo: np.ndarray) -> list[np.ndarray]:
    """The photo whole, with a pitch wider than its rows, every other pixel (not contiguous), and tiny."""
    return [photo, photo[3:-5, 7:-2], photo[::2, ::3], photo[:9, :13], photo[:1, :1]]


def test_this_machine_encodes_with_libturbojpeg():
    assert encoder_in_use(90) == "libturbojpeg tjCompress2"


@pytest.mark.parametrize("quality", [1, 50, 75, 90, 95, 100])
def test_real_photos_get_cv2s_bytes_at_every_quality(quality):
    for name, photo in colour_photos().items():
        for k, image in enumerate(views(photo)):
            ours, theirs = encode_jpeg(image, quality), cv2_encode(image, quality)
            assert ours.tobytes() == theirs.tobytes(), (name, k, quality)


def test_the_result_is_a_buffer_the_next_encode_reuses():
    """Callers copy it before encoding again: the writer copies it into its page at once."""
    photo = colour_photos()["astronaut"]
    first = encode_jpeg(photo[100:300, 100:300], 90)
    kept = first.copy()
    encode_jpeg(photo[:64, :64], 90)  # smaller: the same buffer
    assert not np.array_equal(first[: kept.size], kept)


def test_a_library_that_gives_other_bytes_is_not_used(monkeypatch):
    """The proof at first use compares bytes: an encoder that differs anywhere falls back to cv2's."""
    real = turbojpeg_encode.TurboJPEGEncoder.encode

    def off_by_one(self, image, quality):
        return real(self, image, min(100, quality + 1))

    monkeypatch.setattr(turbojpeg_encode.TurboJPEGEncoder, "encode", off_by_one)
    assert encoder_in_use(90) == "cv2.imencode"
    image = colour_photos()["coffee"][:50, :70]
    assert encode_jpeg(image, 90).tobytes() == cv2_encode(image, 90).tobytes()


def test_without_libturbojpeg_cv2_encodes(monkeypatch):
    monkeypatch.setattr(turbojpeg_encode, "turbojpeg", lambda: None)
    assert encoder_in_use(90) == "cv2.imencode"
    image = colour_photos()["chelsea"][:40, :40]
    assert encode_jpeg(image, 80).tobytes() == cv2_encode(image, 80).tobytes()


def test_a_refused_image_falls_back_to_cv2_and_then_to_ffcvs_error(monkeypatch):
    monkeypatch.setattr(turbojpeg_encode.TurboJPEGEncoder, "encode", lambda self, image, quality: None)
    monkeypatch.setattr(
        turbojpeg_encode,
        "_proven",
        lambda quality, pid, thread: turbojpeg_encode.TurboJPEGEncoder(turbojpeg_encode.turbojpeg()),
    )
    image = colour_photos()["chelsea"][:40, :40]
    assert encode_jpeg(image, 90).tobytes() == cv2_encode(image, 90).tobytes()
    monkeypatch.setattr(turbojpeg_encode, "cv2_encode", lambda image, quality: None)
    with pytest.raises(ValueError, match="Impossible to encode image in jpeg"):
        encode_jpeg(image, 90)


def test_each_thread_encodes_with_its_own_handle_and_buffer():
    """Threads encoding at once each get cv2's bytes: no handle or buffer is shared between them."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    together = threading.Barrier(4)  # four threads at once, none reused for a second call
    photo = colour_photos()["astronaut"]
    images = [photo[k * 20 : k * 20 + 150, k * 25 : k * 25 + 170] for k in range(12)]

    def encode_all(_):
        together.wait(timeout=30)
        return turbojpeg_encode._encoder(90), [encode_jpeg(image, 90).tobytes() for image in images]

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(encode_all, range(4)))
    expected = [cv2_encode(image, 90).tobytes() for image in images]
    assert all(encoded == expected for _, encoded in results)
    assert len({id(encoder) for encoder, _ in results}) == 4
