"""An error in ffcv's batch thread is raised by ``next()`` (``_compat.ffcv_epoch_errors``), not a hang."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from betonbuild._compat.ffcv_epoch_errors import LoaderThreadError, install


@pytest.fixture(scope="module")
def labels_beton(tmp_path_factory) -> Path:
    from ffcv.fields import IntField
    from ffcv.writer import DatasetWriter

    path = tmp_path_factory.mktemp("epoch") / "labels.beton"
    DatasetWriter(str(path), {"label": IntField()}, num_workers=1).from_indexed_dataset([(i,) for i in range(10)])
    return path


def failing_operation():
    """An ffcv Operation whose compiled code raises in the batch thread (as a broken decoder does)."""
    from ffcv.pipeline.operation import Operation

    class Fails(Operation):
        def generate_code(self):
            def fails(values, destination):
                raise ValueError("a decoder failed")

            return fails

        def declare_state_and_memory(self, previous_state):
            return previous_state, None

    return Fails()


def first_batch_within(loader, seconds: float):
    """``next(iter(loader))`` in a thread: its value or exception, or a hang reported as one."""
    outcome = {}

    def take():
        try:
            outcome["batch"] = next(iter(loader))
        except BaseException as exc:  # noqa: BLE001 -- the outcome, whatever it is
            outcome["error"] = exc

    taker = threading.Thread(target=take, daemon=True)
    taker.start()
    taker.join(seconds)
    assert not taker.is_alive(), f"next(iter(loader)) still waiting after {seconds} s"
    return outcome


def loader(path: Path, *operations):
    from ffcv.fields.decoders import IntDecoder
    from ffcv.loader import Loader, OrderOption

    return Loader(
        str(path),
        batch_size=4,
        num_workers=1,
        order=OrderOption.SEQUENTIAL,
        drop_last=False,
        pipelines={"label": [IntDecoder(), *operations]},
    )


def test_an_error_in_the_batch_thread_is_raised_by_next(labels_beton: Path):
    install()
    outcome = first_batch_within(loader(labels_beton, failing_operation()), 120)
    error = outcome.get("error")
    assert isinstance(error, LoaderThreadError), outcome
    assert "a decoder failed" in str(error) and isinstance(error.__cause__, ValueError)


def test_an_epoch_that_ends_normally_is_unchanged(labels_beton: Path):
    install()
    install()  # idempotent: the methods are wrapped once
    batches = [np.asarray(labels).ravel().tolist() for (labels,) in loader(labels_beton)]
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
