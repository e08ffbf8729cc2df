"""What the HTML report shows of a dataset: pictures DECODED FROM THE .beton, and a summary page.

The contact sheet is built from the file, not from the source, so it shows what training will see
(orientation, colours, crops). Numeric datasets get a plot of their labels and value ranges.
"""

from __future__ import annotations

import html
import json
import resource
import time
from pathlib import Path

import numpy as np

from betonbuild.atomic import atomic_path
from betonbuild.beton.format import BetonFile
from betonbuild.config.spec import DatasetSpec, FieldSpec
from betonbuild.fields import field_kind
from betonbuild.fields.custom import custom_handlers
from betonbuild.mapped_pages import release_mapped

CELL = 96  # pixels per thumbnail side
LABEL_HEIGHT = 16
COLUMNS = 8
MAX_IMAGES = 48
HISTOGRAM_BLOCK = 1 << 20  # values per block: a histogram's memory does not grow with the file


def preview_rows(num_samples: int, limit: int = MAX_IMAGES) -> np.ndarray:
    """Rows shown: all of a small file, else evenly spread over the whole file."""
    if num_samples <= limit:
        return np.arange(num_samples)
    return np.unique(np.linspace(0, num_samples - 1, limit).round().astype(np.int64))


def _open(beton_path: str, spec: DatasetSpec) -> BetonFile:
    return BetonFile(beton_path, custom_handlers=custom_handlers(spec))


def _with_role(spec: DatasetSpec, role: str) -> list[FieldSpec]:
    """The fields whose kind plays ``role`` in the preview (``FieldKind.preview_roles``)."""
    return [f for f in spec.fields if role in field_kind(f).preview_roles]


def has_images(spec: DatasetSpec) -> bool:
    """Whether the dataset's preview is a contact sheet (else a numeric plot)."""
    return bool(_with_role(spec, "image"))


def preview(beton_path: str, spec: DatasetSpec, out_png: str) -> None:
    """The dataset's preview picture: a contact sheet of its images, or a plot of its numbers."""
    if has_images(spec):
        contact_sheet(beton_path, spec, out_png)
    else:
        numeric_plot(beton_path, spec, out_png)


def contact_sheet(beton_path: str, spec: DatasetSpec, out_png: str) -> list[int]:
    """A grid of images decoded from the .beton, each captioned with its sample's int fields."""
    from PIL import Image, ImageDraw

    beton = _open(beton_path, spec)
    image_field = next(f for f in _with_role(spec, "image"))
    label_fields = [f.name for f in _with_role(spec, "caption")]
    rows = preview_rows(beton.num_samples)
    columns = min(COLUMNS, max(len(rows), 1))
    sheet = Image.new("RGB", (columns * CELL, -(-len(rows) // columns) * (CELL + LABEL_HEIGHT)), "white")
    draw = ImageDraw.Draw(sheet)
    for k, row in enumerate(rows):
        thumb = Image.fromarray(field_kind(image_field).preview_image(beton, image_field, int(row)))
        thumb.thumbnail((CELL, CELL))
        x, y = (k % columns) * CELL, (k // columns) * (CELL + LABEL_HEIGHT)
        sheet.paste(thumb, (x + (CELL - thumb.width) // 2, y + (CELL - thumb.height) // 2))
        caption = f"#{int(row)} " + " ".join(f"{name}={int(beton.metadata[name][row])}" for name in label_fields)
        draw.text((x + 2, y + CELL + 2), caption[:16], fill="black")
    with atomic_path(out_png) as tmp:
        sheet.save(tmp, format="PNG", compress_level=1)  # photos barely compress: 0.13 s -> 0.04 s, 9% larger
    return [int(r) for r in rows]


def numeric_plot(beton_path: str, spec: DatasetSpec, out_png: str) -> None:
    """Label histogram(s) and the value range of each array field, read from the .beton."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    beton = _open(beton_path, spec)
    panels = [f for f in spec.fields if {"histogram", "values"} & set(field_kind(f).preview_roles)]
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(4 * max(len(panels), 1), 3), squeeze=False)
    for ax, field in zip(axes[0], panels):
        kind = field_kind(field)
        if "histogram" in kind.preview_roles:
            counts, edges = block_histogram(
                kind.histogram_values(beton, field), min(50, max(beton.num_samples // 4, 5))
            )
            ax.stairs(counts, edges, fill=True)
            ax.set_title(f"{field.name}: {kind.histogram_title}")
        else:
            rows = preview_rows(beton.num_samples, 2048)
            values = beton.ndarray_column(field.name, rows).reshape(len(rows), -1).astype(np.float64)
            ax.fill_between(rows, values.min(axis=1), values.max(axis=1), alpha=0.3, label="min-max")
            ax.plot(rows, values.mean(axis=1), lw=0.8, label="mean")
            ax.set_title(f"{field.name}: values per sample")
            ax.set_xlabel("sample")
            ax.legend(fontsize=7)
    fig.suptitle(f"{spec.name}: {beton.num_samples} samples (read back from the .beton)")
    fig.tight_layout()
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, dpi=90, format="png")
    plt.close(fig)


def block_histogram(values: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.histogram(values, bins)``, block by block: a label column of 100M rows is read through
    the file's memory map (its pages dropped after each block) and never copied whole, where
    matplotlib's ``hist`` made several float copies of it (~35 bytes a sample)."""
    if len(values) == 0:
        return np.histogram(np.asarray(values), bins)
    low, high = np.inf, -np.inf
    for start in range(0, len(values), HISTOGRAM_BLOCK):
        block = np.asarray(values[start : start + HISTOGRAM_BLOCK])
        low, high = min(low, block.min()), max(high, block.max())
        release_mapped(block)
    edges = np.histogram_bin_edges(np.array([low, high], dtype=values.dtype), bins)  # numpy's edge dtype
    counts = np.zeros(bins, dtype=np.int64)
    for start in range(0, len(values), HISTOGRAM_BLOCK):
        block = np.asarray(values[start : start + HISTOGRAM_BLOCK])
        counts += np.histogram(block, edges)[0]
        release_mapped(block)
    return counts, edges


def report_assets(
    spec: DatasetSpec,
    beton_path: str,
    report_path: str,
    record_path: str,
    benchmarks: list[str],
    out_png: str,
    out_html: str,
    this_job: tuple[str, float] | None = None,
) -> None:
    """What ``snakemake --report`` shows of a verified file: its ``preview`` and its summary page.
    ``this_job``: (stage, its start on ``time.monotonic()``) of the job making them, whose own
    benchmark file Snakemake writes only once it has ended: the timings table's last row, measured here."""
    preview(beton_path, spec, out_png)
    timings = []
    if this_job is not None:
        stage, started = this_job
        timings.append([f"{stage} (this job, up to this page)", round(time.monotonic() - started, 3), _max_rss_mb()])
    summary_html(spec, report_path, record_path, benchmarks, out_html, timings)


def _max_rss_mb() -> float:
    """The largest resident size of this process and of any child it waited for, in MB (as
    Snakemake's benchmark files give it)."""
    peaks = (resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return round(max(peaks) / 1024, 2)  # kilobytes on Linux


def summary_html(
    spec: DatasetSpec,
    report_path: str,
    record_path: str,
    benchmarks: list[str],
    out_html: str,
    more_timings: list[list] = (),
) -> None:
    """One page per dataset: size, fields, checks with outcomes, provenance and build timings (a
    stage whose benchmark file is gone is left out; ``more_timings``: rows after the files')."""
    report = json.loads(Path(report_path).read_text())
    record = json.loads(Path(record_path).read_text())
    esc = html.escape

    def table(header: list[str], rows: list[list]) -> str:
        head = "".join(f"<th>{esc(h)}</th>" for h in header)
        body = "".join("<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in row) + "</tr>" for row in rows)
        return f"<table><tr>{head}</tr>{body}</table>"

    fields = [[f.name, f.type, ", ".join(f"{k}={v}" for k, v in f.options.items())] for f in spec.fields]
    type_ids = {f["name"]: f["type_id"] for f in report["fields"]}
    checks = [["PASS" if c["ok"] else "FAIL", c["name"], c["detail"]] for c in report["checks"]]
    writer, reader = report["provenance"]["writer"] or {}, report["provenance"]["reader"] or {}
    provenance = [[k, writer.get(k), reader.get(k)] for k in sorted(set(writer) | set(reader))]
    timings = []
    for path in benchmarks:
        if not Path(path).is_file():
            continue  # removed since (benchmarks/ is not an output any later job needs)
        lines = Path(path).read_text().splitlines()
        if len(lines) >= 2:
            values = dict(zip(lines[0].split("\t"), lines[-1].split("\t")))
            stage, stem = Path(path).parent.name, Path(path).stem  # write_part/{ds}.{part}.tsv: "write_part 3"
            label = stage if stem == spec.name else f"{stage} {stem.removeprefix(spec.name + '.')}"
            timings.append([label, values.get("s"), values.get("max_rss")])
    timings += list(more_timings)
    status = "verified OK" if report["ok"] else f"FAILED: {report.get('worst')}"
    skipped = report.get("skipped")  # bad_samples: {policy: skip}
    skip_line = (
        f"<p>{skipped['count']} bad sample(s) skipped of {skipped['of']} (at most {skipped['limit']} allowed), "
        f"by field: {esc(json.dumps(skipped['by_field']))}; listed in results/{esc(spec.name)}/skipped.json. "
        + "".join(f"<br>index {s['index']}: {esc(s['message'])}" for s in skipped["samples"][:5])
        + "</p>"
        if skipped
        else ""
    )
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{esc(spec.name)}</title>
<style>body{{font-family:sans-serif}} table{{border-collapse:collapse;margin:0.5em 0}}
td,th{{border:1px solid #ccc;padding:2px 6px;text-align:left;font-size:13px}}</style></head><body>
<h2>{esc(spec.name)}: {esc(status)}</h2>
<p>{report["num_samples"]["found"]} samples, {report["file"]["bytes"]:,} bytes, sha256 {esc(report["file"]["sha256"])},
written by {record.get("num_workers")} worker(s) in {record.get("seconds")} s;
content digest sha256 {esc(str(report.get("content_digest")))}.</p>{skip_line}
<h3>Fields (in file order)</h3>{table(["name", "type", "arguments"], [r + [] for r in fields])}
<p>ffcv type ids: {esc(json.dumps(type_ids))}</p>
<h3>Verification checks</h3>{table(["outcome", "check", "detail"], checks)}
<h3>Provenance (ffcv build)</h3>{table(["", "writer", "reader"], provenance)}
<h3>Build timings</h3>{table(["stage", "seconds", "max RSS (MB)"], timings)}
</body></html>"""
    with atomic_path(out_html) as tmp:
        tmp.write_text(page)
