"""A training loop in a terminal: the header stats, a bar chart of the score per round and the
round-by-round list, as pure functions of a `Loop` message (no I/O, no gRPC); the dry run's loop
settings beside the Training Summary; and the rows `rlvr loops export` writes.

`render(loop)` is the whole view of `rlvr loops show`; it fits `width` columns (80 by default) and
draws with Unicode (block bars, arrows) or, with `unicode=False`, plain ASCII for a terminal or pipe
that is not UTF-8 (`jobs_view.supports_unicode(stream)` decides for a stream). Every figure comes
from the message as the scheduler computed it (scheduler.proto's loops section): scores, deltas,
the BEST round and the real gains are shown, never recomputed here.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence

from google.protobuf.timestamp_pb2 import Timestamp

from rlvr.clients.views.jobs import wrap
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import scheduler_pb2 as S

# The spec's words for a loop's overall status ("Reading loop results").
STATUS_WORDS = {
    S.LOOP_STATUS_QUEUED: "Queued",
    S.LOOP_STATUS_TRAINING: "Training",
    S.LOOP_STATUS_BENCHMARKING: "Benchmarking",
    S.LOOP_STATUS_TARGET_REACHED: "Target reached",
    S.LOOP_STATUS_ROUNDS_SPENT: "Rounds spent",
    S.LOOP_STATUS_PLATEAUED: "Plateaued",
    S.LOOP_STATUS_FAILED: "Failed",
    S.LOOP_STATUS_STOPPED: "Stopped",
}
FINAL_STATUSES = frozenset({S.LOOP_STATUS_TARGET_REACHED, S.LOOP_STATUS_ROUNDS_SPENT, S.LOOP_STATUS_PLATEAUED,
                            S.LOOP_STATUS_FAILED, S.LOOP_STATUS_STOPPED})
ROUND_WORDS = {S.ROUND_STATUS_TRAINING: "training", S.ROUND_STATUS_BENCHMARKING: "benchmarking",
               S.ROUND_STATUS_SCORED: "scored", S.ROUND_STATUS_FAILED: "failed",
               S.ROUND_STATUS_STOPPED: "stopped"}

ARROWS = {True: ("↑", "↓", "→"), False: ("^", "v", "->")}
# chart cells: (best round's bar, another round's bar, the baseline's bar, the target marker)
BARS = {True: ("█", "▒", "░", "┆"), False: ("#", "=", ".", "|")}
BEST = "BEST"


def is_final(status: int) -> bool:
    return status in FINAL_STATUSES


def status_word(status: int) -> str:
    """Queued, Training, ..., Target reached, Rounds spent, Plateaued, Failed, Stopped."""
    return STATUS_WORDS.get(status, "Unknown")


def status_key(status: int) -> str:
    """The enum name without its prefix ("TARGET_REACHED"): CSS classes, `--status` values."""
    try:
        return S.LoopStatus.Name(status).removeprefix("LOOP_STATUS_")
    except ValueError:
        return str(status)


def pct(value: float) -> str:
    """A percent as the leaderboard shows it: 36.2%."""
    return f"{value:.1f}%"


def target_text(target: float) -> str:
    """The target as typed: 35%, 35.5%."""
    return f"{target:g}%"


def pts(value: float) -> str:
    """A signed difference in points: +12.0 pts."""
    return f"{value:+.1f} pts"


def duration(seconds: float) -> str:
    """45s, 8m 05s, 37m, 4h 23m, 2d 03h."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600:02d}h"


def delta_arrow(delta: float, *, unicode: bool = True) -> str:
    """↑ / ↓ / → (ASCII ^ v ->) for a delta in points; → when it shows as +0.0."""
    up, down, flat = ARROWS[unicode]
    shown = round(delta, 1)
    return up if shown > 0 else down if shown < 0 else flat


def round_delta(r: S.Round, *, unicode: bool = True) -> str:
    """`↑ +3.2` against the previous scored round; "" for a round without a delta."""
    if not r.HasField("delta"):
        return ""
    return f"{delta_arrow(r.delta, unicode=unicode)} {r.delta:+.1f}"


def round_state(r: S.Round) -> str:
    """An unscored round's status: "training step 30/100" (its job queued or running),
    "benchmarking", "failed at step 12/100", "stopped at step 12/100"."""
    steps = f"step {r.current_step}/{r.total_steps}" if r.total_steps else ""
    if r.status == S.ROUND_STATUS_TRAINING:
        return f"training {steps}".strip()
    if r.status in (S.ROUND_STATUS_STOPPED, S.ROUND_STATUS_FAILED) and r.current_step and steps:
        return f"{ROUND_WORDS[r.status]} at {steps}"
    return ROUND_WORDS.get(r.status, "unknown")


def best_round(loop: S.Loop) -> S.Round | None:
    for r in loop.rounds:
        if r.best:
            return r
    return None


def header_tiles(loop: S.Loop, dash: str = "-") -> list[tuple[str, str, str]]:
    """The loop page's header stats as (label, value, detail): best score with its round and gain
    over round 1, target, rounds run of the max, elapsed (with the training / benchmarking split),
    baseline. What the HTML report and the web console draw as tiles."""
    spec = loop.spec
    if loop.HasField("best_score"):
        best = pct(loop.best_score)
        more = f"R{loop.best_round}" if loop.best_round else ""
        if loop.HasField("gain_over_first") and loop.best_round not in (0, 1):
            more += f", {pts(loop.gain_over_first)} over R1"
    else:
        best, more = dash, "no round scored yet"
    elapsed = duration(loop.elapsed_seconds) if loop.elapsed_seconds else dash
    split = (f"training {duration(loop.training_seconds)} · benchmarking {duration(loop.benchmarking_seconds)}"
             if loop.training_seconds or loop.benchmarking_seconds else "")
    if loop.elapsed_seconds and not is_final(loop.status):
        split = ("so far · " + split) if split else "so far"
    scored = sum(r.HasField("score") for r in loop.rounds)
    rounds = f"{len(loop.rounds)} of {spec.max_rounds}" if spec.max_rounds else str(len(loop.rounds))
    baseline = pct(loop.baseline_score) if loop.HasField("baseline_score") else dash
    return [("Best score", best, more),
            ("Target", target_text(spec.target) if spec.target else dash, spec.score_column),
            ("Rounds", rounds, f"{scored} scored"),
            ("Elapsed", elapsed, split),
            ("Baseline", baseline, "the base model")]


def chart_caption(loop: S.Loop) -> str:
    """What the bar chart of the scores per round shows, in words (its caption and alt text)."""
    scored = [r for r in loop.rounds if r.HasField("score")]
    caption = f"{len(scored)} scored round{'s' if len(scored) != 1 else ''}"
    best = best_round(loop)
    if best is not None and best.HasField("score"):
        caption += f"; BEST R{best.index} at {pct(best.score)}"
    if loop.HasField("baseline_score"):
        caption += f"; baseline (dashed line) {pct(loop.baseline_score)}"
    if loop.spec.target:
        caption += f"; target (solid line) {target_text(loop.spec.target)}"
    return caption


def side_by_side(left: Sequence[str], right: Sequence[str], width: int = 80, gap: int = 2) -> list[str]:
    """Two blocks of lines next to each other when they fit in `width`, else one under the other
    (with a blank line between)."""
    left_w = max((len(line) for line in left), default=0)
    right_w = max((len(line) for line in right), default=0)
    if not left or not right or left_w + gap + right_w > width:
        return [*left, *([""] if left and right else []), *right]
    rows = max(len(left), len(right))
    padded = [*left, *[""] * (rows - len(left))]
    other = [*right, *[""] * (rows - len(right))]
    return [(a.ljust(left_w + gap) + b).rstrip() for a, b in zip(padded, other, strict=True)]


def _label_lines(title: str, rows: Sequence[tuple[str, object]]) -> list[str]:
    label_w = max((len(k) for k, _ in rows), default=0)
    return [title] + [f"  {k:<{label_w}} {v}" for k, v in rows]


# ---------------------------------------------------------------- settings (the dry run)


def settings_rows(spec: S.LoopSpec) -> list[tuple[str, str]]:
    """The loop's own settings (the "Start an automated loop" form, less the name) as label/value
    rows; a field left unset in an unresolved spec shows as the server's default."""
    rows = [("Benchmark", spec.benchmark or "-"),
            ("Score Column", spec.score_column or "benchmark's default"),
            ("Target", target_text(spec.target) if spec.target else "-"),
            ("Max Rounds", str(spec.max_rounds) if spec.HasField("max_rounds") else "default (8)"),
            ("Give Up After", (f"{spec.give_up_after} round{'s' if spec.give_up_after != 1 else ''}"
                               if spec.HasField("give_up_after") else "default (2 rounds)")),
            ("Min Gain", f"{spec.min_gain:g} pts" if spec.HasField("min_gain") else "1 standard error"),
            ("Reclaim", "no" if spec.HasField("reclaim_storage") and not spec.reclaim_storage
             else "yes, between rounds"),
            ("Questions", str(spec.benchmark_limit) if spec.benchmark_limit else "all")]
    if spec.benchmark_dataset:
        split = f" ({spec.benchmark_dataset_split})" if spec.benchmark_dataset_split else ""
        rows.append(("Dataset", spec.benchmark_dataset + split))
    return rows


def settings_lines(spec: S.LoopSpec, summary: C.TrainingSummary, *, width: int = 80) -> list[str]:
    """The Training Summary every round trains with beside the Loop Settings (one under the other
    when the two do not fit in `width`)."""
    from rlvr.clients.views.jobs import summary_rows

    left = _label_lines("Training Summary (each round)", summary_rows(summary))
    right = _label_lines("Loop Settings", settings_rows(spec))
    return side_by_side(left, right, width, gap=2)


def plan_lines(spec: S.LoopSpec, summary: C.TrainingSummary, warnings: Sequence[str] = (), *,
               width: int = 80) -> list[str]:
    """What `rlvr loops start` (and its --dry-run) prints first: the loop's name, the settings
    beside the Training Summary, then the warnings."""
    lines = [f"Loop {spec.name!r}" if spec.name else "Loop", ""]
    lines += settings_lines(spec, summary, width=width)
    lines += [""] if warnings else []
    for w in warnings:
        lines += wrap(f"warning: {w}", width, hang="  ")
    return lines


# ---------------------------------------------------------------- the header


def header_lines(loop: S.Loop, *, width: int = 80, unicode: bool = True) -> list[str]:
    """Name, id and status; what it is doing (or why it stopped); the error; then the stats: best
    score and its gain over round 1, target, rounds run of the max, baseline, elapsed time with the
    training / benchmarking split, and the benchmark."""
    dot = "·" if unicode else "-"
    title = f"{loop.spec.name or 'loop'} {dot} loop {loop.id}"
    status = status_word(loop.status)
    lines = ([title + " " * (width - len(title) - len(status)) + status]
             if len(title) + 2 + len(status) <= width else wrap(title, width) + [status])
    if loop.message:
        lines += wrap(loop.message, width)
    if loop.error:
        lines += wrap(f"error: {loop.error}", width, hang="  ")
    lines.append("")

    best = best_round(loop)
    if loop.HasField("best_score"):
        where = f" in R{loop.best_round}" if loop.best_round else ""
        gain = (f", {pts(loop.gain_over_first)} over R1"
                if loop.HasField("gain_over_first") and loop.best_round not in (0, 1) else "")
        best_text = pct(loop.best_score) + where + gain
    elif best is not None and best.HasField("score"):
        best_text = f"{pct(best.score)} in R{best.index}"
    else:
        best_text = "no round scored yet"
    spec = loop.spec
    rounds = f"{len(loop.rounds)} of {spec.max_rounds}" if spec.max_rounds else str(len(loop.rounds))
    baseline = pct(loop.baseline_score) + " (base model)" if loop.HasField("baseline_score") else (
        "benchmarking" if loop.status == S.LOOP_STATUS_BENCHMARKING and not loop.rounds else "-")
    left = [("Best score", best_text), ("Rounds", rounds)]
    right = [("Target", target_text(spec.target) if spec.target else "-"), ("Baseline", baseline)]
    label_w = max(len(k) for k, _ in left + right)
    lines += side_by_side([f"  {k:<{label_w}}  {v}" for k, v in left],
                          [f"{k:<{label_w}}  {v}" for k, v in right], width, gap=4)

    elapsed = duration(loop.elapsed_seconds) if loop.elapsed_seconds else "-"
    if loop.elapsed_seconds and not is_final(loop.status):
        elapsed += " so far"
    if loop.training_seconds or loop.benchmarking_seconds:
        split = [f"training {duration(loop.training_seconds)}",
                 f"benchmarking {duration(loop.benchmarking_seconds)}"]
        other = loop.elapsed_seconds - loop.training_seconds - loop.benchmarking_seconds
        if other >= 1:
            split.append(f"other {duration(other)}")
        elapsed += ": " + ", ".join(split)
    column = spec.score_column or "default column"
    questions = f"{spec.benchmark_limit} questions" if spec.benchmark_limit else "all questions"
    bench = f"{spec.benchmark or '-'}, {column}, {questions}"
    rows = [("Elapsed", elapsed), ("Benchmark", bench)]
    reclaimed = sum(r.reclaimed_bytes for r in loop.rounds)
    if reclaimed:
        from rlvr.clients.views.jobs import human_size

        rows.append(("Reclaimed", f"{human_size(reclaimed)} of storage between rounds"))
    for k, v in rows:
        wrapped = wrap(v, max(20, width - label_w - 4))
        lines.append(f"  {k:<{label_w}}  {wrapped[0]}")
        lines += [" " * (label_w + 4) + more for more in wrapped[1:]]
    return lines


# ---------------------------------------------------------------- the bar chart


def chart_scale(loop: S.Loop) -> float:
    """The chart's full-scale percent: the next multiple of 10 above the highest of the scores, the
    baseline and the target (at most 100), so the bars reaching the target still show where it is."""
    values = [r.score for r in loop.rounds if r.HasField("score")]
    values += [loop.baseline_score] if loop.HasField("baseline_score") else []
    values += [loop.spec.target] if loop.spec.target > 0 else []
    top = max((v for v in values if math.isfinite(v)), default=0.0)
    if top <= 0:
        return 100.0
    return float(min(100, (math.floor(top / 10 + 1e-9) + 1) * 10))


def chart_lines(loop: S.Loop, *, width: int = 80, unicode: bool = True) -> list[str]:
    """Horizontal bars, one line per round and one for the baseline, from 0% to the scale:
    the BEST round's bar drawn solid with its badge, the target marked on every line."""
    best_cell, bar_cell, base_cell, mark = BARS[unicode]
    label_w, value_w = 7, 7  # "  base ", " 36.2% "
    badge_w = len(BEST) + 1
    cols = max(10, width - label_w - value_w - badge_w - 1)
    scale = chart_scale(loop)
    target_col = (min(cols - 1, max(0, round(loop.spec.target / scale * cols) - 1))
                  if loop.spec.target > 0 else None)

    def line(label: str, score: float | None, fill: str, text: str = "", badge: str = "") -> str:
        cells = [" "] * cols
        if score is not None and math.isfinite(score):
            n = max(1 if score > 0 else 0, min(cols, round(score / scale * cols)))
            cells[:n] = fill * n
        for i, ch in enumerate(text[:cols]):
            cells[i] = ch
        if target_col is not None and cells[target_col] == " ":
            cells[target_col] = mark
        value = f"{score:5.1f}%" if score is not None else ""
        return f"  {label:<{label_w - 2}}{''.join(cells)} {value:>{value_w - 1}} {badge}".rstrip()

    legend = [f"{best_cell} best", f"{bar_cell} round", f"{base_cell} baseline"]
    if target_col is not None:
        legend.append(f"{mark} target {target_text(loop.spec.target)}")
    title = "Score per round"
    legend_text = "  ".join(legend)
    lines = ([title + legend_text.rjust(width - len(title))] if len(title) + 2 + len(legend_text) <= width
             else [title, "  " + legend_text])
    if loop.HasField("baseline_score"):
        lines.append(line("base", loop.baseline_score, base_cell))
    for r in loop.rounds:
        if r.HasField("score"):
            lines.append(line(f"R{r.index}", r.score, best_cell if r.best else bar_cell,
                              badge=BEST if r.best else ""))
        else:
            lines.append(line(f"R{r.index}", None, "", text=f"({round_state(r)})"))
    if len(lines) == 1:
        lines.append("  (nothing scored yet)")
    axis_left, axis_right = "0%", f"{scale:g}%"
    lines.append(" " * label_w + axis_left + axis_right.rjust(cols - len(axis_left)))
    return lines


# ---------------------------------------------------------------- the rounds


def round_lines(loop: S.Loop, *, width: int = 80, unicode: bool = True) -> list[str]:
    """One row per round: R<k>, its training job id (`rlvr jobs show <id>`), duration, score, the
    delta arrow against the previous scored round, the BEST badge; an unscored round's status;
    a failed round's error on the line under it."""
    if not loop.rounds:
        return ["Rounds", "  (no round started yet)"]
    job_w = max(6, *(len(r.job_id) for r in loop.rounds))
    lines = ["Rounds", f"  {'':<4}{'JOB':<{job_w}}  {'TIME':>7}  {'SCORE':>6}  {'DELTA':<7}"]
    for r in loop.rounds:
        head = f"  {'R' + str(r.index):<4}{r.job_id or '-':<{job_w}}  {duration(r.duration_seconds):>7}  "
        if r.HasField("score"):
            row = f"{head}{pct(r.score):>6}  {round_delta(r, unicode=unicode):<7}"
            notes = [BEST] if r.best else []
            if not r.real_gain:
                threshold = f" (needs > {r.gain_threshold:.1f} pts)" if r.gain_threshold > 0 else ""
                notes.append(f"no real gain{threshold}")
            row = (row + "  " + "  ".join(notes)) if notes else row
        else:
            row = f"{head}{round_state(r)}"
        if len(row.rstrip()) > width:
            row = row[: width - 1] + ("…" if unicode else "~")
        lines.append(row.rstrip())
        if r.error:
            lines += wrap(f"error: {r.error}", width, indent="      ", hang="  ")
    return lines


# ---------------------------------------------------------------- the view


def render(loop: S.Loop, *, width: int = 80, unicode: bool = True) -> str:
    """The whole loop view of `rlvr loops show`, at most `width` columns wide."""
    lines = header_lines(loop, width=width, unicode=unicode)
    lines += [""] + chart_lines(loop, width=width, unicode=unicode)
    lines += [""] + round_lines(loop, width=width, unicode=unicode)
    for w in loop.warnings:
        lines += wrap(f"warning: {w}", width, hang="  ")
    return "\n".join(line.rstrip() for line in lines)


def progress_line(loop: S.Loop) -> str:
    """One line of `rlvr loops watch` on a pipe: status, rounds, best and what it is doing."""
    best = f"best {pct(loop.best_score)} (R{loop.best_round})" if loop.HasField("best_score") else "best -"
    running = next((r for r in reversed(loop.rounds) if not r.HasField("score")), None)
    doing = f"R{running.index} {round_state(running)}" if running is not None and not is_final(loop.status) else ""
    parts = [status_word(loop.status), f"rounds {len(loop.rounds)}/{loop.spec.max_rounds or '?'}", best, doing,
             loop.message]
    return "  ".join(p for p in parts if p)


def list_header() -> str:
    return f"{'ID':<14}{'STATUS':<16}{'ROUNDS':<8}{'BEST':>6}  {'TARGET':>6}  {'ELAPSED':<9}NAME"


def list_line(loop: S.Loop) -> str:
    """A row of `rlvr loops list` (under `list_header()`)."""
    rounds = f"{len(loop.rounds)}/{loop.spec.max_rounds}" if loop.spec.max_rounds else str(len(loop.rounds))
    best = pct(loop.best_score) if loop.HasField("best_score") else "-"
    target = target_text(loop.spec.target) if loop.spec.target else "-"
    return (f"{loop.id:<14}{status_word(loop.status):<16}{rounds:<8}{best:>6}  {target:>6}  "
            f"{duration(loop.elapsed_seconds):<9}{loop.spec.name}")


# ---------------------------------------------------------------- export rows

EXPORT_COLUMNS = ["round", "status", "job_id", "evaluation_id", "base_round", "score", "delta", "best",
                  "real_gain", "gain_threshold", "duration_seconds", "training_seconds", "benchmarking_seconds",
                  "reclaimed_bytes", "started_at", "finished_at", "adapter_name", "adapter_version",
                  "adapter_path", "error"]
"""The columns of `rlvr loops export` / `SchedulerClient.export_loop`, one row per round:

round (1-based), status (TRAINING, BENCHMARKING, SCORED, FAILED, STOPPED), job_id (the round's
training job), evaluation_id, base_round (the round it trained on top of, 0 = the base model),
score and delta (percent and points; empty in CSV / null in JSONL until scored, delta also for the
first scored round), best and real_gain (booleans), gain_threshold (points), duration_seconds,
training_seconds, benchmarking_seconds, reclaimed_bytes, started_at and finished_at (ISO 8601 UTC,
empty / null when unset), adapter_name, adapter_version, adapter_path (the round's published,
stacked adapter), error (a failed round's cause)."""


def _iso(ts: Timestamp) -> str | None:
    if not ts.seconds and not ts.nanos:
        return None
    return ts.ToDatetime().isoformat(timespec="seconds") + "Z"


def export_rows(loop: S.Loop) -> list[dict[str, object]]:
    """The loop's rounds as rows keyed by EXPORT_COLUMNS (None where a value is unset)."""
    rows = []
    for r in loop.rounds:
        try:
            status = S.RoundStatus.Name(r.status).removeprefix("ROUND_STATUS_")
        except ValueError:
            status = str(r.status)
        rows.append({
            "round": r.index, "status": status, "job_id": r.job_id, "evaluation_id": r.evaluation_id,
            "base_round": r.base_round, "score": r.score if r.HasField("score") else None,
            "delta": r.delta if r.HasField("delta") else None, "best": r.best, "real_gain": r.real_gain,
            "gain_threshold": r.gain_threshold, "duration_seconds": r.duration_seconds,
            "training_seconds": r.training_seconds, "benchmarking_seconds": r.benchmarking_seconds,
            "reclaimed_bytes": r.reclaimed_bytes, "started_at": _iso(r.started_at),
            "finished_at": _iso(r.finished_at), "adapter_name": r.adapter.name,
            "adapter_version": r.adapter.version, "adapter_path": r.adapter.path, "error": r.error,
        })
    return rows


def export_text(loop: S.Loop, fmt: str = "csv") -> str:
    """The rows as CSV (a header, then one line per round; unset values empty, booleans
    true/false) or JSONL (one object per round, unset values null)."""
    rows = export_rows(loop)
    if fmt == "jsonl":
        return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    if fmt != "csv":
        raise ValueError(f"fmt: {fmt!r} is not an export format; allowed: csv, jsonl")
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=EXPORT_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if v is None else str(v).lower() if isinstance(v, bool) else v
                         for k, v in row.items()})
    return buffer.getvalue()
