"""bench/chaos.py: a loop under faults must end as the undisturbed loop of the same seed.

The comparison and the fault schedule are checked here in the default run; the short chaos run
itself (a real `rlvr up`, two rounds, four faults) is marked slow and runs in `make test-all`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import chaos  # noqa: E402  (bench/chaos.py)


def _result(steps: int = 3, adapter: bytes = b"A", score: float = 40.0) -> dict:
    from rlvr.v1 import scheduler_pb2 as S

    points = [{"step": s, "loss": 0.1 * s, "reward_mean": 0.5} for s in range(1, steps + 1)]
    return {"status": S.LOOP_STATUS_ROUNDS_SPENT, "baseline": 20.0,
            "rounds": [{"index": 1, "score": score, "status": S.ROUND_STATUS_SCORED, "points": points,
                        "adapter": adapter}]}


def _failed(rows: list[tuple[str, bool, str]]) -> dict[str, str]:
    return {what: detail for what, same, detail in rows if not same}


def test_identical_runs_compare_equal() -> None:
    assert _failed(chaos.compare(_result(), _result(), steps=3)) == {}


def test_a_step_stored_twice_or_lost_is_reported() -> None:
    doubled = _result()
    doubled["rounds"][0]["points"].append(dict(doubled["rounds"][0]["points"][-1]))
    failed = _failed(chaos.compare(_result(), doubled, steps=3))
    assert failed["R1 steps stored once"] == "3 of 3, 1 twice"

    lost = _result()
    del lost["rounds"][0]["points"][1]
    failed = _failed(chaos.compare(_result(), lost, steps=3))
    assert failed["R1 steps stored once"] == "2 of 3, 0 twice"
    assert "R1 metric points" in failed


def test_a_changed_metric_adapter_or_score_is_reported() -> None:
    changed = _result(adapter=b"B", score=41.0)
    changed["rounds"][0]["points"][1]["loss"] = 0.25
    failed = _failed(chaos.compare(_result(), changed, steps=3))
    assert failed["R1 metric points"] == "differ at steps [2]"
    assert failed["R1 adapter bytes"] == "differ"
    assert failed["R1 score"] == "40.0 / 41.0"


def test_the_logprob_gap_is_compared_within_its_tolerance_every_other_column_exactly() -> None:
    calm, chaotic = _result(), _result()
    for point in calm["rounds"][0]["points"] + chaotic["rounds"][0]["points"]:
        point["logprob_gap"] = 5.4e-7
    chaotic["rounds"][0]["points"][2]["logprob_gap"] = 5.4e-7 + 2e-9  # the engine's last bits
    rows = {what: (same, detail) for what, same, detail in chaos.compare(calm, chaotic, steps=3)}
    assert rows["R1 metric points"] == (True, "equal (logprob gap within 2.0e-09)")
    chaotic["rounds"][0]["points"][2]["logprob_gap"] = 5.4e-7 + 2e-7
    assert _failed(chaos.compare(calm, chaotic, steps=3))["R1 metric points"] == "differ at steps [3]"


def _walk(rounds: int = 3, steps: int = 8) -> list[chaos.LoopView]:
    walk = [chaos.LoopView(status="BENCHMARKING")]
    for r in range(1, rounds + 1):
        walk += [chaos.LoopView(status="TRAINING", round=r, round_status="TRAINING", step=s) for s in range(steps + 1)]
        walk.append(chaos.LoopView(status="BENCHMARKING", round=r, round_status="BENCHMARKING", step=steps))
    return walk


def _fire(kind: str, walk: list[chaos.LoopView]) -> list[tuple[chaos.Fault, chaos.LoopView]]:
    pending, fired = chaos.schedule(kind), []
    for view in walk:
        if pending and pending[0].due(view):
            fired.append((pending.pop(0), view))
    assert not pending, f"{kind}: never due: {[f.name for f in pending]}"
    return fired


def test_each_fault_fires_at_its_moment_in_a_loop_seen_at_every_step() -> None:
    for kind in ("full", "quick"):
        assert [(f.name, view.position()) for f, view in _fire(kind, _walk())] == \
            [(f.name, f.moment) for f in chaos.schedule(kind)]
    names = [f.name for f in chaos.schedule("full")]
    for needed in ("kill:nats", "nats-outage", "disk-full", "store-drop", "kill:rollout", "kill:job", "kill:reward"):
        assert needed in names


def test_a_moment_passed_between_two_polls_fires_at_the_next_one() -> None:
    """A quick round (or a poll lost to a restarting scheduler) skips a step: the fault fires late,
    not never."""
    seen_rarely = [v for v in _walk(rounds=2, steps=6) if v.step % 3 == 0 or v.round_status != "TRAINING"]
    fired = {f.where: str(view) for f, view in _fire("quick", seen_rarely)}
    assert fired["R1 step 2"] == "R1 training step 3"
    assert fired["R2 step 2"] == "R2 training step 3"
    assert fired["R1 evaluation"] == "R1 benchmarking"


@pytest.mark.slow
def test_a_short_chaos_loop_ends_as_the_calm_one(tmp_path: Path) -> None:
    """Two rounds of twelve steps, the trainer, the rollout server, the scheduler and NATS each
    killed once: the same status, scores, stored metrics and adapters as the undisturbed loop."""
    out = tmp_path / "chaos.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "chaos.py"), "--seeds", "0", "--faults", "quick", "--rounds", "2",
         "--steps", "12", "--eval-n", "50", "--no-disk", "--home", str(tmp_path / "stacks"), "--out", str(out)],
        capture_output=True, text=True, timeout=3000)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    seed = json.loads(out.read_text())["seeds"]["0"]
    assert all(row["same"] for row in seed["compare"]), seed["compare"]
    assert [f["name"] for f in seed["faults"] if f["fired"]] == [f.name for f in chaos.schedule("quick")]
    assert "kill:nats" in [f["name"] for f in seed["faults"]]
    assert all(f["recovered_s"] is not None for f in seed["faults"]), seed["faults"]
