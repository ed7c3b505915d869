"""`rlvr loops report`: a training loop as one self-contained HTML file.

`write_loop_report(loop, out_dir)` writes `report.html` and the bar chart `scores.png` next to it.
Like the job report (clients/report.py, whose page frame, base CSS and chart helpers it shares) the
page needs no network and runs no script: inline CSS, the chart embedded as a base64 PNG data URI
(the same bytes as the PNG file). The content is the terminal view's (clients/views/loops.py): the
header stats (best score and its gain over round 1, target, rounds run of the max, elapsed time
with its training / benchmarking split, the baseline), the score per round as bars (the BEST
round highlighted, the baseline dashed, the target a line), the rounds with their training job ids,
durations, scores, delta arrows and the BEST badge, then the loop settings and the Training Summary.
"""

from __future__ import annotations

import os
from pathlib import Path

from rlvr.clients.report import (
    BASE_CSS,
    esc,
    figure_png,
    img_tag,
    new_axes,
    page_foot,
    page_head,
    style_axes,
    table_rows,
)
from rlvr.clients.views import loops as V
from rlvr.v1 import scheduler_pb2 as S

REPORT_NAME = "report.html"
CHART_NAME = "scores.png"
BAR_COLOR = "#93c5fd"
BEST_COLOR = "#16a34a"
BASELINE_COLOR = "#475569"
TARGET_COLOR = "#dc2626"
ARROW_COLORS = {"↑": "#16a34a", "↓": "#dc2626", "→": "#64748b"}

CSS = BASE_CSS + """
.badge.TARGET_REACHED { background: #dcfce7; color: #166534; }
.badge.QUEUED, .badge.TRAINING, .badge.BENCHMARKING { background: #dbeafe; color: #1e40af; }
.badge.ROUNDS_SPENT, .badge.PLATEAUED { background: #e0e7ff; color: #3730a3; }
.badge.STOPPED { background: #fef3c7; color: #92400e; }
.badge.BEST { background: #16a34a; color: #fff; }
.tile .more { color: #64748b; font-size: 12px; margin-top: 2px; }
table.rounds { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
table.rounds th { text-align: left; color: #64748b; font-size: 12px; font-weight: 600; text-transform: uppercase;
                  letter-spacing: .04em; padding: 4px 12px 6px 0; border-bottom: 1px solid #e2e8f0; }
table.rounds td { padding: 6px 12px 6px 0; border-bottom: 1px solid #f1f5f9; vertical-align: top; }
table.rounds tr.best td { background: #f0fdf4; }
table.rounds td.num { text-align: right; }
table.rounds .arrow { font-weight: 700; }
table.rounds .state { color: #475569; font-style: italic; }
code { font: 13px ui-monospace, "DejaVu Sans Mono", monospace; }
.settings { display: grid; grid-template-columns: repeat(auto-fit, minmax(320px, 1fr)); gap: 14px; }
.settings h3 { font-size: 13px; margin: 0 0 6px; color: #334155; }
"""


# ---------------------------------------------------------------- the chart


def chart_png(loop: S.Loop) -> bytes:
    """The score per round as bars (percent, 0 to `loops_view.chart_scale`): the BEST round in
    green with its badge, each scored bar labelled with its score, an unscored round's state in
    place of its bar, the baseline as a dashed line and the target as a solid line."""
    from matplotlib.ticker import FuncFormatter

    scale = V.chart_scale(loop)
    fig, ax = new_axes(figsize=(7.2, 3.4))
    labels = [f"R{r.index}" for r in loop.rounds]
    xs = list(range(len(loop.rounds)))
    for x, r in zip(xs, loop.rounds, strict=True):
        if r.HasField("score"):
            color = BEST_COLOR if r.best else BAR_COLOR
            ax.bar([x], [r.score], width=0.62, color=color, edgecolor="#15803d" if r.best else "#60a5fa",
                   linewidth=1.2 if r.best else 0.8, zorder=3)
            text = f"{r.score:.1f}%" + ("\nBEST" if r.best else "")
            ax.annotate(text, (x, r.score), xytext=(0, 3), textcoords="offset points", ha="center", va="bottom",
                        fontsize=8, fontweight="bold" if r.best else "normal",
                        color="#166534" if r.best else "#334155", zorder=4)
        else:
            ax.annotate(V.round_state(r), (x, 0), xytext=(0, 4), textcoords="offset points", ha="center",
                        va="bottom", rotation=90, fontsize=8, color="#64748b", style="italic", zorder=4,
                        bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.5})
    if loop.HasField("baseline_score"):
        ax.axhline(loop.baseline_score, color=BASELINE_COLOR, linestyle=(0, (5, 3)), linewidth=1.4, zorder=2,
                   label=f"baseline {V.pct(loop.baseline_score)}")
    if loop.spec.target > 0:
        ax.axhline(loop.spec.target, color=TARGET_COLOR, linestyle="-", linewidth=1.6, zorder=2,
                   label=f"target {V.target_text(loop.spec.target)}")
    style_axes(ax, "Benchmark score per round", "round")
    ax.grid(False, axis="x")
    ax.set_xticks(xs, labels)
    ax.set_xlim(-0.6, max(len(xs), 1) - 0.4)
    ax.set_ylim(0, scale * 1.1)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}%"))
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, fontsize=8, frameon=False,
                  borderaxespad=0.2, handlelength=2.2)
    return figure_png(fig)


# ---------------------------------------------------------------- HTML parts


def _tile(label: str, value: str, more: str = "") -> str:
    extra = f'<div class="more">{esc(more)}</div>' if more else ""
    return f'<div class="card tile"><div class="label">{esc(label)}</div><div class="value">{esc(value)}</div>{extra}</div>'


def _tiles(loop: S.Loop) -> str:
    return "".join(_tile(label, value, more) for label, value, more in V.header_tiles(loop))


def _rounds_table(loop: S.Loop) -> str:
    if not loop.rounds:
        return '<p class="message">No round started yet.</p>'
    rows = ["<table class=\"rounds\"><thead><tr><th>Round</th><th>Training job</th><th>Trained on</th>"
            "<th>Duration</th><th>Score</th><th>Δ</th><th></th><th>Notes</th></tr></thead><tbody>"]
    for r in loop.rounds:
        job = (f'<code title="rlvr jobs show {esc(r.job_id)}">{esc(r.job_id)}</code>' if r.job_id else "-")
        on = f"R{r.base_round}" if r.base_round else "base model"
        if r.HasField("score"):
            score = esc(V.pct(r.score))
            delta = ""
            if r.HasField("delta"):
                arrow = V.delta_arrow(r.delta)
                delta = (f'<span class="arrow" style="color:{ARROW_COLORS[arrow]}">{arrow}</span> '
                         f"{esc(f'{r.delta:+.1f}')}")
            notes = ("real gain" if r.real_gain else
                     f"no real gain (needs &gt; {r.gain_threshold:.1f} pts)" if r.gain_threshold > 0 else
                     "no real gain")
        else:
            score, delta, notes = f'<span class="state">{esc(V.round_state(r))}</span>', "", ""
        if r.error:
            notes = f'<span class="error">error: {esc(r.error)}</span>'
        badge = f'<span class="badge BEST">{V.BEST}</span>' if r.best else ""
        rows.append(f'<tr class="{"best" if r.best else ""}" id="round-{r.index}"><td><b>R{r.index}</b></td>'
                    f"<td>{job}</td><td>{esc(on)}</td><td class=\"num\">{esc(V.duration(r.duration_seconds))}</td>"
                    f'<td class="num">{score}</td><td>{delta}</td><td>{badge}</td><td>{notes}</td></tr>')
    rows.append("</tbody></table>")
    return "".join(rows)


def _settings(loop: S.Loop) -> str:
    from rlvr.clients.views.jobs import summary_rows

    parts = ['<div class="settings"><div class="card"><h3>Loop settings</h3><table class="summary">',
             table_rows([("Name", loop.spec.name or "-"), *V.settings_rows(loop.spec)])]
    for label, ts in (("Created", loop.created_at), ("Started", loop.started_at), ("Finished", loop.finished_at)):
        if ts.seconds:
            parts.append(table_rows([(label, ts.ToDatetime().strftime("%Y-%m-%d %H:%M:%S UTC"))]))
    parts.append("</table></div>")
    if loop.HasField("summary"):
        parts += ['<div class="card"><h3>Training Summary (each round)</h3><table class="summary">',
                  table_rows([(k, str(v)) for k, v in summary_rows(loop.summary) if str(v)]), "</table></div>"]
    parts.append("</div>")
    parts += [f'<p class="warning">warning: {esc(w)}</p>' for w in loop.warnings]
    return "".join(parts)


def render_html(loop: S.Loop, chart: bytes | None) -> str:
    """The page; `chart` is the PNG to embed (None: nothing scored yet)."""
    name = loop.spec.name or f"loop {loop.id}"
    status = V.status_word(loop.status)
    spec = loop.spec
    sub = [f"loop {loop.id}", f"{spec.benchmark or '-'} ({spec.score_column or 'default column'})"]
    if loop.summary.model or spec.job.base_model:
        sub.append(loop.summary.model or spec.job.base_model)
    parts = [
        *page_head(f"Training Loop — {name}", CSS),
        f'<h1>Training Loop — {esc(name)} <span class="badge {esc(V.status_key(loop.status))}">'
        f"{esc(status)}</span></h1>",
        f'<p class="sub">{" · ".join(esc(s) for s in sub)}</p>',
    ]
    if loop.message:
        parts.append(f'<p class="message">{esc(loop.message)}</p>')
    if loop.error:
        parts.append(f'<p class="error">error: {esc(loop.error)}</p>')
    parts += [f'<div class="tiles">{_tiles(loop)}</div>', "<h2>Score per round</h2>"]
    if chart is not None:
        caption = V.chart_caption(loop)
        parts.append(f'<figure class="card">{img_tag("scores", "Benchmark score per round", chart)}'
                     f"<figcaption>{esc(caption)}</figcaption></figure>")
    else:
        parts.append('<div class="card message">Nothing scored yet.</div>')
    parts += ["<h2>Rounds</h2>", f'<div class="card">{_rounds_table(loop)}</div>', "<h2>Settings</h2>",
              _settings(loop)]
    parts += page_foot("Scores are percents on the benchmark's score column; Δ is against the previous scored "
                       "round, in points. A real gain beats the best score before it (the baseline included) by "
                       "more than the min gain, or, unset, one standard error of the gain (paired question by question).")
    return "\n".join(parts)


def has_chart(loop: S.Loop) -> bool:
    return loop.HasField("baseline_score") or any(r.HasField("score") for r in loop.rounds)


def write_loop_report(loop: S.Loop, out_dir: str | os.PathLike[str]) -> Path:
    """Writes `report.html` and `scores.png` (once anything is scored) into `out_dir` (created if
    needed); returns the HTML file's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    chart = None
    if has_chart(loop):
        chart = chart_png(loop)
        (out / CHART_NAME).write_bytes(chart)
    path = out / REPORT_NAME
    path.write_text(render_html(loop, chart), encoding="utf-8")
    return path
