"""The pages written so far made durable while the workers still write, so that the fsync before
the file is published (``betonbuild.atomic``) waits for the last pages only.

The workers' pages reach the disk as they are written (O_DIRECT, or their writeback started:
``betonbuild.write.pages``), but that does not make them durable: the fsync at the end still
waited for the disk to commit every page of the file (and its extents). On this project's 2-core
VM that was 0.17-0.34 s per 380 MB JPEG write (benchmark 3, ``strace -T`` at be95576), 4-8% of the
write, spent with both cores idle. A thread of the writer's parent, which only watches the
workers, calls ``fdatasync`` on the file whenever the workers have started new pages, at most
every ``interval`` seconds: the disk commits the file as it grows, the thread waits in the kernel
without a core, and the final fsync covers what was written since the last of these. Nothing
depends on them for correctness: the fsync before the rename is still the one that makes the file
durable, and an error here (a file system without fdatasync) only ends the thread.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

SYNC = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync
INTERVAL_SECONDS = 0.25  # the final fsync then covers about the last quarter-second of pages


class DataSync:
    """``fdatasync(path)`` on a daemon thread whenever ``progress()`` (e.g. the count of pages the
    workers have started) has moved since the last one, at most every ``interval`` seconds, until
    ``stop``. Start it after the workers are forked: they must not inherit a running thread."""

    def __init__(self, path: str, progress: Callable[[], int], interval: float | None = None):
        self.path, self.progress = path, progress
        self.interval = INTERVAL_SECONDS if interval is None else interval
        self.syncs = 0  # fdatasync calls made (tests and troubleshooting)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="betonbuild-data-sync", daemon=True)

    def start(self) -> DataSync:
        self._thread.start()
        return self

    def stop(self, wait: bool = True) -> None:
        """Ends the thread; ``wait``: until a sync under way has returned (the success path, where
        the final fsync would wait for it anyway). A failing write does not wait: the thread owns
        its descriptor and closes it itself."""
        self._stopped.set()
        if wait and self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY)  # Linux syncs a file through any descriptor of it
        except OSError:
            return
        try:
            synced = self.progress()
            while not self._stopped.wait(self.interval):
                now = self.progress()
                if now != synced:
                    SYNC(fd)
                    self.syncs += 1
                    synced = now
        except OSError:
            return  # the fsync before publishing reports what matters
        finally:
            os.close(fd)
