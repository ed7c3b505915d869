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


def test_the_schedule_fires_in_the_order_a_loop_reaches_its_moments() -> None:
    """Walk a loop's states in order: each fault becomes due exactly at its moment, in list order."""
    walk = [chaos.LoopView(status="BENCHMARKING")]
    for r in (1, 2, 3):
        walk += [chaos.LoopView(status="TRAINING", round=r, round_status="TRAINING", step=s) for s in range(0, 9)]
        walk.append(chaos.LoopView(status="BENCHMARKING", round=r, round_status="BENCHMARKING", step=8))
    for kind in ("full", "quick"):
        pending, fired = chaos.schedule(kind), []
        for view in walk:
            if pending and pending[0].due(view):
                fired.append((pending.pop(0).name, str(view)))
        assert not pending, f"{kind}: never due: {[f.name for f in pending]}"
        assert len(fired) == len(chaos.schedule(kind))
    names = [f.name for f in chaos.schedule("full")]
    for needed in ("kill:nats", "nats-outage", "disk-full", "store-drop", "kill:rollout", "kill:job"):
        assert needed in names


@pytest.mark.slow
def test_a_short_chaos_loop_ends_as_the_calm_one(tmp_path: Path) -> None:
    """Two rounds of six steps, the trainer, the rollout server, the scheduler and NATS each killed
    once: the same status, scores, stored metrics and adapters as the undisturbed loop."""
    out = tmp_path / "chaos.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "chaos.py"), "--seeds", "0", "--faults", "quick", "--rounds", "2",
         "--steps", "6", "--eval-n", "50", "--no-disk", "--home", str(tmp_path / "stacks"), "--out", str(out)],
        capture_output=True, text=True, timeout=3000)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    seed = json.loads(out.read_text())["seeds"]["0"]
    assert all(row["same"] for row in seed["compare"]), seed["compare"]
    assert [f["name"] for f in seed["faults"] if f["fired"]] == [f.name for f in chaos.schedule("quick")]
    assert all(f["recovered_s"] is not None for f in seed["faults"]), seed["faults"]
