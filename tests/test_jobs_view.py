"""The RL Metrics card in the terminal (clients/views/jobs.py) as pure functions of a JobMetrics, and
the `rlvr jobs show|report|download|merge|export` commands against a fake scheduler on loopback."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cli_fakes import run, serving

from rlvr.clients import cli
from rlvr.clients.commands import train as train_cmd
from rlvr.clients.views import jobs as jobs_view
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import scheduler_pb2 as S
from rlvr.v1 import scheduler_pb2_grpc

# ---------------------------------------------------------------- synthetic metrics


def trend(values: list[float]) -> S.Trend:
    """The proto's definition: w = max(1, n // 4), early/late means, flat under 0.01."""
    n = len(values)
    w = max(1, n // 4)
    early, late = sum(values[:w]) / w, sum(values[-w:]) / w
    delta = late - early
    direction = (S.TREND_DIRECTION_FLAT if abs(delta) < 0.01 else
                 S.TREND_DIRECTION_RISING if delta > 0 else S.TREND_DIRECTION_FALLING)
    peak = max(values)
    return S.Trend(early=early, late=late, delta=delta, direction=direction, peak=peak,
                   peak_step=values.index(peak) + 1, window=w)


def make_metrics(accuracy: list[float], reward: list[float] | None = None, *, kl: bool = False,
                 entropy: bool = False, job_id: str = "job-1") -> S.JobMetrics:
    reward = reward if reward is not None else [a + 0.05 for a in accuracy]
    n = len(accuracy)
    m = S.JobMetrics(job_id=job_id, status=C.JOB_STATUS_COMPLETED, has_steps=n > 0, has_kl=kl,
                     has_entropy=entropy)
    if not n:
        m.message = "no training step recorded yet: the job is queued"
        return m
    for i in range(n):
        p = m.series.add(step=i + 1, reward=reward[i], accuracy=accuracy[i], loss=0.05 / (i + 1),
                         completion_length=100.0 - i, format=0.9)
        if kl:
            p.kl = 0.002 * (i + 1)
        if entropy:
            p.entropy = 1.2 - 0.01 * i
    m.accuracy_trend.CopyFrom(trend(accuracy))
    m.reward_trend.CopyFrom(trend(reward))
    m.tiles.CopyFrom(S.StatTiles(steps=n, final_reward=reward[-1], best_reward=max(reward),
                                 best_accuracy=max(accuracy), final_loss=0.05 / n))
    return m


RISING = [0.1, 0.15, 0.2, 0.3, 0.35, 0.45, 0.5, 0.6, 0.62, 0.7, 0.75, 0.8]
FALLING = RISING[::-1]
FLAT = [0.5, 0.502, 0.498, 0.5, 0.501, 0.5, 0.499, 0.5]


# ---------------------------------------------------------------- the view


@pytest.mark.parametrize(("values", "arrow", "ascii_arrow", "word"), [
    (RISING, "↑", "^", "rising"), (FALLING, "↓", "v", "falling"), (FLAT, "→", "->", "flat")])
def test_trend_lines_carry_the_direction_arrow(values, arrow, ascii_arrow, word) -> None:
    m = make_metrics(values, values)
    for unicode, a in ((True, arrow), (False, ascii_arrow)):
        text = jobs_view.render(m, unicode=unicode)
        lines = [line for line in text.splitlines() if line.startswith(("Accuracy Trend", "Reward Trend"))]
        assert len(lines) == 2, text
        for line in lines:
            assert f" {a} {word}" in line, line
            assert f"peak {jobs_view.num(max(values))} @ step {values.index(max(values)) + 1}" in line
    t = m.accuracy_trend
    line = jobs_view.trend_line("Accuracy Trend", t)
    assert f"{jobs_view.num(t.early)} → {jobs_view.num(t.late)}" in line and f"Δ {t.delta:+.3f}" in line
    w = t.window
    assert f"windows: mean of the first {w} vs the last {w} of {len(values)} steps" in jobs_view.render(m)


def test_tiles_show_the_five_figures() -> None:
    m = make_metrics(RISING)
    text = jobs_view.render(m)
    for label in ("Steps", "Final Reward", "Best Reward", "Best Accuracy", "Final Loss"):
        assert label in text
    assert dict(jobs_view.tile_values(m.tiles)) == {
        "Steps": "12", "Final Reward": "0.850", "Best Reward": "0.850", "Best Accuracy": "0.800",
        "Final Loss": "0.0042"}
    box = jobs_view.tiles_lines(m.tiles)
    assert len(box) == 4 and box[0].count("┌") == 5 and "│     12      │" in box[2]
    narrow = jobs_view.tiles_lines(m.tiles, width=50)
    assert len(narrow) == 8 and all(len(line) <= 50 for line in narrow)


def test_no_steps_prints_the_message_only() -> None:
    m = make_metrics([])
    text = jobs_view.render(m)
    assert text.splitlines()[1].strip() == "no training step recorded yet: the job is queued"
    assert "Trend" not in text and "Steps" not in text
    assert "no training step recorded yet" in jobs_view.render(S.JobMetrics(job_id="x"))


def test_charts_fit_80_columns_and_ascii_fallback_is_ascii() -> None:
    m = make_metrics(RISING * 10, kl=True, entropy=True)
    for unicode in (True, False):
        text = jobs_view.render(m, unicode=unicode)
        assert max(len(line) for line in text.splitlines()) <= 80
        for title in ("Reward & accuracy", "Loss", "KL & entropy", "Completion length"):
            assert title in text
        assert "step 1" in text and "120" in text  # the x range under each chart
    ascii_text = jobs_view.render(m, unicode=False)
    ascii_text.encode("ascii")
    unicode_text = jobs_view.render(m)
    assert any(0x2801 <= ord(ch) <= 0x28FF for ch in unicode_text)  # braille dots drawn
    narrow = jobs_view.render(m, width=60)
    assert max(len(line) for line in narrow.splitlines()) <= 60


def test_kl_and_entropy_charts_only_where_logged() -> None:
    keys = [s.key for s in jobs_view.series_of(make_metrics(RISING))]
    assert keys == ["reward", "accuracy", "loss", "completion_length"]
    keys = [s.key for s in jobs_view.series_of(make_metrics(RISING, kl=True, entropy=True))]
    assert keys == ["reward", "accuracy", "loss", "kl", "entropy", "completion_length"]


def test_charts_are_paired_as_the_spec_shows_them() -> None:
    """"Reward & accuracy and Loss chart every step. If the run logged them, you may also see KL &
    entropy and Completion length charts below": two pairs of series, each one chart."""
    charts = jobs_view.charts_of(make_metrics(RISING, kl=True, entropy=True))
    assert [(c.key, c.title, [s.key for s in c.series]) for c in charts] == [
        ("reward_accuracy", "Reward & accuracy", ["reward", "accuracy"]), ("loss", "Loss", ["loss"]),
        ("kl_entropy", "KL & entropy", ["kl", "entropy"]),
        ("completion_length", "Completion length (tokens)", ["completion_length"])]
    only_kl = jobs_view.charts_of(make_metrics(RISING, kl=True))  # a pair with one series logged
    assert [(c.key, c.title) for c in only_kl][2] == ("kl_entropy", "KL divergence")
    text = jobs_view.render(make_metrics(RISING, kl=True, entropy=True))
    assert text.count("Reward & accuracy") == 1 and text.count("KL & entropy") == 1
    assert "Reward (mean)" not in text and "KL divergence" not in text  # no chart of either series alone
    pair = jobs_view.chart_lines(charts[0], width=38)
    assert pair[0].startswith("Reward & accuracy") and pair[0].endswith("last 0.850 / 0.800")  # reward, accuracy
    names = [line.split("│")[0].strip() for line in pair if "│" in line]
    assert "reward" in names and "accuracy" in names  # each series' band is named: one legend
    assert len(pair) == 1 + 2 * 3 + 1 and pair[-1].strip().startswith("step 1")  # one shared step axis


def test_turns_and_tool_calls_are_charted_for_a_job_with_an_environment_only() -> None:
    plain = make_metrics(RISING)
    for i, p in enumerate(plain.series):
        p.turns_mean, p.tool_calls = 1.0 + i / 10, 3 * i  # reported, but the job has no environment
    assert "turns_tools" not in [c.key for c in jobs_view.charts_of(plain)]
    plain.has_episodes = True
    charts = jobs_view.charts_of(plain)
    assert (charts[-1].key, charts[-1].title, [s.key for s in charts[-1].series]) == (
        "turns_tools", "Turns & tool calls", ["turns", "tool_calls"])
    assert charts[-1].series[1].values[-1] == 3 * (len(RISING) - 1)
    assert "Turns & tool calls" in jobs_view.render(plain)


def test_chart_has_y_range_labels_and_handles_one_step() -> None:
    lines = jobs_view.chart_lines(jobs_view.series_of(make_metrics(RISING))[1], width=38)
    assert all(len(line) == 38 for line in lines)
    assert lines[1].strip().startswith("0.800┤") and lines[-2].strip().startswith("0.100┤")
    one = jobs_view.render(make_metrics([0.4]))
    assert "0.400┤" in one and "step 1" in one


@pytest.mark.parametrize("unicode", [True, False])
@pytest.mark.parametrize("steps", [1, 2, 12])
def test_every_band_of_a_chart_is_named_also_when_its_series_is_flat(unicode: bool, steps: int) -> None:
    """A flat series' value label sits on the row of its line; its name goes on another row of its
    band, so a chart of several series keeps every key (short jobs, constant components)."""
    chart = jobs_view.Chart("reward_components", "Reward components", (
        jobs_view.Series("component:gsm8k", "gsm8k", list(range(1, steps + 1)), RISING[:steps], "gsm8k"),
        jobs_view.Series("component:length", "length", list(range(1, steps + 1)), [0.5] * steps, "length")))
    lines = jobs_view.chart_lines(chart, width=38, unicode=unicode)
    axis = "│┤" if unicode else "|+"
    labels = [re.split(f"[{axis}]", line)[0].strip() for line in lines[1:-1]]
    assert "gsm8k" in labels and "length" in labels
    assert "0.500" in labels  # the flat band keeps its value too


def test_supports_unicode_follows_the_stream_encoding() -> None:
    class Stream:
        def __init__(self, encoding: str | None) -> None:
            self.encoding = encoding

    assert jobs_view.supports_unicode(Stream("UTF-8")) and jobs_view.supports_unicode(Stream("utf8"))
    assert not jobs_view.supports_unicode(Stream("ascii"))
    assert not jobs_view.supports_unicode(Stream(None))
    assert not jobs_view.supports_unicode(Stream("no-such-codec"))


# ---------------------------------------------------------------- the CLI


def test_export_format_names_the_allowed_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["jobs", "export", "job-1", "--format", "xml"]) == 2
    err = capsys.readouterr().err
    assert "--format" in err and "invalid choice: 'xml'" in err and "csv" in err and "jsonl" in err


def test_download_needs_an_output_folder(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["jobs", "download", "job-1"]) == 2
    assert "-o/--output" in capsys.readouterr().err


def test_new_commands_parse() -> None:
    parser = cli.build_parser()
    args = parser.parse_args(["jobs", "report", "j1"])
    assert (args.jobs_command, args.id, args.output) == ("report", "j1", None)
    args = parser.parse_args(["jobs", "merge", "j1", "-o", "out", "--address", "h:1"])
    assert (args.output, args.address) == ("out", "h:1")
    args = parser.parse_args(["jobs", "export", "j1"])
    assert args.format == "csv" and args.output is None
    args = parser.parse_args(["jobs", "export", "j1", "--format", "jsonl", "-o", "h.jsonl"])
    assert (args.format, args.output) == ("jsonl", "h.jsonl")


def full_job() -> C.Job:
    """A finished job with everything `rlvr jobs show` prints at its longest: times on two days, an
    error, a deep adapter path, the default batch-size warning."""
    job = C.Job(id="job-1", status=C.JOB_STATUS_COMPLETED, current_step=12, total_steps=12,
                worker="trainer-worker-with-a-long-name.cluster.internal:50052")
    job.spec.name = "rising-run"
    job.summary.method, job.summary.model = "RLVR (GRPO)", "/models/" + "very-long-model-folder-name/" * 4
    job.summary.reward, job.summary.backend = "Math Pairs (synthetic)", "vLLM (rollout server)"
    job.created_at.FromSeconds(1_796_000_000)
    job.started_at.FromSeconds(1_796_000_030)
    job.finished_at.FromSeconds(1_796_090_000)
    job.error = "the job process exited with code 1 without a result: RuntimeError: " + "x" * 150
    job.adapter.name, job.adapter.version = "job-1", 12
    job.adapter.path = "/srv/rlvr/artifacts/" + "deeply/nested/" * 8 + "jobs/job-1/adapter"
    job.warnings.append("grpo.batch_size 4 rounded up to 8, a multiple of grpo.group_size 8")
    return job


def test_the_job_head_fits_80_columns() -> None:
    for unicode in (True, False):
        lines = jobs_view.job_lines(full_job(), width=80, unicode=unicode)
        assert max(len(line) for line in lines) <= 80, lines
        text = "\n".join(lines)
        assert "created 2026-" in text and "finished 2026-" in text  # the date again where it changes
        assert "error: the job process exited" in text and "adapter job-1 v12" in text
        assert ("…" in text) == unicode and "/srv/rlvr/" in text and text.rstrip().endswith("adapter")
    summary = train_cmd.summary_lines(full_job().summary, list(full_job().warnings))
    assert max(len(line) for line in summary) <= 80 and summary[-1].startswith("warning: grpo.batch_size 4")
    long = train_cmd.summary_lines(full_job().summary, ["x " * 60])
    assert max(len(line) for line in long) <= 80 and long[-1].startswith("  ")  # a long warning wraps


def test_supports_unicode_needs_a_utf8_locale_too() -> None:
    class Stream:
        encoding = "utf-8"

    for env, expected in [({"LANG": "C"}, False), ({"LANG": "POSIX"}, False), ({"LANG": "en_US"}, False),
                          ({"LANG": "en_US.ISO-8859-1"}, False), ({"LANG": "C.UTF-8"}, True),
                          ({"LANG": "en_US.utf8"}, True), ({"LC_ALL": "C", "LANG": "en_US.UTF-8"}, False),
                          ({"LC_CTYPE": "de_DE.UTF-8@euro", "LANG": "C"}, True), ({}, True),
                          ({"LC_CTYPE": "C.UTF-8", "LANG": "C"}, False),  # Python's own coercion of LANG=C
                          ({"LC_CTYPE": "C.UTF-8"}, False), ({"LC_CTYPE": "C.UTF-8", "LANG": "en_GB.UTF-8"}, True)]:
        assert jobs_view.supports_unicode(Stream(), env) is expected, env


@pytest.mark.parametrize(("lang", "unicode"), [("C", False), ("C.UTF-8", True)])
def test_jobs_show_in_a_real_terminal_follows_the_locale(scheduler, lang: str, unicode: bool) -> None:
    """`rlvr jobs show` in a pseudo-terminal 80 columns wide: ASCII only under LANG=C (where Python
    itself still writes UTF-8), the Unicode card under a UTF-8 locale; every line fits."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import sys
    import termios

    address, _ = scheduler
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 80, 0, 0))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LC_")} | {"LANG": lang}
    proc = subprocess.Popen([sys.executable, "-m", "rlvr.clients.cli", "jobs", "show", "job-1", "--address", address],
                            stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=60) == 0, b"".join(chunks).decode(errors="replace")
    out = b"".join(chunks)
    assert b"Accuracy Trend" in out and b"job job-1: COMPLETED" in out
    assert out.isascii() is not unicode, out[:400]
    lines = out.decode().replace("\r\n", "\n").splitlines()
    assert max(len(line) for line in lines) <= 80, [line for line in lines if len(line) > 80]


class FakeScheduler(scheduler_pb2_grpc.SchedulerServiceServicer):
    """One known job, "job-1", with metrics, an adapter, a merge and a history."""

    metrics_code: grpc.StatusCode | None = None
    job: C.Job | None = None  # what GetJob answers for "job-1" (default: full_job())

    def _known(self, job_id: str, context: grpc.ServicerContext) -> None:
        if job_id != "job-1":
            context.abort(grpc.StatusCode.NOT_FOUND, f"job {job_id!r} not found")

    def GetJob(self, request, context):
        self._known(request.id, context)
        return self.job if self.job is not None else full_job()

    def GetJobMetrics(self, request, context):
        if self.metrics_code is not None:
            context.abort(self.metrics_code, "metrics are not served here")
        self._known(request.job_id, context)
        return make_metrics(RISING, kl=True)

    def DownloadAdapter(self, request, context):
        self._known(request.job_id, context)
        for name, data in (("adapter_config.json", b'{"r": 8}'), ("adapter_model.safetensors", b"\0" * 64)):
            yield C.FileChunk(path=name, offset=0, data=data, file_size=len(data), last=True)

    def MergeModel(self, request, context):
        self._known(request.job_id, context)
        yield S.MergeModelProgress(stage="loading base model", fraction=0.1)
        yield S.MergeModelProgress(stage="merging adapter", fraction=0.5)
        yield S.MergeModelProgress(stage="saving", fraction=1.0, done=True, path="/srv/merged/job-1",
                                   size_bytes=3 * 1024 * 1024)

    def DownloadMergedModel(self, request, context):
        self._known(request.job_id, context)
        yield C.FileChunk(path="config.json", offset=0, data=b"{}", file_size=2, last=True)
        yield C.FileChunk(path="model.safetensors", offset=0, data=b"\1" * 100, file_size=100, last=True)

    def ExportHistory(self, request, context):
        self._known(request.job_id, context)
        if request.format == S.EXPORT_FORMAT_JSONL:
            rows = "".join(json.dumps({"step": i, "reward_mean": 0.1 * i}) + "\n" for i in (1, 2))
            return S.ExportHistoryResponse(content=rows.encode(), content_type="application/x-ndjson", rows=2,
                                           filename="job-1.jsonl")
        return S.ExportHistoryResponse(content=b"step,reward_mean\n1,0.1\n2,0.2\n", content_type="text/csv",
                                       rows=2, filename="job-1.csv")


@pytest.fixture
def scheduler() -> Iterator[tuple[str, FakeScheduler]]:
    fake = FakeScheduler()
    with serving(fake) as address:
        yield address, fake


def test_show_prints_the_job_then_the_rl_metrics(scheduler, capfd) -> None:
    address, fake = scheduler
    code, out, err = run(capfd, "jobs", "show", "job-1", "--address", address)
    assert code == 0, err
    assert out.index("Training Summary") < out.index("RL Metrics") < out.index("Accuracy Trend")
    assert "rising" in out and "Best Accuracy" in out and "KL divergence" in out  # KL logged alone here
    fake.metrics_code = grpc.StatusCode.UNIMPLEMENTED
    code, out, err = run(capfd, "jobs", "show", "job-1", "--address", address)
    assert code == 0 and "Training Summary" in out
    assert "warning: RL Metrics unavailable: UNIMPLEMENTED: metrics are not served here" in err


def test_show_says_why_a_queued_job_waits(scheduler, capfd) -> None:
    address, fake = scheduler
    reason = ("no trainer worker can run it: needs 2 GPU(s) (gpu_selection 0,1), worker trainer-0 has 0; "
              "needs 2 GPU(s) (gpu_selection 0,1), worker trainer-1 has 1 (0)")
    fake.job = C.Job(id="job-1", status=C.JOB_STATUS_QUEUED, total_steps=12, queue_reason=reason)
    fake.metrics_code = grpc.StatusCode.UNIMPLEMENTED
    code, out, err = run(capfd, "jobs", "show", "job-1", "--address", address)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("job job-1: QUEUED")
    start = next(i for i, line in enumerate(lines) if line.startswith("queued: no trainer worker can run it:"))
    shown = " ".join(line.strip() for line in lines[start:start + 4])
    assert reason in shown and all(len(line) <= 80 for line in lines[start:start + 4])
    fake.job.status = C.JOB_STATUS_RUNNING  # a reason left over is not a queued job's: not shown
    code, out, _ = run(capfd, "jobs", "show", "job-1", "--address", address)
    assert code == 0 and "queued:" not in out


def test_report_writes_html_and_pngs(scheduler, capfd, tmp_path: Path) -> None:
    address, _ = scheduler
    code, out, err = run(capfd, "jobs", "report", "job-1", "--address", address, "-o", str(tmp_path / "r"))
    assert code == 0, err
    path = Path(out.strip())
    assert path == tmp_path / "r" / "report.html" and path.is_file()
    page = path.read_text(encoding="utf-8")
    assert "rising-run" in page and "Accuracy Trend" in page and page.count("data:image/png;base64,") == 4
    assert sorted(p.name for p in path.parent.glob("*.png")) == [
        "completion_length.png", "kl_entropy.png", "loss.png", "reward_accuracy.png"]


def test_download_writes_the_adapter(scheduler, capfd, tmp_path: Path) -> None:
    address, _ = scheduler
    code, out, err = run(capfd, "jobs", "download", "job-1", "-o", str(tmp_path / "a"), "--address", address)
    assert code == 0, err
    assert (tmp_path / "a" / "adapter_config.json").read_bytes() == b'{"r": 8}'
    assert (tmp_path / "a" / "adapter_model.safetensors").stat().st_size == 64
    assert "PeftModel.from_pretrained" in out


def test_merge_shows_progress_and_downloads(scheduler, capfd, tmp_path: Path) -> None:
    address, _ = scheduler
    code, out, err = run(capfd, "jobs", "merge", "job-1", "-o", str(tmp_path / "m"), "--address", address)
    assert code == 0, err
    assert "merging: loading base model" in out and "merging: saving" in out and "100%" in out
    assert "/srv/merged/job-1" in out and "3.0 MiB" in out
    assert "downloaded 2 file(s)" in out
    assert (tmp_path / "m" / "model.safetensors").stat().st_size == 100
    code, out, err = run(capfd, "jobs", "merge", "job-1", "--address", address)
    assert code == 0 and "downloaded" not in out


def test_export_to_stdout_file_and_folder(scheduler, capfd, tmp_path: Path) -> None:
    address, _ = scheduler
    code, out, err = run(capfd, "jobs", "export", "job-1", "--address", address)
    assert code == 0 and out == "step,reward_mean\n1,0.1\n2,0.2\n"
    target = tmp_path / "h.jsonl"
    code, out, err = run(capfd, "jobs", "export", "job-1", "--format", "jsonl", "-o", str(target),
                         "--address", address)
    assert code == 0 and "wrote 2 row(s)" in out
    assert [json.loads(line)["step"] for line in target.read_text().splitlines()] == [1, 2]
    code, out, err = run(capfd, "jobs", "export", "job-1", "-o", str(tmp_path), "--address", address)
    assert code == 0 and (tmp_path / "job-1.csv").is_file()


@pytest.mark.parametrize("command", [["report"], ["download", "-o", "DIR"], ["merge"], ["export"]])
def test_unknown_job_is_one_error_line(scheduler, capfd, tmp_path: Path, command: list[str]) -> None:
    address, _ = scheduler
    argv = ["jobs", command[0], "nosuchjob", *[str(tmp_path / "x") if a == "DIR" else a for a in command[1:]]]
    code, out, err = run(capfd, *argv, "--address", address)
    assert code == 1
    assert err.strip() == "error: NOT_FOUND: job 'nosuchjob' not found"


def test_a_job_with_several_reward_components_charts_them_in_every_view(tmp_path) -> None:
    """Several rewards (or one with named parts): a "Reward components" chart after the spec's
    charts, one series per component, in the terminal card, the HTML report and the console's PNGs;
    a job with a single reward's single score gets none."""
    from rlvr.clients import report

    metrics = make_metrics(RISING)
    for i, p in enumerate(metrics.series):
        p.reward_components["gsm8k"] = RISING[i]
        p.reward_components["length"] = 0.5
    charts = jobs_view.charts_of(metrics)
    components = charts[-1]
    assert (components.key, components.title) == ("reward_components", "Reward components")
    assert [s.name for s in components.series] == ["gsm8k", "length"]
    assert components.series[1].values == [0.5] * len(RISING)
    text = jobs_view.render(metrics, width=100)
    assert "Reward components" in text and "gsm8k" in text and "length" in text
    png = report.chart_png(components)
    assert png.startswith(b"\x89PNG")
    page = report.write_report(metrics, None, tmp_path).read_text()
    assert "Reward components" in page
    single = make_metrics(RISING)
    for p in single.series:
        p.reward_components["gsm8k"] = p.accuracy
    assert [c.key for c in jobs_view.charts_of(single)][-1] != "reward_components"
