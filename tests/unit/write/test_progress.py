"""Progress lines in job logs: samples done / total, rate and ETA, one line each (no carriage returns)."""

from __future__ import annotations

import io
import re

from betonbuild.write import progress as progress_module
from betonbuild.write.progress import Progress


def test_progress_prints_a_line_per_interval_with_rate_and_eta_and_a_final_line(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: now[0])
    out = io.StringIO()
    progress = Progress("digits (full)", 1000, stream=out, every_seconds=5.0)
    for done, at in ((100, 101.0), (250, 105.0), (400, 106.0), (800, 110.5)):
        now[0] = at
        progress.update(done)
    now[0] = 112.0
    progress.done = 1000
    progress.close()
    text = out.getvalue()
    assert "\r" not in text
    assert text.splitlines() == [
        "digits (full): 250/1000 samples (25.0%), 50 samples/s, ETA 0:00:15",
        "digits (full): 800/1000 samples (80.0%), 76 samples/s, ETA 0:00:03",
        "digits (full): 1000/1000 samples (100.0%), 83 samples/s, elapsed 0:00:12",
    ]
    assert all(re.fullmatch(r"[^\r]+ samples/s, (ETA|elapsed) \d+:\d\d:\d\d", line) for line in text.splitlines())
