"""`rlvr jobs report`: the RL Metrics card as one self-contained HTML file.

`write_report(metrics, job, out_dir)` writes `report.html` plus one PNG per chart next to it. The
page needs no network and runs no script: the CSS is inline and every chart is embedded as a
base64 PNG data URI (the same bytes as the PNG file beside it), so the file can be mailed or opened
offline. The content is the terminal view's (clients/views/jobs.py): the Accuracy and Reward trends,
the stat tiles, the charts of the series, and, when a Job is given, its name, status and the
Training Summary. Charts are drawn with matplotlib's Agg canvas (no display, no pyplot state).

The page frame, the base CSS and the chart helpers (`BASE_CSS`, `esc`, `new_axes`, `style_axes`,
`figure_png`, `img_tag`, `page_head`, `page_foot`, `table_rows`) are shared with the training loop
report, clients/loop_report.py.
"""

from __future__ import annotations

import base64
import html
import io
import os
from datetime import UTC, datetime
from pathlib import Path

from rlvr.clients.views.jobs import (
    COMPONENTS_CHART,
    DIRECTION_WORDS,
    Chart,
    Series,
    card_title,
    card_trends,
    chart_caption,
    charts_of,
    head_regression,
    no_reward,
    num,
    status_name,
    tile_values,
)
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import scheduler_pb2 as S

REPORT_NAME = "report.html"
COLORS = {"reward": "#2563eb", "accuracy": "#16a34a", "loss": "#dc2626", "kl": "#9333ea",
          "entropy": "#ea580c", "completion_length": "#0891b2", "turns": "#4f46e5", "tool_calls": "#ca8a04",
          "heldout_accuracy": "#db2777"}
ARROWS = {S.TREND_DIRECTION_RISING: "↑", S.TREND_DIRECTION_FALLING: "↓", S.TREND_DIRECTION_FLAT: "→"}
TREND_COLORS = {S.TREND_DIRECTION_RISING: "#16a34a", S.TREND_DIRECTION_FALLING: "#dc2626",
                S.TREND_DIRECTION_FLAT: "#64748b"}

# Shared by every rlvr report (this one and the loop report, clients/loop_report.py).
BASE_CSS = """
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { margin: 0; padding: 24px 32px 40px; background: #f1f5f9; color: #0f172a;
       font: 14px/1.45 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif; }
main { max-width: 1100px; margin: 0 auto; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 15px; margin: 28px 0 10px; color: #334155; text-transform: uppercase; letter-spacing: .04em; }
.sub { color: #475569; margin: 0 0 4px; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 999px; font-size: 12px; font-weight: 600;
         background: #e2e8f0; color: #334155; vertical-align: middle; }
.badge.COMPLETED { background: #dcfce7; color: #166534; }
.badge.RUNNING, .badge.QUEUED { background: #dbeafe; color: #1e40af; }
.badge.FAILED { background: #fee2e2; color: #991b1b; }
.badge.CANCELLED { background: #fef3c7; color: #92400e; }
.card { background: #fff; border: 1px solid #e2e8f0; border-radius: 10px; padding: 14px 16px; }
.tiles { display: grid; grid-template-columns: repeat(auto-fit, minmax(160px, 1fr)); gap: 14px; }
.tile .label { color: #64748b; font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.tile .value { font-size: 24px; font-weight: 650; font-variant-numeric: tabular-nums; margin-top: 2px; }
figure { margin: 0; }
figure img { display: block; width: 100%; height: auto; }
figcaption { color: #475569; font-size: 13px; margin-top: 4px; }
table.summary { border-collapse: collapse; }
table.summary td { padding: 3px 18px 3px 0; vertical-align: top; }
table.summary td:first-child { color: #64748b; white-space: nowrap; }
.message { color: #334155; }
.error { color: #991b1b; }
.warning { color: #92400e; }
footer { color: #94a3b8; font-size: 12px; margin-top: 28px; }
"""

CSS = BASE_CSS + """
.trends { display: grid; grid-template-columns: repeat(auto-fit, minmax(300px, 1fr)); gap: 14px; }
.trend .name { font-weight: 600; color: #334155; }
.trend .main { display: flex; align-items: baseline; gap: 10px; margin: 6px 0 4px; }
.trend .arrow { font-size: 30px; font-weight: 700; line-height: 1; }
.trend .values { font-size: 20px; font-variant-numeric: tabular-nums; }
.trend .delta { font-weight: 600; }
.trend .meta { color: #64748b; font-size: 13px; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(420px, 1fr)); gap: 14px; }
"""


def esc(value: object) -> str:
    """HTML-escaped text (quotes too: safe inside attributes)."""
    return html.escape(str(value), quote=True)


# ---------------------------------------------------------------- helpers shared with loop_report


def new_axes(figsize: tuple[float, float] = (6.4, 3.0), dpi: int = 110):  # noqa: ANN201 (matplotlib)
    """A matplotlib Figure on the Agg canvas (no display, no pyplot state) and its one Axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, dpi=dpi)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def style_axes(ax, title: str, xlabel: str) -> None:  # noqa: ANN001 (matplotlib Axes)
    """The reports' chart look: a bold left title, light grid, no top/right spines."""
    ax.set_title(title, loc="left", fontsize=11, fontweight="bold", color="#0f172a")
    ax.set_xlabel(xlabel, fontsize=9, color="#475569")
    ax.tick_params(labelsize=8, colors="#475569")
    ax.grid(True, color="#e2e8f0", linewidth=0.8)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    for side in ("left", "bottom"):
        ax.spines[side].set_color("#cbd5e1")


def figure_png(fig) -> bytes:  # noqa: ANN001 (matplotlib Figure)
    """The figure as PNG bytes (tight layout, white background, no timestamp metadata)."""
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", facecolor="white", metadata={"Software": None})
    return buffer.getvalue()


def img_tag(key: str, alt: str, png: bytes) -> str:
    """An <img id="chart-KEY"> with the PNG inline as a base64 data URI."""
    data = base64.b64encode(png).decode("ascii")
    return f'<img class="chart" id="chart-{esc(key)}" alt="{esc(alt)}" src="data:image/png;base64,{data}">'


def page_head(title: str, css: str) -> list[str]:
    """The opening of a self-contained page: inline CSS, no script, no external resource."""
    return ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{esc(title)}</title><style>{css}</style></head><body><main>"]


def page_foot(note: str = "") -> list[str]:
    """The footer (generation time, then `note`, already HTML) and the page's closing tags."""
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return [f"<footer>Generated by rlvr on {now}.{' ' + note if note else ''}</footer>", "</main></body></html>"]


def table_rows(rows: list[tuple[str, str]]) -> str:
    """label/value rows for a <table class="summary">."""
    return "".join(f"<tr><td>{esc(k)}</td><td>{esc(v)}</td></tr>" for k, v in rows)


# ---------------------------------------------------------------- charts


SHARED_AXIS = frozenset({"reward_accuracy", COMPONENTS_CHART})
# The lines of a chart of more series than COLORS names (the reward components).
PALETTE = ("#2563eb", "#16a34a", "#dc2626", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777")
"""The pairs drawn on one y axis (reward and accuracy share the 0-1 scale); any other pair gets a
second axis on the right for its second series (KL is ~100x smaller than entropy)."""


def chart_png(chart: Chart | Series, trends: dict[str, S.Trend] | None = None) -> bytes:
    """A chart as a PNG: each series a line, a pair with one legend (on two y axes unless the pair
    is in SHARED_AXIS). With a series' trend (`trends`, by series key) the early and late windows
    are shaded and the series' peak marked."""
    from matplotlib.ticker import MaxNLocator

    if isinstance(chart, Series):
        chart = Chart(chart.key, chart.title, (chart,))
    trends = trends or {}
    fig, ax = new_axes()
    pair = len(chart.series) > 1
    second = ax.twinx() if pair and chart.key not in SHARED_AXIS else ax
    lines, windows, peaks = [], [], []
    axes = [ax, second] if second is not ax else [ax] * len(chart.series)
    for i, (series, axis) in enumerate(zip(chart.series, axes, strict=False)):
        color = COLORS.get(series.key, PALETTE[i % len(PALETTE)])
        n = len(series.values)
        line, = axis.plot(series.steps, series.values, color=color, linewidth=1.8,
                          marker="o" if n <= 40 else None, markersize=7 if n == 1 else 3.5, label=series.name)
        lines.append(line)
        trend = trends.get(series.key)
        if trend is None or trend.window <= 0 or not n:
            continue
        if not windows:  # the windows are the steps' (the same for every series): shaded once
            w = trend.window
            early_end, late_start = series.steps[min(w, n) - 1], series.steps[max(n - w, 0)]
            windows.append(ax.axvspan(series.steps[0] - 0.5, early_end + 0.5, color="#94a3b8", alpha=0.18,
                                      linewidth=0, label="early window"))
            windows.append(ax.axvspan(late_start - 0.5, series.steps[-1] + 0.5, color=color, alpha=0.12,
                                      linewidth=0, label="late window"))
        if series.steps[0] <= trend.peak_step <= series.steps[-1]:
            star, = axis.plot([trend.peak_step], [trend.peak], marker="*", markersize=11, color="#f59e0b",
                              markeredgecolor="#92400e", linestyle="none", zorder=5, label=f"peak {num(trend.peak)}")
            peaks.append(star)
            line.set_label(f"{series.name}, peak {num(trend.peak)}")
    handles = [*lines, *windows] if pair else [*windows, *peaks]  # a pair's lines name their peaks
    if handles:
        ax.legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0),
                  ncol=2 if len(handles) == 4 else min(4, len(handles)), fontsize=8, frameon=False,
                  borderaxespad=0.2, handlelength=1.4, columnspacing=1.0)
    style_axes(ax, chart.title, "step")
    if second is not ax:  # each y axis in its series' colour
        for axis, series in ((ax, chart.series[0]), (second, chart.series[1])):
            axis.tick_params(axis="y", labelsize=8, colors=COLORS.get(series.key, "#475569"))
        second.spines["top"].set_visible(False)
        second.spines["right"].set_color("#cbd5e1")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=8))
    first, last = chart.steps
    pad = 1.0 if first == last else 0.5
    ax.set_xlim(first - pad, last + pad)
    return figure_png(fig)


# ---------------------------------------------------------------- HTML parts


def _trend_card(label: str, trend: S.Trend) -> str:
    color = TREND_COLORS.get(trend.direction, "#64748b")
    arrow = ARROWS.get(trend.direction, "?")
    word = DIRECTION_WORDS.get(trend.direction, "unknown")
    window = f"{trend.window} step{'s' if trend.window != 1 else ''}"
    return (
        f'<div class="card trend"><div class="name">{esc(label)}</div>'
        f'<div class="main"><span class="arrow" style="color:{color}" title="{word}">{arrow}</span>'
        f'<span class="values">{esc(num(trend.early))} → {esc(num(trend.late))}</span>'
        f'<span class="delta" style="color:{color}">{trend.delta:+.3f}</span></div>'
        f'<div class="meta">{esc(word)} · peak {esc(num(trend.peak))} at step {trend.peak_step}'
        f" · early vs late window of {esc(window)}</div></div>"
    )


def _summary_rows(job: C.Job) -> list[tuple[str, str]]:
    from rlvr.clients.views.jobs import summary_rows

    rows = [("Job", job.id), ("Name", job.spec.name or "-"), ("Base model", job.spec.base_model or "-")]
    if job.HasField("summary"):
        rows += [(k, str(v)) for k, v in summary_rows(job.summary) if str(v)]
    for label, ts in (("Created", job.created_at), ("Started", job.started_at), ("Finished", job.finished_at)):
        if ts.seconds:
            rows.append((label, ts.ToDatetime().strftime("%Y-%m-%d %H:%M:%S UTC")))
    if job.adapter.name:
        rows.append(("Adapter", f"{job.adapter.name} v{job.adapter.version}"))
    return rows


def render_html(metrics: S.JobMetrics, job: C.Job | None, charts: list[tuple[Chart, bytes]]) -> str:
    """The page; `charts` are the PNGs to embed, in order."""
    status = status_name(metrics.status if metrics.status else (job.status if job else 0))
    name = job.spec.name if job is not None and job.spec.name else f"job {metrics.job_id}"
    progress = f" · step {job.current_step}/{job.total_steps}" if job is not None and job.total_steps else ""
    parts = [
        *page_head(f"{card_title(metrics)} — {name}", CSS),
        f'<h1>{card_title(metrics)} — {esc(name)} <span class="badge {esc(status)}">{esc(status.lower())}</span></h1>',
        f'<p class="sub">job {esc(metrics.job_id)}{esc(progress)}</p>',
    ]
    if job is not None and job.error:
        parts.append(f'<p class="error">error: {esc(job.error)}</p>')
    if not metrics.has_steps:
        parts.append(f'<div class="card message">{esc(metrics.message or "no training step recorded yet")}</div>')
    else:
        parts.append('<h2>Trends</h2><div class="trends">')
        parts += [_trend_card(label, trend) for label, trend in card_trends(metrics)]
        parts.append('</div><h2>Stats</h2><div class="tiles">')
        tiles = tile_values(metrics.tiles, no_reward(metrics), head_regression(metrics))
        parts += [f'<div class="card tile"><div class="label">{esc(label)}</div>'
                  f'<div class="value">{esc(value)}</div></div>' for label, value in tiles]
        parts.append("</div>")
        if metrics.message:
            parts.append(f'<p class="message">{esc(metrics.message)}</p>')
        if charts:
            parts.append('<h2>Charts</h2><div class="charts">')
            for chart, png in charts:
                parts.append(f'<figure class="card">{img_tag(chart.key, f"{chart.title} by step", png)}'
                             f"<figcaption>{esc(chart_caption(chart))}</figcaption></figure>")
            parts.append("</div>")
    if job is not None:
        parts.append('<h2>Training Summary</h2><div class="card"><table class="summary">')
        parts.append(table_rows(_summary_rows(job)))
        parts.append("</table>")
        parts += [f'<p class="warning">warning: {esc(w)}</p>' for w in job.warnings]
        parts.append("</div>")
    parts += page_foot("Trend windows: with n steps, w = max(1, ⌊n/4⌋); early = the first w steps, late = the "
                       "last w; flat when |late − early| &lt; 0.01.")
    return "\n".join(parts)


def trends_of(metrics: S.JobMetrics) -> dict[str, S.Trend]:
    """The trends the charts mark, by series key."""
    return {"reward": metrics.reward_trend, "accuracy": metrics.accuracy_trend}


def write_report(metrics: S.JobMetrics, job: C.Job | None, out_dir: str | os.PathLike[str]) -> Path:
    """Writes `report.html` and the chart PNGs (`reward_accuracy.png`, `loss.png`, ...: one per
    chart of `jobs_view.CHARTS`) into `out_dir` (created if needed); returns the HTML file's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    charts: list[tuple[Chart, bytes]] = []
    if metrics.has_steps:
        for chart in charts_of(metrics):
            png = chart_png(chart, trends_of(metrics))
            (out / f"{chart.key}.png").write_bytes(png)
            charts.append((chart, png))
    path = out / REPORT_NAME
    path.write_text(render_html(metrics, job, charts), encoding="utf-8")
    return path
