"""libturbojpeg's encode of the RGB pixels gives ffcv's JPEG bytes (cv2.imencode of the BGR copy), and
a process where it does not (or has no libturbojpeg) uses cv2's."""

from __future__ import annotations

import numpy as np
import pytest

from betonbuild._compat import turbojpeg_encode
from betonbuild._compat.cv2_jpeg_digests import CV2_JPEG_DIGESTS, RECORDED_WITH
from betonbuild._compat.turbojpeg_encode import cv2_encode, encode_jpeg, encoder_in_use
from betonbuild.demo import colour_photos


@pytest.fixture(autouse=True)
def forget_proofs():
    turbojpeg_encode.prove.cache_clear()
    turbojpeg_encode._forget_encoders()
    yield
    turbojpeg_encode.prove.cache_clear()
    turbojpeg_encode._forget_encoders()


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
    monkeypatch.setattr(turbojpeg_encode, "prove", lambda quality: True)
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


def test_the_recorded_cv2_digests_are_the_installed_cv2s_at_every_quality():
    """The table stands for cv2 in the proof: it must be cv2's bytes, here, at every quality. On a
    failure after a pin move: python -m betonbuild._compat.turbojpeg_encode records them again."""
    assert turbojpeg_encode.installed_opencv_version() == RECORDED_WITH
    assert sorted(CV2_JPEG_DIGESTS) == list(range(1, 101))
    for quality, recorded in CV2_JPEG_DIGESTS.items():
        assert turbojpeg_encode.live_cv2_proof_digest(quality) == recorded, quality


def test_a_recorded_digest_that_differs_disproves_libturbojpeg(monkeypatch):
    monkeypatch.setitem(CV2_JPEG_DIGESTS, 90, "0" * 32)
    assert encoder_in_use(90) == "cv2.imencode"
    assert encoder_in_use(91) == "libturbojpeg tjCompress2"


def test_another_opencv_version_is_compared_with_cv2_itself(monkeypatch):
    """The table is trusted only for the opencv-python it was recorded with: any other, cv2 encodes
    the proof images itself (here the same bytes, so libturbojpeg is still proven)."""
    monkeypatch.setattr(turbojpeg_encode, "installed_opencv_version", lambda: "4.0.0")
    monkeypatch.setitem(CV2_JPEG_DIGESTS, 90, "0" * 32)  # would disprove it if it were read
    assert turbojpeg_encode.cv2_proof_digest(90) == turbojpeg_encode.live_cv2_proof_digest(90)
    assert encoder_in_use(90) == "libturbojpeg tjCompress2"


WORKER_IMPORTS = """
import multiprocessing, sys
from betonbuild.fields.builtin_encoders import RGBImageEncoder
from betonbuild._compat import turbojpeg_encode
import numpy as np

RGBImageEncoder(write_mode="jpg", jpeg_quality=90)  # the writer's parent builds its fields
parent_encoder = turbojpeg_encode._encoder(90)

def child(queue):
    fresh = getattr(turbojpeg_encode._threads, "encoder", None) is None
    image = np.random.default_rng(1).integers(0, 256, (64, 48, 3), dtype=np.uint8)
    jpeg = turbojpeg_encode.encode_jpeg(image, 90).tobytes()
    queue.put((fresh, turbojpeg_encode._encoder(90) is not parent_encoder, "cv2" in sys.modules, jpeg))

queue = multiprocessing.get_context("fork").Queue()
process = multiprocessing.get_context("fork").Process(target=child, args=(queue,))
process.start()
fresh, own, cv2_imported, jpeg = queue.get(timeout=60)
process.join()
image = np.random.default_rng(1).integers(0, 256, (64, 48, 3), dtype=np.uint8)
assert jpeg == turbojpeg_encode.cv2_encode(image, 90).tobytes()
print(fresh, own, cv2_imported)
"""


def test_a_forked_worker_encodes_without_importing_cv2_with_its_own_encoder():
    """The parent proves libturbojpeg (from the recorded digests: no cv2), the forked worker inherits
    the verdict, makes its own handle and buffer, and gets cv2's bytes without importing cv2."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", WORKER_IMPORTS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "False"]
