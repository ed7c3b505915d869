"""What the templates show, computed by the terminal views and the HTML reports: nothing here
recomputes a figure the server or those modules already compute.

- the RL Metrics card: `jobs_view` (charts, tiles, trend words, number format) and `report.chart_png`
  (the same matplotlib charts as `rlvr jobs report`), embedded as data URIs;
- the loop page: `loops_view` (status words, percents, deltas, round states, durations) and
  `loop_report.chart_png` (the bar chart per round);
- evaluations: `eval_cmd.TILES` (the four score columns);
- the Training Summary: `train_cmd.summary_rows`.

The one drawing of its own is the jobs list's sparkline (an inline SVG polyline of reward and
accuracy): the reports have no chart that small.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from dataclasses import dataclass

from markupsafe import Markup, escape

from rlvr.clients import loop_report, report
from rlvr.clients.commands.eval import TILES as EVAL_TILES
from rlvr.clients.views import episodes as episodes_view
from rlvr.clients.views import jobs as jobs_view
from rlvr.clients.views import loops as loops_view
from rlvr.clients.views.jobs import human_size as human_size  # re-exported: the job page's sizes
from rlvr.clients.views.jobs import summary_rows
from rlvr.v1 import benchmark_pb2 as B
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import scheduler_pb2 as S

FINAL_JOB = (C.JOB_STATUS_COMPLETED, C.JOB_STATUS_FAILED, C.JOB_STATUS_CANCELLED)
FINAL_EVAL = (B.EVALUATION_STATUS_COMPLETED, B.EVALUATION_STATUS_FAILED, B.EVALUATION_STATUS_CANCELLED)
ARROW_WORDS = {"↑": "up", "↓": "down", "→": "unchanged"}  # a delta arrow in words, for screen readers


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def when(ts) -> str:  # noqa: ANN001 (protobuf Timestamp)
    return ts.ToDatetime().strftime("%Y-%m-%d %H:%M:%S UTC") if ts.seconds else ""


# ---------------------------------------------------------------- jobs


def job_status(status: int) -> str:
    """COMPLETED, RUNNING, ... (the reports' badge classes)."""
    return jobs_view.status_name(status)


def is_final_job(job: C.Job) -> bool:
    return job.status in FINAL_JOB


def progress(job: C.Job) -> tuple[int, int]:
    """(current step, total steps) for a <progress>; total 0 when unknown."""
    return job.current_step, max(job.total_steps, 0)


def job_fingerprint(job: C.Job, metrics: S.JobMetrics | None) -> str:
    """Changes whenever the job page would: status, step, stored steps, adapter."""
    steps = metrics.tiles.steps if metrics is not None and metrics.has_steps else 0
    return f"{job.status}-{job.current_step}-{steps}-{job.adapter.version}-{len(job.error)}"


def summary(summary_msg: C.TrainingSummary) -> list[tuple[str, str]]:
    return [(k, str(v)) for k, v in summary_rows(summary_msg) if str(v)]


@dataclass(frozen=True)
class TrendView:
    label: str
    arrow: str
    word: str
    early: str
    late: str
    delta: str
    peak: str
    peak_step: int
    window: int


@dataclass(frozen=True)
class ChartView:
    key: str
    title: str
    src: str
    caption: str


@dataclass(frozen=True)
class MetricsView:
    has_steps: bool
    message: str
    partial: bool
    trends: list[TrendView]
    tiles: list[tuple[str, str]]
    charts: list[ChartView]
    title: str = "RL Metrics"  # "SFT Metrics" for a Supervised (SFT) job


def _trend(label: str, trend: S.Trend) -> TrendView:
    return TrendView(label=label, arrow=report.ARROWS.get(trend.direction, "?"),
                     word=jobs_view.DIRECTION_WORDS.get(trend.direction, "unknown"), early=jobs_view.num(trend.early),
                     late=jobs_view.num(trend.late), delta=f"{trend.delta:+.3f}", peak=jobs_view.num(trend.peak),
                     peak_step=trend.peak_step, window=trend.window)


@functools.lru_cache(maxsize=64)
def _charts(serialized: bytes) -> tuple[ChartView, ...]:
    """The card's charts (the same PNGs as `rlvr jobs report`), cached by the metrics' bytes: every
    viewer of a step, and the page and its first live update, share one rendering."""
    metrics = S.JobMetrics.FromString(serialized)
    return tuple(ChartView(chart.key, chart.title, data_uri(report.chart_png(chart, report.trends_of(metrics))),
                           jobs_view.chart_caption(chart)) for chart in jobs_view.charts_of(metrics))


def metrics_view(metrics: S.JobMetrics) -> MetricsView:
    """The RL Metrics card: trends, tiles and charts as `rlvr jobs show` has them."""
    partial = metrics.status in (C.JOB_STATUS_RUNNING, C.JOB_STATUS_QUEUED)
    if not metrics.has_steps:
        return MetricsView(False, metrics.message or "no training step recorded yet", partial, [], [], [],
                           jobs_view.card_title(metrics))
    # Only what the charts depend on goes into the cache key (status changes must not re-render).
    key = S.JobMetrics(series=metrics.series, has_kl=metrics.has_kl, has_entropy=metrics.has_entropy,
                       has_episodes=metrics.has_episodes, head=metrics.head,
                       accuracy_trend=metrics.accuracy_trend, reward_trend=metrics.reward_trend)
    return MetricsView(
        has_steps=True, message=metrics.message, partial=partial,
        trends=[_trend(label, trend) for label, trend in jobs_view.card_trends(metrics)],
        tiles=jobs_view.tile_values(metrics.tiles, jobs_view.no_reward(metrics), jobs_view.head_regression(metrics)),
        title=jobs_view.card_title(metrics),
        charts=list(_charts(key.SerializeToString(deterministic=True))),
    )


def sparkline(metrics: S.JobMetrics | None, width: int = 120, height: int = 28) -> Markup:
    """Reward (blue) and accuracy (green) per step as a small inline SVG, labelled for screen readers."""
    if metrics is None or not metrics.has_steps or not metrics.series:
        return Markup('<span class="muted">no steps yet</span>')
    points = sorted(metrics.series, key=lambda p: p.step)
    what = "token accuracy" if metrics.supervised else "accuracy"
    if metrics.supervised:  # a Supervised (SFT) job: its token accuracy, and no reward
        accuracies = [p.token_accuracy for p in points]
        rewards = []
    elif metrics.head:  # a Head job: its held-out accuracy where it evaluated, else its loss
        accuracies = [p.heldout_accuracy for p in points if p.HasField("heldout_accuracy")]
        accuracies, what = (accuracies, "held-out accuracy") if accuracies else ([p.loss for p in points], "loss")
        rewards = []
    else:
        rewards = [p.reward for p in points]
        accuracies = [p.accuracy for p in points]
    lo, hi = min(rewards + accuracies), max(rewards + accuracies)
    span = (hi - lo) or 1.0

    def line(values: list[float]) -> str:
        n = len(values)
        xs = [width / 2] if n == 1 else [i * (width - 4) / (n - 1) + 2 for i in range(n)]
        return " ".join(f"{x:.1f},{height - 3 - (v - lo) / span * (height - 6):.1f}" for x, v in zip(xs, values,
                                                                                                      strict=True))

    reward = f"reward {jobs_view.num(rewards[0])} to {jobs_view.num(rewards[-1])}, " if rewards else ""
    label = (f"{reward}{what} {jobs_view.num(accuracies[0])} to {jobs_view.num(accuracies[-1])} over "
             f"{len(accuracies)} steps")
    marker = "round" if len(points) > 1 else "square"
    reward_line = (f'<polyline fill="none" stroke="{report.COLORS["reward"]}" stroke-width="2" '
                   f'stroke-linecap="{marker}" points="{line(rewards)}"/>') if rewards else ""
    return Markup(
        f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(label)}"><title>{escape(label)}</title>{reward_line}'
        f'<polyline fill="none" stroke="{report.COLORS["accuracy"]}" stroke-width="2" stroke-linecap="{marker}" '
        f'points="{line(accuracies)}"/></svg>'
    )


# ---------------------------------------------------------------- completions and episodes

ENTRY_WHO = {"assistant": "Assistant", "tool": "Tool result", "environment": "Environment",
             "failed": "Episode failed", "text": ""}


def entry_heading(entry: episodes_view.Entry) -> str:
    """An episode entry's heading: who speaks, and which turn or tool ("Assistant · turn 2",
    "Tool error · calculate", "Environment")."""
    if entry.kind == "assistant":
        return f"Assistant · {entry.label.lower()}"
    if entry.kind == "tool":
        return f"{'Tool error' if entry.error else 'Tool result'} · {entry.label.removeprefix('Tool ')}"
    return ENTRY_WHO.get(entry.kind, entry.label)


def completion_turns(completion: str, episodes: bool, episode_json: str = "") -> list[episodes_view.Entry]:
    """A completion turn by turn when it is an episode (its JSON when there is one, else its
    transcript); `[]` for a single answer, shown as it is."""
    if episode_json:
        entries = episodes_view.from_episode(episode_json)
        if entries:
            return entries
    if episodes and episodes_view.is_transcript(completion):
        return episodes_view.from_transcript(completion)
    return []


def prompt_tail(prompt: str, width: int = 100) -> str:
    """The prompt's last non-empty line (the question, after a chat template's system text), cut."""
    lines = [line.strip() for line in prompt.splitlines() if line.strip()]
    tail = lines[-1] if lines else ""
    return tail if len(tail) <= width else tail[: width - 1] + "…"


@dataclass(frozen=True)
class SampleView:
    number: int
    prompt: str
    prompt_tail: str
    completion: str
    reward: str
    accuracy: str
    turns: list[episodes_view.Entry]

    @property
    def turn_count(self) -> int:
        return sum(e.kind == "assistant" for e in self.turns)


@dataclass(frozen=True)
class StepSamplesView:
    step: int
    samples: list[SampleView]


def samples_view(resp: S.GetJobSamplesResponse) -> list[StepSamplesView]:
    """The Completions card: each step's samples, newest step first, episodes turn by turn."""
    episodes = bool(resp.environment)
    return [StepSamplesView(event.step, [
        SampleView(n, s.prompt, prompt_tail(s.prompt), s.completion, f"{s.reward:.3f}", f"{s.accuracy:.2f}",
                   completion_turns(s.completion, episodes)) for n, s in enumerate(event.samples, 1)])
        for event in resp.steps]


# ---------------------------------------------------------------- loops


@dataclass(frozen=True)
class Tile:
    label: str
    value: str
    more: str = ""


@dataclass(frozen=True)
class RoundView:
    index: int
    job_id: str
    evaluation_id: str
    trained_on: str
    duration: str
    score: str          # "36.2%" or the unscored round's state
    scored: bool
    arrow: str
    arrow_word: str
    delta: str
    best: bool
    notes: str
    error: str


def loop_tiles(loop: S.Loop) -> list[Tile]:
    """The header stats (`loops_view.header_tiles`)."""
    return [Tile(label, value, more) for label, value, more in loops_view.header_tiles(loop, dash="–")]


def round_views(loop: S.Loop) -> list[RoundView]:
    out = []
    for r in loop.rounds:
        scored = r.HasField("score")
        arrow = loops_view.delta_arrow(r.delta) if r.HasField("delta") else ""
        if scored:
            notes = ("real gain" if r.real_gain else
                     f"no real gain (needs > {r.gain_threshold:.1f} pts)" if r.gain_threshold > 0 else "no real gain")
        else:
            notes = ""
        if r.reclaimed_bytes:
            notes = (notes + "; " if notes else "") + f"reclaimed {human_size(r.reclaimed_bytes)}"
        out.append(RoundView(
            index=r.index, job_id=r.job_id, evaluation_id=r.evaluation_id,
            trained_on=f"R{r.base_round}" if r.base_round else "base model",
            duration=loops_view.duration(r.duration_seconds),
            score=loops_view.pct(r.score) if scored else loops_view.round_state(r), scored=scored,
            arrow=arrow, arrow_word=ARROW_WORDS.get(arrow, ""),
            delta=f"{r.delta:+.1f}" if r.HasField("delta") else "", best=r.best, notes=notes, error=r.error))
    return out


@functools.lru_cache(maxsize=32)
def _loop_chart(serialized: bytes) -> str:
    return data_uri(loop_report.chart_png(S.Loop.FromString(serialized)))


def loop_chart(loop: S.Loop) -> tuple[str, str] | None:
    """The bar chart per round (`rlvr loops report`'s) as (data URI, caption); None before anything
    is scored. Cached by what the bars show (durations and elapsed time left out)."""
    if not loop_report.has_chart(loop):
        return None
    key = S.Loop(spec=S.LoopSpec(target=loop.spec.target))
    if loop.HasField("baseline_score"):
        key.baseline_score = loop.baseline_score
    for r in loop.rounds:
        key.rounds.add(index=r.index, status=r.status, best=r.best, current_step=r.current_step,
                       total_steps=r.total_steps, **({"score": r.score} if r.HasField("score") else {}))
    return _loop_chart(key.SerializeToString(deterministic=True)), loops_view.chart_caption(loop)


def loop_settings(loop: S.Loop) -> list[tuple[str, str]]:
    rows = [("Name", loop.spec.name or "–"), *loops_view.settings_rows(loop.spec)]
    for label, ts in (("Created", loop.created_at), ("Started", loop.started_at), ("Finished", loop.finished_at)):
        if ts.seconds:
            rows.append((label, when(ts)))
    return rows


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


# ---------------------------------------------------------------- evaluations


def eval_status(status: int) -> str:
    return B.EvaluationStatus.Name(status).removeprefix("EVALUATION_STATUS_")


def eval_tiles(scores: B.ScoreBreakdown) -> list[Tile]:
    """The overall score (the benchmark's default column), then the four columns."""
    return [Tile(f"Score ({scores.score_column or 'accuracy'})", f"{scores.score:.1%}"),
            *(Tile(title, f"{getattr(scores, key):.1%}") for key, title in EVAL_TILES)]


def policy(ev: B.Evaluation | B.LeaderboardEntry) -> str:
    return f"{ev.adapter_name} v{ev.adapter_version}" if ev.adapter_name else "base model"


def finish_reason(value: int) -> str:
    return C.FinishReason.Name(value).removeprefix("FINISH_REASON_").lower()
