"""An error in ffcv's batch thread raised where the batch is awaited, not a hang.

ffcv 1.0.2's ``EpochIterator`` (``ffcv/loader/epoch_iterator.py``) is the thread that runs the
compiled pipeline; its ``run`` catches only ``StopIteration``. Any other exception there (a
decoder's error, a numba typing or cache error, a file truncated under the reader) ends the thread
with a traceback on stderr, and ``__next__`` then waits on ``output_queue.get()`` for ever: the
verification's Loader batch hung that way with both test workers idle. ``install()`` wraps both
methods: ``run`` keeps its error and ends the epoch as a finished one does (``None`` in the queue),
and ``__next__`` raises ``LoaderThreadError`` from it instead of ``StopIteration``. Nothing changes
for an epoch that ends normally.
"""

from __future__ import annotations

import functools
import queue

from betonbuild._compat import Checked

CHECKED = (
    Checked(
        "ffcv",
        "1.0.2",
        why="EpochIterator.run catches only StopIteration: another error in the batch thread left __next__ "
        "waiting on its queue for ever; it is now raised in the consumer",
    ),
)


class LoaderThreadError(RuntimeError):
    """ffcv's batch thread failed; the original exception is the ``__cause__``."""


def install() -> None:
    """Idempotent; imports ffcv's loader (call it where ffcv is imported anyway)."""
    from ffcv.loader.epoch_iterator import EpochIterator

    if getattr(EpochIterator, "betonbuild_errors_raised", False):
        return
    EpochIterator.run = _keeping_the_error(EpochIterator.run)
    EpochIterator.__next__ = _raising_the_error(EpochIterator.__next__)
    EpochIterator.betonbuild_errors_raised = True


def _keeping_the_error(run):
    @functools.wraps(run)
    def keeping(self):
        try:
            run(self)
        except BaseException as exc:  # noqa: BLE001 -- the thread's end: nothing above it would see the error
            self.betonbuild_error = exc
            while not self.terminate_event.is_set():  # as ffcv's own put: give up once closed
                try:
                    self.output_queue.put(None, timeout=0.5)
                    break
                except queue.Full:
                    pass

    return keeping


def _raising_the_error(next_batch):
    @functools.wraps(next_batch)
    def raising(self):
        try:
            return next_batch(self)
        except StopIteration:
            error = getattr(self, "betonbuild_error", None)
            if error is None:
                raise
            raise LoaderThreadError(f"ffcv's Loader thread failed: {type(error).__name__}: {error}") from error

    return raising
