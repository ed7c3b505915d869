"""A loop's status has one writer (`LoopManager._transition`, loops.py) checked against one table
(services/scheduler/loop_lifecycle.py): the table on its own, a move over a real SQLite store (stored
then published; refused: nothing stored, nothing published), and a read of the scheduler's source
that finds no other place writing a loop's status. No stack, no NATS: the bus is a recorder."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rlvr.infra.schema import LoopRow
from rlvr.infra.store import Store
from rlvr.services.scheduler import loop_lifecycle as L
from rlvr.services.scheduler.convert import loop_status_name
from rlvr.services.scheduler.jobs import JobManager
from rlvr.services.scheduler.loop_lifecycle import LoopTransitionRefused
from rlvr.services.scheduler.loops import LoopManager
from rlvr.v1 import scheduler_pb2 as S

SCHEDULER = Path(__file__).resolve().parents[1] / "services" / "scheduler"
STATUSES = (*L.OPEN, *L.ENDS)


def test_the_table_is_the_loops_lifecycle() -> None:
    """An open loop moves to any other status; an ended one never moves; nothing moves to itself;
    the table spells every LoopStatus of the contract."""
    assert set(L.TABLE) == {loop_status_name(v) for v in S.LoopStatus.values() if v}
    for source in STATUSES:
        for to in STATUSES:
            legal = source in L.OPEN and to != source
            assert (to in L.TABLE[source]) == legal, (source, to)


@pytest.mark.parametrize("end", L.ENDS)
def test_an_ended_loop_never_moves_again(end: str) -> None:
    for to in STATUSES:
        with pytest.raises(LoopTransitionRefused, match=rf"loop l1 has already ended \({end}\): it never moves again "
                                                        rf"\(asked for {to}\)") as e:
            L.check("l1", end, to)
        assert e.value.status == end


def test_a_refusal_names_the_move_and_what_is_allowed() -> None:
    with pytest.raises(LoopTransitionRefused, match="loop l1 cannot move from TRAINING to TRAINING; from TRAINING it "
                                                    "may move to: QUEUED, BENCHMARKING, TARGET_REACHED"):
        L.check("l1", "TRAINING", "TRAINING")
    with pytest.raises(LoopTransitionRefused, match="'DONE' is not a loop status; allowed: QUEUED, TRAINING"):
        L.check("l1", "QUEUED", "DONE")
    L.check("l1", "QUEUED", "BENCHMARKING")  # allowed: no error


class RecordingBus:
    """The event bus as `_publish` uses it: publish only, recorded."""

    def __init__(self) -> None:
        self.published: list[tuple[str, S.LoopStatusEvent, str]] = []

    async def publish(self, subject: str, data: bytes, msg_id: str) -> None:
        self.published.append((subject, S.LoopStatusEvent.FromString(data), msg_id))


def manager(store: Store, bus: RecordingBus, tmp_path: Path) -> LoopManager:
    return LoopManager(store, bus, JobManager(store, None, None),  # type: ignore[arg-type]
                       benchmarks=None, artifact_root=tmp_path)  # type: ignore[arg-type]


async def test_a_legal_move_is_stored_then_published(sqlite_store: Store, tmp_path: Path) -> None:
    bus = RecordingBus()
    loops = manager(sqlite_store, bus, tmp_path)
    loop = sqlite_store.add_loop(LoopRow(name="l", status="QUEUED", spec_json="{}"))
    seen = loops.jobs.generation
    await loops._transition(loop.id, "TRAINING", 1, "round 1: training job j1 on w0:1")
    row = sqlite_store.get_loop(loop.id)
    assert (row.status, row.message, row.finished_at) == ("TRAINING", "round 1: training job j1 on w0:1", None)
    assert loops.jobs.generation > seen  # the watchers are woken
    await loops._transition(loop.id, "FAILED", 1, "failed: boom", error="boom")
    row = sqlite_store.get_loop(loop.id)
    assert (row.status, row.error) == ("FAILED", "boom") and row.finished_at is not None
    assert [(subject, loop_status_name(e.status), e.round, e.message, msg_id) for subject, e, msg_id in bus.published] == [
        (f"rlvr.loops.{loop.id}.status", "TRAINING", 1, "round 1: training job j1 on w0:1", f"{loop.id}:1:TRAINING"),
        (f"rlvr.loops.{loop.id}.status", "FAILED", 1, "failed: boom", f"{loop.id}:1:FAILED"),
    ]


async def test_an_illegal_move_stores_and_publishes_nothing(sqlite_store: Store, tmp_path: Path) -> None:
    bus = RecordingBus()
    loops = manager(sqlite_store, bus, tmp_path)
    loop = sqlite_store.add_loop(LoopRow(name="l", status="TARGET_REACHED", message="target 60% reached",
                                         spec_json="{}"))
    with pytest.raises(LoopTransitionRefused, match="has already ended \\(TARGET_REACHED\\)"):
        await loops._transition(loop.id, "STOPPED", 1, "stopped by request")
    row = sqlite_store.get_loop(loop.id)
    assert (row.status, row.message) == ("TARGET_REACHED", "target 60% reached") and bus.published == []


def _writes_status(call: ast.Call) -> bool:
    """A store call that may write a loop's status: update_loop(..., status=...) or with **fields,
    called or handed to a thread (asyncio.to_thread(store.update_loop, ...))."""
    called = [call.func, *call.args[:1]]
    return any(isinstance(f, ast.Attribute) and f.attr == "update_loop" for f in called) and \
        any(k.arg in ("status", None) for k in call.keywords)


def _publishes_status(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Attribute) and call.func.attr == "_publish"


def test_every_loop_status_write_goes_through_the_transition() -> None:
    """Only `_transition` stores a loop's status or publishes its status event. Besides it: the
    birth of a loop (`_enqueue` publishes the QUEUED it was stored with) and a round's score, which
    `_benchmark` publishes as a SCORED event of the status the loop already has."""
    writers: dict[str, set[str]] = {"status": set(), "event": set()}
    for path in sorted(SCHEDULER.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and _writes_status(node):
                    writers["status"].add(f"{path.name}:{fn.name}")
                if isinstance(node, ast.Call) and _publishes_status(node):
                    writers["event"].add(f"{path.name}:{fn.name}")
    assert writers == {"status": {"loops.py:_transition"},
                       "event": {"loops.py:_transition", "loops.py:_enqueue", "loop_driver.py:_benchmark"}}


def test_a_loop_of_environment_jobs_evaluates_in_the_same_environment() -> None:
    from rlvr.services.scheduler.loop_driver import LoopDriver
    from rlvr.v1 import common_pb2, scheduler_pb2

    spec = scheduler_pb2.LoopSpec(benchmark="math_pairs", job=common_pb2.JobSpec(base_model="rlvr-tiny"))
    assert not LoopDriver._evaluation_request(spec, "baseline").HasField("environment")
    spec.job.environment.key, spec.job.environment.max_turns, spec.job.environment.version = "calculator", 3, "1"
    spec.job.environment.settings["digits"] = "2"
    request = LoopDriver._evaluation_request(spec, "round 1")
    assert (request.environment.key, request.environment.max_turns) == ("calculator", 3)
    assert dict(request.environment.settings) == {"digits": "2"} and request.environment.version == ""
