"""The loop's rules from stored rows (services/scheduler/loop_rules.py) and the Loop view derived
from them (convert.loop_to_proto): percent scale, real gain, BEST with ties to the earlier round,
deltas against the previous SCORED round, and the stop order target > rounds > plateau."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from rlvr.infra.schema import JobRow, LoopRow, RoundRow
from rlvr.services.scheduler import loop_rules as R
from rlvr.services.scheduler.convert import loop_spec_to_json, loop_to_proto
from rlvr.v1 import scheduler_pb2 as S


def rounds(*scores: float | None, real: tuple[bool, ...] = ()) -> list[RoundRow]:
    out = []
    for i, score in enumerate(scores, start=1):
        status = "SCORED" if score is not None else "FAILED"
        out.append(RoundRow(loop_id="l", index=i, status=status, score=score, job_id=f"j{i}",
                            real_gain=real[i - 1] if i <= len(real) else False))
    return out


def test_percent_is_the_one_conversion() -> None:
    assert R.percent(0.07) == 7.0  # 0.07 * 100 is 7.000000000000001 in binary floating point
    assert R.percent(0.35) >= 35.0  # a typed target of 35% is reached by a score of 35%
    assert R.percent(27 / 500) == 5.4
    assert R.percent(1.0) == 100.0 and R.percent(0.0) == 0.0


def test_real_gain_threshold_is_one_standard_error_unless_set() -> None:
    # p = 0.15, n = 500: sqrt(0.15 * 0.85 / 500) = 0.01597 -> 1.6 points
    assert R.gain_threshold(None, 15.0, 500) == pytest.approx(100 * math.sqrt(0.15 * 0.85 / 500))
    assert R.gain_threshold(None, 15.0, 500) == pytest.approx(1.597, abs=1e-3)
    assert R.gain_threshold(2.5, 15.0, 500) == 2.5  # min_gain wins
    assert R.gain_threshold(None, 0.0, 500) == 0.0  # a zero score: any gain is real
    assert R.gain_threshold(None, 50.0, 0) == 0.0
    assert R.is_real_gain(17.0, 15.0, 1.597) and not R.is_real_gain(16.5, 15.0, 1.597)
    assert not R.is_real_gain(15.0, 15.0, 0.0)  # "more than": an equal score is no gain


def test_the_unset_threshold_is_the_paired_standard_error_when_the_results_pair() -> None:
    from rlvr.paired import compare_columns
    from rlvr.v1 import benchmark_pb2 as B
    from rlvr.v1 import common_pb2 as C

    # 500 questions at 15%; the round fixes 9 and breaks 2: the gain's noise is that of 11 changes
    before = [B.QuestionResult(index=i, accuracy=float(i < 75), strict=i < 75, format=1.0,
                               finish_reason=C.FINISH_REASON_STOP) for i in range(500)]
    after = [B.QuestionResult(index=i, accuracy=float(i < 73 or 75 <= i < 84), strict=i < 75, format=float(i % 2),
                              finish_reason=C.FINISH_REASON_STOP if i else C.FINISH_REASON_LENGTH) for i in range(500)]
    paired = compare_columns("accuracy", before, list(reversed(after)))  # paired by index
    assert paired is not None and (paired.gained, paired.lost) == (9, 2)
    d_mean = 7 / 500
    assert paired.se_points == pytest.approx(100 * math.sqrt((11 / 500 - d_mean ** 2) / 500))
    threshold = R.gain_threshold(None, 15.0, 500, paired.se_points)
    assert threshold == paired.se_points < R.gain_threshold(None, 15.0, 500)  # tighter than the unpaired 1.6
    assert R.is_real_gain(15.0 + paired.gain_points, 15.0, threshold)  # +1.4 points: real once paired
    assert not R.is_real_gain(15.0 + paired.gain_points, 15.0, R.gain_threshold(None, 15.0, 500))
    assert R.gain_threshold(2.5, 15.0, 500, paired.se_points) == 2.5  # min_gain still wins
    assert compare_columns("accuracy_strict", before, after).gain_points == 0.0  # each column its own values
    assert compare_columns("format", before, after).after == 0.5
    assert compare_columns("answered", before, after).lost == 1
    assert compare_columns("accuracy", before, after[:10]) is None  # other questions: no pairing


def test_the_round_a_round_is_paired_with_holds_the_best_before_it() -> None:
    rs = rounds(12.0, 18.0, 18.0, 9.0)
    assert R.best_before_round(rs, 1, 10.0) is None  # the baseline
    assert R.best_before_round(rs, 2, 12.5) is None  # the baseline beats R1
    assert R.best_before_round(rs, 2, 10.0).index == 1
    assert R.best_before_round(rs, 4, 10.0).index == 2  # a tie goes to the earlier round
    assert R.best_before_round(rs, 4, 18.0) is None  # and a tie with the baseline to the baseline


def test_best_round_ties_go_to_the_earlier_round() -> None:
    rows = rounds(20.0, 30.0, 30.0, 25.0)
    best = R.best_round(rows)
    assert best is not None and best.index == 2
    assert R.best_round(rounds(None, 10.0, 10.0)).index == 2  # failed rounds are never best
    assert R.best_round([]) is None
    assert R.best_round(rounds(None)) is None


def test_deltas_are_against_the_previous_scored_round() -> None:
    rows = rounds(20.0, None, 26.5, 26.5, 21.0)
    assert R.deltas(rows) == {3: 6.5, 4: 0.0, 5: -5.5}  # R3 against R1: R2 has no score


def test_best_before_includes_the_baseline() -> None:
    rows = rounds(20.0, 30.0, 25.0)
    assert R.best_before(22.0, rows, 1) == 22.0
    assert R.best_before(22.0, rows, 3) == 30.0
    assert R.best_before(35.0, rows, 3) == 35.0


@pytest.mark.parametrize(
    ("scores", "real", "kw", "status"),
    [
        ((10.0,), (True,), {"target": 10.0, "max_rounds": 1, "give_up_after": 1}, "TARGET_REACHED"),
        ((10.0,), (False,), {"target": 50.0, "max_rounds": 1, "give_up_after": 1}, "ROUNDS_SPENT"),
        ((10.0, 10.0), (False, False), {"target": 50.0, "max_rounds": 5, "give_up_after": 2}, "PLATEAUED"),
        ((10.0, 10.0), (True, False), {"target": 50.0, "max_rounds": 5, "give_up_after": 2}, None),
        ((10.0, 12.0, 12.1), (True, True, False), {"target": 50.0, "max_rounds": 5, "give_up_after": 1},
         "PLATEAUED"),
        ((10.0,), (False,), {"target": 50.0, "max_rounds": 5, "give_up_after": 2}, None),
        ((60.0, 10.0), (True, False), {"target": 50.0, "max_rounds": 5, "give_up_after": 1}, "PLATEAUED"),
    ],
)
def test_verdict_order_target_then_rounds_then_plateau(scores, real, kw, status) -> None:
    verdict = R.verdict(rounds(*scores, real=real), **kw)
    assert (verdict.status if verdict else None) == status


def test_round_seed_and_job_name() -> None:
    assert [R.round_seed(7, k) for k in (1, 2, 3)] == [7, 8, 9]
    assert R.round_seed(2**64 - 1, 2) == 0
    assert R.round_job_name("math-pairs to 35%", 3) == "math-pairs to 35% R3"
    assert len(R.round_job_name("x" * 128, 12)) == 128


def test_the_loop_view_from_stored_rows() -> None:
    t0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
    spec = S.LoopSpec(name="l", benchmark="rlvr-math-pairs-heldout", score_column="accuracy", target=35.0,
                      max_rounds=4, give_up_after=2, reclaim_storage=True)
    loop = LoopRow(id="l", name="l", spec_json=loop_spec_to_json(spec), status="TRAINING", created_at=t0,
                   started_at=t0, baseline_score=12.6, baseline_seconds=30.0)
    rows = rounds(20.0, 30.0, 30.0, None)
    rows[3].status = "TRAINING"
    for i, r in enumerate(rows):
        r.started_at = t0 + timedelta(minutes=10 * i)
        r.finished_at = t0 + timedelta(minutes=10 * i + 9) if r.status == "SCORED" else None
        r.training_seconds, r.benchmarking_seconds = 400.0, 60.0
    jobs = {"j4": JobRow(id="j4", status="RUNNING", current_step=3, total_steps=50, started_at=t0 + timedelta(minutes=31)),
            "j2": JobRow(id="j2", status="COMPLETED", adapter_name="job-j2", adapter_version=50, adapter_path="/a/j2")}
    view = loop_to_proto(loop, rows, jobs, now=t0 + timedelta(minutes=35))
    assert [r.best for r in view.rounds] == [False, True, False, False]  # the tie R2 = R3 goes to R2
    assert view.best_round == 2 and view.best_score == 30.0 and view.gain_over_first == 10.0
    assert [r.delta if r.HasField("delta") else None for r in view.rounds] == [None, 10.0, 0.0, None]
    assert not view.rounds[3].HasField("score") and view.rounds[3].current_step == 3
    assert view.rounds[1].adapter.name == "job-j2" and view.rounds[1].duration_seconds == 540.0
    assert view.elapsed_seconds == 35 * 60 and view.baseline_score == 12.6
    assert view.training_seconds == 1600.0 and view.benchmarking_seconds == 30.0 + 4 * 60.0
    assert view.status == S.LOOP_STATUS_TRAINING
