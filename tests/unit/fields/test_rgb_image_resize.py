"""``ffcv_resizer`` is ffcv's resizer without importing ffcv: the same pixels on every size tried."""

from __future__ import annotations

import numpy as np
import pytest

from betonbuild.demo import colour_photos
from betonbuild.fields.builtin_encoders import ffcv_resizer

SIZES = [
    (2, 2),
    (100, 300),
    (300, 100),
    (255, 256),
    (256, 256),
    (257, 256),
    (333, 500),
    (500, 333),
    (799, 201),
    (513, 512),
]


@pytest.mark.parametrize("target", [None, 3, 64, 256, 300, 512])
def test_ffcv_resizer_equals_ffcvs_own(target):
    from ffcv.fields.rgb_image import resizer

    photo = colour_photos()["astronaut"]
    for height, width in SIZES:
        image = np.ascontiguousarray(photo[:height, :width])
        ours, theirs = ffcv_resizer(image, target), resizer(image, target)
        assert ours.shape == theirs.shape and np.array_equal(ours, theirs), (height, width, target)
