"""`python -m rlvr.tiny eval --diagnose` / `rlvr models inspect` (rlvr/tiny/diagnose.py): the
measures on completions whose answers are known, and the command on a real (test-size) model,
whose greedy accuracy must equal `eval`'s own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.clients import cli
from rlvr.tiny.build import build_tiny_model, evaluate_heldout
from rlvr.tiny.diagnose import chain_parts, majority, summarize


def _score(completion: str, truth: str) -> tuple[float, str | None, float]:
    answer = completion.rsplit("<answer>", 1)[-1].removesuffix("</answer>") if "<answer>" in completion else None
    return float(answer == truth), answer, float(answer is not None)


def chain(a: int, b: int, c: int, d: int, s1: int | None = None, product: int | None = None) -> str:
    s1 = a + b if s1 is None else s1
    s2 = c + d
    z = s1 * s2 if product is None else product
    return f"<think>{a}+{b}={s1} {c}+{d}={s2} {s1}*{s2}={z}</think><answer>{z}</answer>"


def test_the_measures_count_what_they_say() -> None:
    numbers = [(1, 2, 3, 4), (2, 2, 2, 2), (5, 1, 1, 1)]
    truths = ["21", "16", "12"]
    greedy = [chain(1, 2, 3, 4),                   # right
              chain(2, 2, 2, 2, product=15),       # sums right, product wrong
              chain(5, 1, 1, 1, s1=7)]             # first sum wrong
    samples = [[chain(1, 2, 3, 4)] * 4,                                       # all right: no spread
               [chain(2, 2, 2, 2, product=15)] * 3 + [chain(2, 2, 2, 2)],     # right once, not the majority
               [chain(5, 1, 1, 1, s1=7)] * 4]                                 # never right: no spread
    d = summarize("m", "heldout", numbers, truths, greedy, samples, group=2, temperature=0.3, score=_score)
    assert (d.n, d.k, d.greedy) == (3, 4, pytest.approx(1 / 3))
    assert d.pass_at_k == pytest.approx(2 / 3) and d.maj_at_k == pytest.approx(1 / 3)
    assert d.never_right == pytest.approx(1 / 3)
    assert d.zero_spread_groups == pytest.approx(1.0)  # the first 2 of each group agree everywhere
    assert d.chains_written == 1.0 and d.sums_right == pytest.approx(2 / 3)
    assert d.product_right_given_sums == pytest.approx(1 / 2) and d.format == 1.0
    assert "maj@4 - greedy" in d.table() and "+0.0 points" in d.table()


def test_majority_and_chain_parts() -> None:
    assert majority([None, None]) is None and majority(["7", "8", "8"]) == "8"
    assert chain_parts(chain(1, 2, 3, 4), (1, 2, 3, 4)) == (True, True)
    assert chain_parts(chain(1, 2, 3, 4, product=20), (1, 2, 3, 4)) == (True, False)
    assert chain_parts(chain(1, 2, 3, 4), (1, 3, 2, 4)) is None  # a chain for other numbers
    assert chain_parts("<answer>21</answer>", (1, 2, 3, 4)) is None


def test_inspect_on_a_real_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = build_tiny_model(tmp_path / "tiny", size="test", eval_n=16).path
    assert cli.main(["models", "inspect", str(model), "-n", "24", "-k", "4", "--group", "4", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    greedy, n = evaluate_heldout(model, n=24)
    assert (found["n"], found["k"], n) == (24, 4, 24) and found["greedy"] == pytest.approx(greedy)
    assert found["greedy"] <= found["pass_at_k"] and found["maj_at_k"] <= found["pass_at_k"]
    assert found["pass_at_k"] + found["never_right"] == pytest.approx(1.0)
    assert cli.main(["models", "inspect", str(model), "-n", "4", "-k", "4", "--group", "8"]) == 2
    assert "group: 8" in capsys.readouterr().err


def test_a_chain_in_another_order_of_the_same_pairs_counts() -> None:
    assert chain_parts("<think>4+3=7 2+1=3 7*3=21</think>", (1, 2, 3, 4)) == (True, True)
    assert chain_parts("<think>1+3=4 2+4=6 4*6=24</think>", (1, 2, 3, 4)) is None  # other pairs
