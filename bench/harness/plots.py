"""Pictures beside RESULTS.md, drawn from results.json alone (so ``--render`` redraws them).

A benchmark entry with a ``plot`` key (``{"file", "csv", "curves": {panel: {series: [[x, y], ...]}}}``)
gets a PNG (one log-log panel per family, one line per stage) if matplotlib is installed, and always
the points as CSV. Only the scaling benchmark (b9) has one today.
"""

from __future__ import annotations

import csv
from pathlib import Path


def write_csv(path: Path, curves: dict) -> None:
    with path.open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["family", "stage", "samples", "us_per_sample"])
        for family, stages in curves.items():
            for stage, points in stages.items():
                for n, value in points:
                    out.writerow([family, stage, n, value])


def write_png(path: Path, curves: dict, title: str) -> bool:
    """The growth curves; False (nothing written) without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, axes = plt.subplots(1, max(1, len(curves)), figsize=(5.5 * max(1, len(curves)), 4.5), squeeze=False)
    for ax, (family, stages) in zip(axes[0], curves.items(), strict=False):
        for stage, points in sorted(stages.items()):
            xs, ys = zip(*points, strict=True)
            style = "--" if stage.endswith("(whole)") else "-"  # whole processes, beside the jobs
            ax.plot(xs, [max(y, 1e-3) for y in ys], style, marker="o", label=stage)
        ax.set(xscale="log", yscale="log", title=family, xlabel="samples", ylabel="µs per sample")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def draw(directory: Path, entry: dict, commit: str) -> None:
    """The entry's PNG and CSV into ``directory`` (beside RESULTS.md); measured entries only."""
    plot = entry.get("plot")
    if entry.get("status") != "measured" or not plot or not plot.get("curves"):
        return
    write_csv(directory / plot["csv"], plot["curves"])
    title = f"{entry['title']} (commit {commit}, {entry.get('measured_at', '?')})"
    write_png(directory / plot["file"], plot["curves"], title)
