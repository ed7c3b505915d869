"""A training loop in the terminal (clients/views/loops.py) as pure functions of hand-built `Loop`
messages: the header, the score bars and the round rows within 80 columns, the ASCII fallback, the
BEST badge and the delta arrows exactly as the message says, running / failed / stopped loops, the
dry run's settings beside the Training Summary, and the export rows (CSV and JSONL round trips)."""

from __future__ import annotations

import csv
import io
import json

import pytest

from rlvr.clients.views import loops as V
from rlvr.v1 import scheduler_pb2 as S

# ---------------------------------------------------------------- hand-built loops

SCORES = [34.0, 41.5, 40.0, 52.0, 58.5, 63.0, 70.0]


def make_loop(scores: list[float] = SCORES, *, status: int = S.LOOP_STATUS_TARGET_REACHED, target: float = 70.0,
              baseline: float | None = 30.2, max_rounds: int = 8, threshold: float = 1.5, best: int | None = None,
              loop_id: str = "3f9c1a2b4d5e", name: str = "math-pairs to 70%",
              message: str = "target 70% reached in round 7 (70.0%)") -> S.Loop:
    """A loop whose rounds scored `scores`, with the fields the scheduler computes filled in as the
    contract defines them (delta against the previous scored round, BEST = the highest score with
    ties to the earlier round unless `best` says otherwise, real gain against the best before it)."""
    loop = S.Loop(id=loop_id, status=status, message=message, elapsed_seconds=4 * 3600 + 23 * 60,
                  training_seconds=3 * 3600 + 50 * 60, benchmarking_seconds=25 * 60)
    spec = loop.spec
    spec.name, spec.benchmark, spec.score_column, spec.target = name, "rlvr-math-pairs-heldout", "accuracy", target
    spec.max_rounds, spec.give_up_after, spec.reclaim_storage = max_rounds, 2, True
    spec.job.base_model = "rlvr-tiny"
    if baseline is not None:
        loop.baseline_score = baseline
    best_index = best or (scores.index(max(scores)) + 1 if scores else 0)
    best_so_far = baseline if baseline is not None else None
    for i, score in enumerate(scores, 1):
        r = loop.rounds.add(index=i, job_id=f"job{i:03d}abcdef", evaluation_id=f"ev{i}", status=S.ROUND_STATUS_SCORED,
                            score=score, best=i == best_index, duration_seconds=2200 + 37 * i,
                            training_seconds=2000, benchmarking_seconds=180, gain_threshold=threshold,
                            base_round=0 if i == 1 else i - 1, current_step=100, total_steps=100)
        r.adapter.name, r.adapter.version, r.adapter.path = f"job-job{i:03d}abcdef", 100, f"/srv/a/{i}"
        r.started_at.FromSeconds(1_700_000_000 + 2400 * i)
        r.finished_at.FromSeconds(1_700_000_000 + 2400 * i + 2200)
        if i > 1:
            r.delta = score - scores[i - 2]
        r.real_gain = best_so_far is None or score > best_so_far + threshold
        best_so_far = score if best_so_far is None else max(best_so_far, score)
    if scores:
        loop.best_round = best_index
        loop.best_score = scores[best_index - 1]
        loop.gain_over_first = scores[best_index - 1] - scores[0]
    s = loop.summary
    s.method, s.model, s.reward, s.backend = "RLVR (GRPO)", "rlvr-tiny", "Math Pairs (synthetic)", "vLLM (colocate)"
    s.group_size, s.max_completion, s.lora_rank, s.learn_rate, s.max_steps, s.batch_size = 8, 256, 8, 1e-6, 100, 8
    s.lora_alpha, s.loss_type, s.quantization, s.gpu_selection = 16, "grpo", "Full", "auto"
    return loop


def running_loop(state: int = S.ROUND_STATUS_TRAINING, status: int = S.LOOP_STATUS_TRAINING) -> S.Loop:
    """Three scored rounds (R2 BEST) and a fourth at step 30 of 100."""
    loop = make_loop(SCORES[:3], status=status, message="round 4: training on top of R2 (step 30/100)")
    loop.rounds.add(index=4, job_id="job004abcdef", status=state, current_step=30, total_steps=100,
                    duration_seconds=700, base_round=2)
    return loop


def failed_loop() -> S.Loop:
    loop = running_loop(S.ROUND_STATUS_FAILED, S.LOOP_STATUS_FAILED)
    cause = ("trainer worker 127.0.0.1:50061 lost: CUDA error: an illegal memory access was encountered "
             "(see the job's log for the whole traceback)")
    loop.rounds[-1].error = cause
    loop.error, loop.message = f"round 4: {cause}", "round 4 failed"
    return loop


def stopped_loop() -> S.Loop:
    loop = running_loop(S.ROUND_STATUS_STOPPED, S.LOOP_STATUS_STOPPED)
    loop.message = "stopped during round 4"
    return loop


def row(text: str, label: str) -> str:
    """The round row of `label` ("R3") in the Rounds list."""
    rounds = text[text.index("\nRounds\n"):]
    return next(line for line in rounds.splitlines() if line.startswith(f"  {label} "))


def bar(text: str, label: str) -> str:
    """The chart line of `label` ("R3", "base")."""
    chart = text[text.index("Score per round"):text.index("\nRounds\n")]
    return next(line for line in chart.splitlines() if line.startswith(f"  {label} "))


ALL_LOOPS = [make_loop(), running_loop(), failed_loop(), stopped_loop(), make_loop([], status=S.LOOP_STATUS_QUEUED,
                                                                                   baseline=None, message="")]


# ---------------------------------------------------------------- the view


@pytest.mark.parametrize("loop", ALL_LOOPS, ids=["finished", "running", "failed", "stopped", "queued"])
@pytest.mark.parametrize("width", [80, 60])
def test_every_line_fits_and_ascii_is_ascii(loop: S.Loop, width: int) -> None:
    for unicode in (True, False):
        text = V.render(loop, width=width, unicode=unicode)
        assert max(len(line) for line in text.splitlines()) <= width, text
    V.render(loop, width=width, unicode=False).encode("ascii")


def test_finished_loop_header_shows_the_spec_stats() -> None:
    text = V.render(make_loop())
    lines = text.splitlines()
    assert lines[0].startswith("math-pairs to 70% · loop 3f9c1a2b4d5e") and lines[0].endswith("Target reached")
    assert lines[1] == "target 70% reached in round 7 (70.0%)"
    for fragment in ("Best score  70.0% in R7, +36.0 pts over R1", "Target      70%", "Rounds      7 of 8",
                     "Baseline    30.2% (base model)",
                     "Elapsed     4h 23m: training 3h 50m, benchmarking 25m, other 8m",
                     "Benchmark   rlvr-math-pairs-heldout, accuracy, all questions"):
        assert fragment in text, fragment
    assert "so far" not in text


def test_status_words_are_the_specs() -> None:
    assert [V.status_word(s) for s in range(1, 9)] == [
        "Queued", "Training", "Benchmarking", "Target reached", "Rounds spent", "Plateaued", "Failed", "Stopped"]
    assert V.status_word(S.LOOP_STATUS_UNSPECIFIED) == "Unknown"
    assert [V.is_final(s) for s in range(9)] == [False] * 4 + [True] * 5


def test_bars_one_per_round_plus_baseline_best_solid_and_target_marked() -> None:
    loop = make_loop()
    for unicode, (solid, other, base, mark) in ((True, V.BARS[True]), (False, V.BARS[False])):
        text = V.render(loop, unicode=unicode)
        assert bar(text, "base").count(base) > 0 and bar(text, "base").rstrip().endswith("30.2%")
        for r in loop.rounds:
            line = bar(text, f"R{r.index}")
            assert line.rstrip().endswith(f"{r.score:.1f}%" + (" BEST" if r.best else ""))
            assert (solid in line) == r.best and (other in line) != r.best
        # bars grow with the score; the scale is 0% to 80% (the next ten above the 70% target)
        lengths = [bar(text, f"R{i}").count(solid) + bar(text, f"R{i}").count(other) for i in range(1, 8)]
        assert lengths == [round(score / 80 * 60) for score in SCORES]  # 60 columns of bars at width 80
        assert f"{mark} target 70%" in text and text.count(mark) >= 7
        assert "80%" in text.splitlines()[text.splitlines().index(bar(text, "R7")) + 1]


def test_round_rows_job_ids_durations_scores_and_arrows_from_the_message() -> None:
    loop = make_loop([34.0, 41.5, 40.0, 40.0, 52.0], status=S.LOOP_STATUS_ROUNDS_SPENT, max_rounds=5,
                     message="5 of 5 rounds run; best 52.0% in round 5")
    for unicode, (up, down, flat) in ((True, ("↑", "↓", "→")), (False, ("^", "v", "->"))):
        text = V.render(loop, unicode=unicode)
        r1 = row(text, "R1")
        assert "job001abcdef" in r1 and "37m" in r1 and "34.0%" in r1
        assert not any(a in r1.split("34.0%")[1] for a in (up, down, flat))  # no delta: no arrow
        assert f"{up} +7.5" in row(text, "R2")
        assert f"{down} -1.5" in row(text, "R3")
        assert f"{flat} +0.0" in row(text, "R4")
        assert f"{up} +12.0" in row(text, "R5")
    # the arrow follows Round.delta, not a recomputation from the scores
    loop.rounds[1].delta = -2.0
    assert "↓ -2.0" in row(V.render(loop), "R2")
    loop.rounds[1].ClearField("delta")
    assert "↑" not in row(V.render(loop), "R2") and "↓" not in row(V.render(loop), "R2")


def test_best_badge_goes_where_the_message_puts_it() -> None:
    # a tie: R2 and R4 both 41.5; the scheduler gives the badge to the earlier round
    loop = make_loop([34.0, 41.5, 40.0, 41.5], status=S.LOOP_STATUS_PLATEAUED, best=2, message="plateaued")
    text = V.render(loop)
    assert "BEST" in row(text, "R2") and "BEST" not in row(text, "R4")
    assert [line for line in text.splitlines() if "BEST" in line] == [bar(text, "R2"), row(text, "R2")]
    assert "no real gain (needs > 1.5 pts)" in row(text, "R4") and "no real gain" in row(text, "R3")
    assert "no real gain" not in row(text, "R2")
    assert "Plateaued" in text.splitlines()[0]


def test_running_loop_shows_the_step_and_elapsed_so_far() -> None:
    text = V.render(running_loop())
    assert text.splitlines()[0].endswith("Training")
    assert "round 4: training on top of R2 (step 30/100)" in text
    assert "Rounds      4 of 8" in text and "4h 23m so far" in text
    assert "(training step 30/100)" in bar(text, "R4")
    r4 = row(text, "R4")
    assert "job004abcdef" in r4 and "11m" in r4 and r4.rstrip().endswith("training step 30/100")
    assert "BEST" in row(text, "R2") and "BEST" not in r4
    line = V.progress_line(running_loop())
    assert line.startswith("Training  rounds 4/8  best 41.5% (R2)  R4 training step 30/100")


def test_failed_loop_shows_the_error_wrapped_under_the_round() -> None:
    text = V.render(failed_loop())
    lines = text.splitlines()
    assert lines[0].endswith("Failed") and lines[1] == "round 4 failed"
    assert lines[2].startswith("error: round 4: trainer worker 127.0.0.1:50061 lost")
    r4 = row(text, "R4")
    assert r4.rstrip().endswith("failed at step 30/100")
    after = lines[lines.index(r4) + 1]
    assert after.startswith("      error: trainer worker") and "whole traceback" in text.split(r4)[1]
    assert "so far" not in text  # a failed loop has ended


def test_stopped_and_queued_loops() -> None:
    text = V.render(stopped_loop())
    assert text.splitlines()[0].endswith("Stopped") and row(text, "R4").rstrip().endswith("stopped at step 30/100")
    empty = make_loop([], status=S.LOOP_STATUS_BENCHMARKING, baseline=None, message="scoring the base model")
    text = V.render(empty)
    assert "no round scored yet" in text and "(no round started yet)" in text and "Rounds      0 of 8" in text
    assert "(nothing scored yet)" in text and "Elapsed     4h 23m so far" in text


def test_durations_and_chart_scale() -> None:
    assert [V.duration(s) for s in (0, 45, 485, 2237, 15780, 180000)] == ["0s", "45s", "8m 05s", "37m", "4h 23m",
                                                                         "2d 02h"]
    assert V.chart_scale(make_loop()) == 80.0
    assert V.chart_scale(make_loop([12.0], target=35.0, baseline=10.0)) == 40.0
    assert V.chart_scale(make_loop([99.5], target=100.0)) == 100.0


# ---------------------------------------------------------------- the dry run's plan


def test_plan_puts_the_settings_beside_the_summary_when_they_fit() -> None:
    loop = make_loop()
    warnings = ["grpo.batch_size 4 rounded up to 8, a multiple of grpo.group_size 8"]
    lines = V.plan_lines(loop.spec, loop.summary, warnings)
    assert lines[0] == "Loop 'math-pairs to 70%'"
    assert max(len(line) for line in lines) <= 80
    head = next(line for line in lines if line.startswith("Training Summary"))
    assert head.endswith("Loop Settings")
    beside = next(line for line in lines if "Method" in line)
    assert "RLVR (GRPO)" in beside and "Benchmark     rlvr-math-pairs-heldout" in beside
    text = "\n".join(lines)
    for fragment in ("Target        70%", "Max Rounds    8", "Give Up After 2 rounds", "Min Gain      1 standard error",
                     "Reclaim       yes, between rounds", "Questions     all", "LoRA Rank      8"):
        assert fragment in text, fragment
    assert text.endswith("warning: grpo.batch_size 4 rounded up to 8, a multiple of grpo.group_size 8")
    narrow = V.plan_lines(loop.spec, loop.summary, warnings, width=60)
    assert max(len(line) for line in narrow) <= 60
    assert narrow.index("Loop Settings") > narrow.index("  Quantization   Full")  # one under the other


def test_unresolved_settings_show_the_server_defaults() -> None:
    spec = S.LoopSpec(name="x", benchmark="gsm8k", target=35.5, benchmark_limit=200, min_gain=0.5,
                      reclaim_storage=False)
    assert dict(V.settings_rows(spec)) == {
        "Benchmark": "gsm8k", "Score Column": "benchmark's default", "Target": "35.5%", "Max Rounds": "default (8)",
        "Give Up After": "default (2 rounds)", "Min Gain": "0.5 pts", "Reclaim": "no", "Questions": "200"}


# ---------------------------------------------------------------- export rows


def test_export_rows_round_trip_csv_and_jsonl() -> None:
    loop = failed_loop()
    rows = V.export_rows(loop)
    assert [r["round"] for r in rows] == [1, 2, 3, 4] and list(rows[0]) == V.EXPORT_COLUMNS
    assert rows[0]["delta"] is None and rows[1]["delta"] == pytest.approx(7.5) and rows[1]["best"] is True
    assert rows[3]["score"] is None and rows[3]["status"] == "FAILED" and "illegal memory" in rows[3]["error"]
    assert rows[0]["started_at"] == "2023-11-14T22:53:20Z" and rows[3]["started_at"] is None
    assert rows[0]["adapter_name"] == "job-job001abcdef" and rows[0]["adapter_version"] == 100

    jsonl = V.export_text(loop, "jsonl")
    assert [json.loads(line) for line in jsonl.splitlines()] == rows

    text = V.export_text(loop, "csv")
    assert text.splitlines()[0] == ",".join(V.EXPORT_COLUMNS)
    back = list(csv.DictReader(io.StringIO(text)))
    expected = [{k: "" if v is None else str(v).lower() if isinstance(v, bool) else str(v) for k, v in r.items()}
                for r in rows]
    assert back == expected
    assert float(back[2]["score"]) == 40.0 and back[3]["score"] == "" and back[1]["best"] == "true"
    with pytest.raises(ValueError, match="csv, jsonl"):
        V.export_text(loop, "xml")
    assert V.export_text(make_loop([]), "csv") == ",".join(V.EXPORT_COLUMNS) + "\n"


def test_list_line_fits_under_its_header() -> None:
    header, line = V.list_header(), V.list_line(make_loop())
    assert line.startswith("3f9c1a2b4d5e  Target reached  7/8      70.0%     70%  4h 23m   math-pairs to 70%")
    assert header.index("STATUS") == line.index("Target") and header.index("NAME") == line.index("math-pairs")


def test_summary_rows_come_from_the_training_summary() -> None:
    from rlvr.clients.views.jobs import summary_rows

    loop = make_loop()
    text = "\n".join(V.settings_lines(loop.spec, loop.summary))
    for label, value in summary_rows(loop.summary):
        assert f"  {label:<14} {value}" in text, label
    assert "Training Summary (each round)" in text and "Loop Settings" in text
