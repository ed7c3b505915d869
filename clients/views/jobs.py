"""The RL Metrics card in a terminal: the Accuracy and Reward trends with arrows, the stat tiles and
text charts of the per-step series, as pure functions of a `JobMetrics` message (no I/O, no gRPC).

`render(metrics)` is the whole card; it fits `width` columns (80 by default) and draws with Unicode
(arrows, box tiles, braille charts) or, with `unicode=False`, plain ASCII for a terminal or pipe that
is not UTF-8 (`supports_unicode(stream)` decides for a stream).
"""

from __future__ import annotations

import codecs
import math
import os
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from rlvr.jobspec import SPEC_FIELDS, job_status_name
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import scheduler_pb2 as S

ARROWS = {
    True: {S.TREND_DIRECTION_RISING: "↑", S.TREND_DIRECTION_FALLING: "↓", S.TREND_DIRECTION_FLAT: "→"},
    False: {S.TREND_DIRECTION_RISING: "^", S.TREND_DIRECTION_FALLING: "v", S.TREND_DIRECTION_FLAT: "->"},
}
DIRECTION_WORDS = {S.TREND_DIRECTION_RISING: "rising", S.TREND_DIRECTION_FALLING: "falling",
                   S.TREND_DIRECTION_FLAT: "flat"}


@dataclass(frozen=True)
class Series:
    key: str       # file-name friendly: "reward", "kl", ...
    title: str
    steps: list[int]
    values: list[float]
    label: str = ""  # its name in a chart's legend ("reward"); default the title

    @property
    def name(self) -> str:
        return self.label or self.title


@dataclass(frozen=True)
class Chart:
    """One chart of the RL Metrics card: one series, or two sharing the steps and one legend."""

    key: str  # file-name friendly: "reward_accuracy", "loss", ...
    title: str
    series: tuple[Series, ...]

    @property
    def steps(self) -> tuple[int, int]:
        """The first and last step any of its series covers."""
        return (min(s.steps[0] for s in self.series), max(s.steps[-1] for s in self.series))


# The charts and their series, in the spec's order: "Reward & accuracy and Loss chart every step. If
# the run logged them, you may also see KL & entropy and Completion length charts below."
COMPONENTS_CHART = "reward_components"
CHARTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("reward_accuracy", "Reward & accuracy", ("reward", "accuracy", "heldout_accuracy")),
    ("token_accuracy", "Token accuracy", ("token_accuracy",)),  # a Supervised (SFT) job
    ("head_scores", "Held-out accuracy & F1", ("head_accuracy", "heldout_f1")),  # a Head job (classification)
    ("loss", "Loss", ("loss", "heldout_loss")),
    ("kl_entropy", "KL & entropy", ("kl", "entropy")),
    ("completion_length", "Completion length (tokens)", ("completion_length",)),
    ("turns_tools", "Turns & tool calls", ("turns", "tool_calls")),  # a job with an environment
)


# What Python 3.7+ sets LC_CTYPE to when it starts under the C locale (PEP 538's coercion).
_COERCED_CTYPE = frozenset({"C.UTF-8", "C.utf8", "UTF-8"})


def _locale_is_utf8(environ: Mapping[str, str]) -> bool | None:
    """Whether the locale the environment selects for characters (LC_ALL, then LC_CTYPE, then
    LANG: the first one set wins) uses UTF-8; None when none is set. "C" and "POSIX" are ASCII, and
    a name without a codeset ("en_US") is its legacy 8-bit one. An LC_CTYPE that Python itself put
    there (PEP 538: started under LANG=C, or with no locale at all, it sets LC_CTYPE=C.UTF-8 in its
    own environment) counts as the C locale it replaced."""
    lc_all, lc_ctype, lang = (environ.get(k, "") for k in ("LC_ALL", "LC_CTYPE", "LANG"))
    if not lc_all and lc_ctype in _COERCED_CTYPE and lang in ("", "C", "POSIX"):
        return False
    value = lc_all or lc_ctype or lang
    if not value:
        return None
    codeset = value.split(".", 1)[1].split("@", 1)[0] if "." in value else ""
    return codeset.lower().replace("-", "") == "utf8"


def supports_unicode(stream: object, environ: Mapping[str, str] | None = None) -> bool:
    """True when `stream` encodes UTF-8 and the locale is a UTF-8 one (a plain ASCII or Latin-1 pipe,
    or a terminal under LANG=C, gets the ASCII drawing).

    Both are needed: Python 3.11 writes UTF-8 under LANG=C (its UTF-8 mode, PEP 538/540), so the
    stream's encoding alone says UTF-8 to a terminal that shows only ASCII. With no locale variable
    set at all the stream decides."""
    encoding = getattr(stream, "encoding", None)
    if not encoding:
        return False
    try:
        if codecs.lookup(encoding).name != "utf-8":
            return False
    except LookupError:
        return False
    return _locale_is_utf8(os.environ if environ is None else environ) is not False


def human_size(size: int) -> str:
    """A byte count as people read it: "512 B", "3.4 MiB"."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"  # unreachable


def wrap(text: str, width: int, indent: str = "", hang: str = "") -> list[str]:
    """`text` in lines of at most `width`, each starting with `indent` (`indent + hang` after the
    first)."""
    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + hang,
                         break_long_words=True, break_on_hyphens=False) or [indent.rstrip()]


def shorten_middle(text: str, width: int, *, unicode: bool = True) -> str:
    """`text` cut in the middle to at most `width` characters (a long path keeps both ends)."""
    if len(text) <= width:
        return text
    mark = "…" if unicode else "..."
    keep = max(0, width - len(mark))
    return text[: keep - keep // 2] + mark + text[len(text) - keep // 2:] if keep // 2 else text[:keep] + mark


status_name = job_status_name


def num(value: float) -> str:
    """A figure in at most ~8 characters: 0.812, -0.0123, 128.5, 1.2e+04."""
    if not math.isfinite(value):
        return str(value)
    magnitude = abs(value)
    if magnitude == 0:
        return "0"
    if magnitude >= 10000:
        return f"{value:.3g}"
    if magnitude >= 10:
        return f"{value:.1f}"
    return f"{value:.2g}" if magnitude < 0.01 else f"{value:.3f}"


def series_of(metrics: S.JobMetrics) -> list[Series]:
    """The charted series in display order: reward, accuracy, loss, then KL, entropy and
    completion length where the run logged them, and a job with an environment's turns per episode
    and tool calls."""
    points = sorted(metrics.series, key=lambda p: p.step)
    steps = [p.step for p in points]
    if any(p.HasField("token_accuracy") for p in points):
        return sft_series(points)
    if metrics.head:
        return head_series(points)
    out = [Series("reward", "Reward (mean)", steps, [p.reward for p in points], "reward"),
           Series("accuracy", "Accuracy", steps, [p.accuracy for p in points], "accuracy"),
           Series("loss", "Loss", steps, [p.loss for p in points], "loss")]
    heldout = [(p.step, p.heldout_accuracy) for p in points if p.HasField("heldout_accuracy")]
    if heldout:  # evaluation while training (advanced.eval_every): the adapter's greedy held-out accuracy
        out.insert(2, Series("heldout_accuracy", "Held-out accuracy", [s for s, _ in heldout],
                             [v for _, v in heldout], "held-out"))
    kl = [(p.step, p.kl) for p in points if p.HasField("kl")]
    if metrics.has_kl or kl:
        out.append(Series("kl", "KL divergence", [s for s, _ in kl], [v for _, v in kl], "KL"))
    entropy = [(p.step, p.entropy) for p in points if p.HasField("entropy")]
    if metrics.has_entropy or entropy:
        out.append(Series("entropy", "Entropy", [s for s, _ in entropy], [v for _, v in entropy], "entropy"))
    if any(p.completion_length for p in points):
        out.append(Series("completion_length", "Completion length (tokens)", steps,
                          [p.completion_length for p in points], "tokens"))
    if metrics.has_episodes:  # only a job with an environment: its episodes' turns and tool calls
        turns = [(p.step, p.turns_mean) for p in points if p.HasField("turns_mean")]
        out.append(Series("turns", "Turns per episode", [s for s, _ in turns], [v for _, v in turns], "turns"))
        calls = [(p.step, float(p.tool_calls)) for p in points if p.HasField("tool_calls")]
        out.append(Series("tool_calls", "Tool calls", [s for s, _ in calls], [v for _, v in calls], "tool calls"))
    return [s for s in out if s.values] + component_series(points)


def sft_series(points: Sequence[S.SeriesPoint]) -> list[Series]:
    """A Supervised (SFT) job's series: token accuracy, the loss, the held-out loss where it was
    evaluated, and the entropy."""
    out = []
    for key, label, unit in (("token_accuracy", "Token accuracy", "accuracy"), ("loss", "Loss", "loss"),
                             ("heldout_loss", "Held-out loss", "held-out"), ("entropy", "Entropy", "entropy")):
        pairs = [(p.step, getattr(p, key)) for p in points if key == "loss" or p.HasField(key)]
        if pairs:
            out.append(Series(key, label, [s for s, _ in pairs], [v for _, v in pairs], unit))
    return out


def head_series(points: Sequence[S.SeriesPoint]) -> list[Series]:
    """A Head job's series: the loss every step; the held-out loss (regression: its mean squared
    error), accuracy and macro F1 at the steps that evaluated."""
    out = [Series("loss", "Loss", [p.step for p in points], [p.loss for p in points], "loss")]
    for key, field, label, unit in (("heldout_loss", "heldout_loss", "Held-out loss", "held-out"),
                                    ("head_accuracy", "heldout_accuracy", "Held-out accuracy", "accuracy"),
                                    ("heldout_f1", "heldout_f1", "Held-out macro F1", "F1")):
        pairs = [(p.step, getattr(p, field)) for p in points if p.HasField(field)]
        if pairs:
            out.append(Series(key, label, [s for s, _ in pairs], [v for _, v in pairs], unit))
    return out


COMPONENT_PREFIX = "component:"


def component_series(points: Sequence[S.SeriesPoint]) -> list[Series]:
    """Each reward component's step mean (SeriesPoint.reward_components), when a job has more than the
    one score of one reward: several rewards, or a reward's named parts."""
    keys = list(dict.fromkeys(k for p in points for k in sorted(p.reward_components)))
    if len(keys) < 2:
        return []
    steps = [p.step for p in points]
    return [Series(f"{COMPONENT_PREFIX}{k}", k, steps, [p.reward_components.get(k, 0.0) for p in points], k)
            for k in keys]


def charts_of(metrics: S.JobMetrics) -> list[Chart]:
    """The card's charts (`CHARTS`): Reward & accuracy and Loss, then KL & entropy and Completion
    length where the run logged them; a pair with one series logged is a chart of that one."""
    by_key = {s.key: s for s in series_of(metrics)}
    charts = []
    for key, title, keys in CHARTS:
        series = tuple(by_key[k] for k in keys if k in by_key)
        if series:
            whole = len(series) == len(keys) or (key == "reward_accuracy" and len(series) == 2)
            charts.append(Chart(key, title if whole else series[0].title, series))
    components = tuple(s for k, s in by_key.items() if k.startswith(COMPONENT_PREFIX))
    if components:  # after the spec's charts: every reward's score and named part, on one 0-1 axis
        charts.append(Chart(COMPONENTS_CHART, "Reward components", components))
    return charts


def chart_caption(chart: Chart) -> str:
    """One line under a chart: its steps, then each series' last, min and max."""
    first, last = chart.steps
    parts = [f"{s.name if len(chart.series) > 1 else ''} last {num(s.values[-1])}, min {num(min(s.values))}, "
             f"max {num(max(s.values))}".strip() for s in chart.series]
    return f"{chart.title}: steps {first}–{last}; {'; '.join(parts)}"


# ---------------------------------------------------------------- the job


def _when(ts: object, day: str) -> tuple[str, str]:
    """("07:59:02", "2026-12-01") of a protobuf Timestamp, ("-", day) when unset."""
    if not getattr(ts, "seconds", 0):
        return "-", day
    moment = ts.ToDatetime()  # type: ignore[attr-defined]
    return moment.strftime("%H:%M:%S"), moment.strftime("%Y-%m-%d")


def job_lines(job: C.Job, *, width: int = 80, unicode: bool = True) -> list[str]:
    """The head of `rlvr jobs show`: status and progress, when it ran (the date once, and again
    only where it changes), why a queued job waits, the error, and the adapter (its path cut in
    the middle to fit)."""
    lines = [f"job {job.id}: {status_name(job.status)}  step {job.current_step}/{job.total_steps}  "
             f"worker {job.worker or '-'}"]
    parts, day = [], ""
    for label, ts in (("created", job.created_at), ("started", job.started_at), ("finished", job.finished_at)):
        clock, date = _when(ts, day)
        parts.append(f"{label} {clock}" if date == day or clock == "-" else f"{label} {date} {clock}")
        day = date
    sep = " · " if unicode else " | "
    joined = sep.join(parts)
    lines += [joined] if len(joined) <= width else parts
    if job.status == C.JOB_STATUS_QUEUED and job.queue_reason:
        lines += wrap(f"queued: {job.queue_reason}", width, hang="  ")
    if job.error:
        lines += wrap(f"error: {job.error}", width, hang="  ")
    if job.adapter.name:
        lines.append(f"adapter {job.adapter.name} v{job.adapter.version}")
        if job.adapter.path:
            lines.append("  " + shorten_middle(job.adapter.path, width - 2, unicode=unicode))
    return [shorten_middle(line, width, unicode=unicode) for line in lines]


# ---------------------------------------------------------------- trends and tiles


def trend_line(label: str, trend: S.Trend, *, unicode: bool = True) -> str:
    """`Accuracy Trend  ↑ rising   0.250 → 0.750  Δ +0.500  peak 0.800 @ step 9` (early → late:
    the means over the early and the late window; `window_line` says how long they are)."""
    arrow = ARROWS[unicode].get(trend.direction, "?")
    word = DIRECTION_WORDS.get(trend.direction, "unknown")
    to = "→" if unicode else "->"
    delta = "Δ" if unicode else "delta"
    return (f"{label:<15}{arrow:>2} {word:<8}{num(trend.early):>7} {to} {num(trend.late):<7} "
            f"{delta} {trend.delta:+.3f}  peak {num(trend.peak)} @ step {trend.peak_step}")


def _steps(n: int) -> str:
    return f"{n} step{'s' if n != 1 else ''}"


def window_line(metrics: S.JobMetrics) -> str:
    """What early and late are: `windows: mean of the first 10 vs the last 10 of 40 steps`."""
    acc, rew = metrics.accuracy_trend.window, metrics.reward_trend.window
    line = f"{'':<18}windows: mean of the first {acc} vs the last {acc} of {_steps(metrics.tiles.steps)}"
    return line + (f" (reward: {rew})" if rew != acc else "")


TILE_FIELDS: list[tuple[str, Callable[[S.StatTiles], str]]] = [
    ("Steps", lambda t: str(t.steps)),
    ("Final Reward", lambda t: num(t.final_reward)),
    ("Best Reward", lambda t: num(t.best_reward)),
    ("Best Accuracy", lambda t: num(t.best_accuracy)),
    ("Final Loss", lambda t: num(t.final_loss)),
]


# A Supervised (SFT) or Head job has no reward (its accuracy: the token accuracy, the held-out accuracy).
SFT_TILES = ("Steps", "Best Accuracy", "Final Loss")


def no_reward(metrics: S.JobMetrics) -> bool:
    """A job that learns a labeled dataset (SFT, Head): no reward tiles, trend or line."""
    return metrics.supervised or metrics.head


def head_regression(metrics: S.JobMetrics) -> bool:
    """A Head job with no held-out accuracy: a regression head (its trend is the held-out loss's)."""
    return metrics.head and not any(p.HasField("heldout_accuracy") for p in metrics.series)


def card_title(metrics: S.JobMetrics) -> str:
    return "SFT Metrics" if metrics.supervised else "Head Metrics" if metrics.head else "RL Metrics"


def card_trends(metrics: S.JobMetrics) -> list[tuple[str, S.Trend]]:
    """The card's trends: accuracy and reward; a Supervised (SFT) job's token accuracy alone, a Head
    job's held-out accuracy (at the steps that evaluated)."""
    if metrics.supervised:
        return [("Token Accuracy Trend", metrics.accuracy_trend)]
    if metrics.head:
        return [("Held-out Loss Trend" if head_regression(metrics) else "Held-out Accuracy Trend",
                 metrics.accuracy_trend)]
    return [("Accuracy Trend", metrics.accuracy_trend), ("Reward Trend", metrics.reward_trend)]


def tile_values(tiles: S.StatTiles, supervised: bool = False, regression: bool = False) -> list[tuple[str, str]]:
    """The five tiles, and a job with asynchronous steps' largest policy lag (in adapter versions);
    a Supervised (SFT) or Head job's three (`SFT_TILES`), a regression head's two (no accuracy)."""
    if supervised:
        return [(label, value(tiles)) for label, value in TILE_FIELDS
                if label in SFT_TILES and not (regression and label == "Best Accuracy")]
    values = [(label, value(tiles)) for label, value in TILE_FIELDS]
    if tiles.HasField("max_policy_lag"):
        values.append(("Max Policy Lag", str(tiles.max_policy_lag)))
    return values


def tiles_lines(tiles: S.StatTiles, *, unicode: bool = True, width: int = 80, supervised: bool = False,
                regression: bool = False) -> list[str]:
    """The tiles as boxes side by side (two rows of boxes when `width` is narrow)."""
    items = tile_values(tiles, supervised, regression)
    cell = 15
    per_row = max(1, min(len(items), (width + 1) // (cell + 1)))
    tl, tr, bl, br, h, v = ("┌", "┐", "└", "┘", "─", "│") if unicode else ("+", "+", "+", "+", "-", "|")
    lines: list[str] = []
    for start in range(0, len(items), per_row):
        row = items[start:start + per_row]
        lines.append(" ".join(tl + h * (cell - 2) + tr for _ in row))
        lines.append(" ".join(f"{v}{label:^{cell - 2}}{v}" for label, _ in row))
        lines.append(" ".join(f"{v}{value:^{cell - 2}}{v}" for _, value in row))
        lines.append(" ".join(bl + h * (cell - 2) + br for _ in row))
    return lines


# ---------------------------------------------------------------- charts

# Braille: a character is a 2x4 grid of dots; bit of dot (x, y), y counted from the top.
_BRAILLE_BITS = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))


def _canvas(values: Sequence[float], cols: int, rows: int, cx: int, cy: int) -> list[list[set[int]]]:
    """Plots `values` as a connected line on a (cols*cx) x (rows*cy) dot grid; returns per cell
    the set of dots on (index x*cy + y, y from the top)."""
    cells: list[list[set[int]]] = [[set() for _ in range(cols)] for _ in range(rows)]
    width, height = cols * cx, rows * cy
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return cells
    lo, hi = min(finite), max(finite)

    def y_of(v: float) -> int:  # 0 = top row of dots
        if hi == lo:
            return height // 2
        return round((hi - v) / (hi - lo) * (height - 1))

    def x_of(i: int) -> int:
        return width // 2 if len(values) == 1 else round(i / (len(values) - 1) * (width - 1))

    def dot(x: int, y: int) -> None:
        cells[y // cy][x // cx].add((x % cx) * cy + y % cy)

    previous: tuple[int, int] | None = None
    for i, v in enumerate(values):
        if not math.isfinite(v):
            previous = None
            continue
        x, y = x_of(i), y_of(v)
        if previous is None:
            dot(x, y)
        else:
            x0, y0 = previous
            steps = max(abs(x - x0), abs(y - y0), 1)
            for k in range(1, steps + 1):
                dot(round(x0 + (x - x0) * k / steps), round(y0 + (y - y0) * k / steps))
        previous = (x, y)
    return cells


def _braille(dots: set[int]) -> str:
    code = 0x2800
    for d in dots:
        code |= _BRAILLE_BITS[d % 4][d // 4]
    return chr(code)


def _ascii(dots: set[int]) -> str:
    """One column x three levels per character: '"' top, '-' middle, '_' bottom, '|' several."""
    if not dots:
        return " "
    levels = {d % 3 for d in dots}
    if len(levels) > 1:
        return "|"
    return {0: '"', 1: "-", 2: "_"}[levels.pop()]


def _band(series: Series, cols: int, rows: int, label_w: int, unicode: bool, name: str = "") -> list[str]:
    """The plot rows of one series: its range on the first and last row (a flat line: on its
    row), `name` when given on the free row nearest the middle (a flat line's value takes the
    middle row, so its name goes above it; `rows` >= 3 leaves a free row either way)."""
    cx, cy, draw = (2, 4, _braille) if unicode else (1, 3, _ascii)
    finite = [v for v in series.values if math.isfinite(v)]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 0.0)
    labels = {(rows * cy // 2) // cy: num(hi)} if hi == lo else {0: num(hi), rows - 1: num(lo)}
    free = [r for r in range(rows) if r not in labels]
    if name and free:
        labels[min(free, key=lambda r: (abs(r - rows // 2), r))] = name
    cells = _canvas(series.values, cols, rows, cx, cy)
    lines = []
    for r, row in enumerate(cells):
        label = labels.get(r, "")
        numeric = bool(label) and label != name
        axis_char = ("┤" if numeric else "│") if unicode else ("+" if numeric else "|")
        lines.append(f"{label[:label_w]:>{label_w}}{axis_char}" + "".join(draw(c) for c in row))
    return lines


def chart_lines(chart: Chart | Series, width: int = 38, height: int = 4, *, unicode: bool = True) -> list[str]:
    """A titled line chart in exactly `width` columns: y-range labels on the left, the first and
    last step under it. A chart of two series draws each on a band of its own (a braille line has
    no colour to tell two apart) under the one title, with the series' names and last values as
    the legend (the last values in the same order) and the steps shared."""
    if isinstance(chart, Series):
        chart = Chart(chart.key, chart.title, (chart,))
    pair = len(chart.series) > 1
    labels = [num(v) for s in chart.series for v in s.values if math.isfinite(v)]
    label_w = max(8, *(len(label) for label in labels), *((len(s.name) for s in chart.series) if pair else ()))
    cols = max(4, width - label_w - 1)
    last = "last " + " / ".join(num(s.values[-1]) for s in chart.series)  # in the bands' order
    if len(chart.title) + len(last) + 1 > width:
        last = last.removeprefix("last ")
    title = chart.title[: max(0, width - len(last) - 1)]
    lines = [f"{title:<{max(0, width - len(last))}}{last}"]
    rows = max(3, height - 1) if pair else height  # a band's name needs a row beside its range labels
    for s in chart.series:
        lines += _band(s, cols, rows, label_w, unicode, s.name if pair else "")
    first_step, last_step = chart.steps
    left = f"step {first_step}"
    right = str(last_step) if last_step != first_step else ""
    lines.append(" " * (label_w + 1) + f"{left}{right:>{cols - len(left)}}")
    return [line.ljust(width)[:width] for line in lines]


def charts_lines(charts: Sequence[Chart | Series], width: int = 80, *, unicode: bool = True) -> list[str]:
    """Every chart; two side by side when `width` allows (78 columns or more)."""
    gap = 3
    if width >= 78:
        panel = (min(width, 100) - gap) // 2
        lines: list[str] = []
        for i in range(0, len(charts), 2):
            pair = [chart_lines(c, panel, unicode=unicode) for c in charts[i:i + 2]]
            if lines:
                lines.append("")
            if len(pair) == 1:
                lines += [line.rstrip() for line in pair[0]]
            else:
                left, right = pair
                depth = max(len(left), len(right))
                left += [" " * panel] * (depth - len(left))
                right += [""] * (depth - len(right))
                lines += [(a + " " * gap + b).rstrip() for a, b in zip(left, right, strict=True)]
        return lines
    lines = []
    for c in charts:
        if lines:
            lines.append("")
        lines += [line.rstrip() for line in chart_lines(c, width, unicode=unicode)]
    return lines


# ---------------------------------------------------------------- the card


def header_line(metrics: S.JobMetrics, *, unicode: bool = True) -> str:
    status = status_name(metrics.status)
    partial = ", partial" if metrics.status in (C.JOB_STATUS_RUNNING, C.JOB_STATUS_QUEUED) else ""
    dash = "—" if unicode else "-"
    return f"{card_title(metrics)} {dash} job {metrics.job_id} ({status.lower()}{partial})"


def render(metrics: S.JobMetrics, *, width: int = 80, unicode: bool = True) -> str:
    """The whole RL Metrics card as text, at most `width` columns wide (charts never wider)."""
    lines = [header_line(metrics, unicode=unicode)]
    if not metrics.has_steps:
        lines.append(f"  {metrics.message or 'no training step recorded yet'}")
        return "\n".join(lines)
    lines.append("")
    for label, trend in card_trends(metrics):
        line = trend_line(label, trend, unicode=unicode)
        if len(line) > width:  # narrow: the peak on a line of its own
            head, _, peak = line.partition("  peak ")
            line = f"{head}\n{'':<18}peak {peak}"
        lines.append(line)
    window = window_line(metrics)
    lines += [window if len(window) <= width else window.strip(), ""]
    lines += tiles_lines(metrics.tiles, unicode=unicode, width=width, supervised=no_reward(metrics),
                         regression=head_regression(metrics))
    if metrics.message:
        lines += ["", metrics.message]
    charts = charts_of(metrics)
    if charts:
        lines += [""] + charts_lines(charts, width, unicode=unicode)
    return "\n".join(lines)


def summary_rows(summary: C.TrainingSummary) -> list[tuple[str, object]]:
    """The Training Summary's label/value rows (the CLI's and the HTML report's)."""
    steps = "Full" if summary.max_steps == -1 else str(summary.max_steps)
    settings = [(row.label, summary.settings[row.path]) for row in SPEC_FIELDS if row.path in summary.settings]
    if "sft.dataset" in summary.settings or "head.dataset" in summary.settings:  # SFT, Head: their card's rows
        return [("Method", summary.method), ("Model", summary.model), ("GPU Selection", summary.gpu_selection),
                ("Quantization", summary.quantization)] + [
            (label, "Full" if label == "Max Steps" and value == "-1" else value) for label, value in settings]
    return [("Method", summary.method), ("Model", summary.model), ("Reward", summary.reward),
            ("Group Size", summary.group_size), ("Max Completion", summary.max_completion),
            ("GPU Selection", summary.gpu_selection), ("LoRA Rank", summary.lora_rank),
            ("Learn Rate", f"{summary.learn_rate:g}"), ("Max Steps", steps), ("Backend", summary.backend),
            ("Batch Size", summary.batch_size), ("LoRA Alpha", summary.lora_alpha), ("Loss Type", summary.loss_type),
            ("Quantization", summary.quantization)] + settings


def summary_lines(summary: C.TrainingSummary, warnings: list[str] | None = None, width: int = 80,
                  unicode: bool = True) -> list[str]:
    """The Training Summary and its warnings, in lines of at most `width` columns."""
    lines = ["Training Summary"] + [shorten_middle(f"  {k:<15} {v}", width, unicode=unicode)
                                    for k, v in summary_rows(summary)]
    for w in warnings or []:
        lines += wrap(f"warning: {w}", width, hang="  ")
    return lines
