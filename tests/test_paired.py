"""The paired comparison of two evaluations (rlvr/paired.py, clients/compare.py): McNemar's exact
test on hand-computed cases, the paired standard error against its definition, and the refusals
of evaluations that did not ask the same questions."""

from __future__ import annotations

import math
import random

import pytest

from rlvr.clients.compare import NotComparable, comparable, compare_results
from rlvr.paired import compare, mcnemar_p
from rlvr.v1 import benchmark_pb2 as B


def test_mcnemar_exact_on_hand_computed_splits() -> None:
    # 10 changed questions all one way: 2 * (1/2)^10
    assert mcnemar_p(10, 0) == pytest.approx(2 / 1024) == mcnemar_p(0, 10)
    # 12 changed, 10 gained, 2 lost: 2 * (C(12,0) + C(12,1) + C(12,2)) / 2^12 = 158 / 4096
    assert mcnemar_p(10, 2) == pytest.approx(158 / 4096)
    assert mcnemar_p(5, 5) == 1.0 and mcnemar_p(0, 0) == 1.0  # an even split, or nothing changed


def test_the_gain_is_judged_by_the_questions_that_changed_not_by_each_score() -> None:
    # 500 questions at ~50%: 30 fixed and 28 broken is +0.4 points, noise; 40 fixed and none broken is real
    rng = random.Random(0)
    base = [float(rng.random() < 0.5) for _ in range(500)]
    wrong = [i for i, v in enumerate(base) if v == 0.0]
    right = [i for i, v in enumerate(base) if v == 1.0]

    def flipped(fix: int, lose: int) -> list[float]:
        after = list(base)
        for i in wrong[:fix]:
            after[i] = 1.0
        for i in right[:lose]:
            after[i] = 0.0
        return after

    noise = compare(base, flipped(30, 28))
    assert (noise.gained, noise.lost, noise.test) == (30, 28, "McNemar exact")
    assert noise.gain_points == pytest.approx(0.4) and not noise.real
    assert noise.p_value == pytest.approx(mcnemar_p(30, 28)) and "not distinguishable from noise" in noise.verdict()
    real = compare(base, flipped(40, 0))
    assert real.gain_points == pytest.approx(8.0) and real.real and real.p_text() == "p < 0.001"
    assert real.verdict().startswith("+8.0 points") and real.verdict().endswith("a real gain")
    loss = compare(flipped(40, 0), base)
    assert loss.real and loss.verdict().endswith("a real loss")
    # the standard error of the mean per-question difference: sqrt(var(d) / n)
    d = [a - b for a, b in zip(flipped(30, 28), base, strict=True)]
    mean = sum(d) / 500
    assert noise.se == pytest.approx(math.sqrt((sum(x * x for x in d) / 500 - mean ** 2) / 500))


def test_fractional_scores_use_a_paired_z_test() -> None:
    before = [0.2, 0.4, 0.5, 0.0] * 25
    after = [0.6, 0.8, 0.5, 0.2] * 25
    c = compare(before, after)
    assert c.test == "paired z" and (c.gained, c.lost) == (0, 0)
    assert c.gain_points == pytest.approx(25.0) and c.real
    same = compare(before, before)
    assert same.p_value == 1.0 and not same.real


def test_unpaired_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="same questions"):
        compare([1.0, 0.0], [1.0])
    assert compare([], []).n == 0


def _ev(id_: str, qs: str = "qs-1", status: int = B.EVALUATION_STATUS_COMPLETED, bench: str = "gsm8k"):
    return B.Evaluation(id=id_, question_set=qs, status=status, benchmark=bench)


def test_only_evaluations_of_one_question_set_compare() -> None:
    assert comparable(_ev("a"), _ev("b")) == ""
    assert "different questions" in comparable(_ev("a"), _ev("b", qs="qs-2"))
    assert "RUNNING" in comparable(_ev("a", status=B.EVALUATION_STATUS_RUNNING), _ev("b"))
    assert "of gsm8k" in comparable(_ev("a"), _ev("b", bench="boxed"))
    rows = [B.QuestionResult(index=i, accuracy=float(i % 2)) for i in range(4)]
    assert compare_results(rows, list(reversed(rows))).gain_points == 0.0  # paired by index, not by order
    with pytest.raises(NotComparable):
        compare_results(rows, rows[:3])
