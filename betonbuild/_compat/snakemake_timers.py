"""Lets a finished local Snakemake run exit at once.

Snakemake's scheduler wakes itself once per ``--max-jobs-per-timespan`` span (1 s by default) with
a ``threading.Timer``. The last of those timers is a non-daemon thread, so the finished workflow
waits up to a second for it before the process can exit (0.5 s on average: a tenth of a small
incremental build). A shorter span cannot be configured: Snakemake 9 reads "100ms" as 100 minutes.
The workflow's onsuccess/onerror hooks run after the scheduler has stopped, when the pending wake-up
timers have nothing left to wake, so cancelling them is safe.
"""

from __future__ import annotations

import threading

from betonbuild._compat import Checked

CHECKED = (
    Checked(
        "snakemake",
        "9.27.1",
        why="JobScheduler._schedule_reevalutation's last timer cancelled: up to 1 s (0.5 s on average) "
        "off the end of every finished run",
    ),
)
SCHEDULER_WAKE_UP = "_schedule_reevalutation"  # (sic) Snakemake 9's JobScheduler method that starts them


def cancel_idle_timers() -> int:
    """Cancels the scheduler's pending wake-up timers (none of anyone else's); returns how many."""
    timers = [
        t
        for t in threading.enumerate()
        if isinstance(t, threading.Timer)
        and t.is_alive()
        and SCHEDULER_WAKE_UP in getattr(getattr(t, "function", None), "__qualname__", "")
    ]
    for timer in timers:
        timer.cancel()
    return len(timers)
