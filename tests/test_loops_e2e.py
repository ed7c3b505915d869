"""Automated training loops on the real stack: embedded NATS, SQLite, the five services as child
processes (the rollout server on the real vLLM CPU engine), loops created through the public SDK.

The model is `rlvr-tiny-small` (built in seconds): it writes the answer format on every held-out
problem (format 100%) and gets a few percent right, so the scores the loops read are real
benchmark scores, not chosen ones, and the targets below are ones a short loop really reaches
(format >= 90%) or really cannot (accuracy 100%, or a "real gain" of more than 50 points from two
training steps). Rounds train on the transformers backend (the fastest on this machine); every
evaluation generates on vLLM, so a stacked round's adapter is served there as one LoRA module.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from fixtures_stack import SMALL_MODEL as MODEL  # the shared stack's model

from rlvr.v1 import benchmark_pb2 as B
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import scheduler_pb2 as S

pytestmark = pytest.mark.vllm
FINAL = {S.LOOP_STATUS_TARGET_REACHED, S.LOOP_STATUS_ROUNDS_SPENT, S.LOOP_STATUS_PLATEAUED,
         S.LOOP_STATUS_FAILED, S.LOOP_STATUS_STOPPED}


@pytest.fixture(scope="module")
def stack(small_stack) -> tuple[object, object, Path]:  # noqa: ANN001 (tests/fixtures_stack.py)
    shared = small_stack.get()
    return shared.client, shared.running, shared.home


def loop_spec(name: str, *, column: str, target: float, steps: int = 2, limit: int = 64, **fields: object
              ) -> S.LoopSpec:
    spec = S.LoopSpec(name=name, benchmark="rlvr-math-pairs-heldout", score_column=column, target=target,
                      benchmark_limit=limit)
    for key, value in fields.items():
        setattr(spec, key, value)
    job = spec.job
    job.base_model = MODEL
    job.reward.synthetic_prompts = 64
    g = job.grpo
    g.max_steps, g.group_size, g.batch_size, g.max_completion_tokens = steps, 4, 8, 64
    g.lora_rank, g.lora_alpha, g.learning_rate = 4, 128, 1e-5
    job.advanced.generation_backend = C.GENERATION_BACKEND_TRANSFORMERS
    return spec


def start(client, spec: S.LoopSpec) -> S.Loop:  # noqa: ANN001 (the SDK facade)
    resp = client.scheduler.create_loop(S.CreateLoopRequest(spec=spec))
    assert resp.loop.id and resp.loop.status == S.LOOP_STATUS_QUEUED
    return resp.loop


def finish(client, loop_id: str, timeout: float = 600) -> S.Loop:  # noqa: ANN001
    """Follows WatchLoop to the end; the last message has a final status."""
    updates = list(client.scheduler.watch_loop(S.WatchLoopRequest(id=loop_id), timeout=timeout))
    assert updates and updates[-1].status in FINAL, updates[-1] if updates else "no update"
    assert client.scheduler.get_loop(S.GetLoopRequest(id=loop_id)).status == updates[-1].status
    return updates[-1]


def until(client, loop_id: str, pred, timeout: float = 300) -> S.Loop:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while True:
        loop = client.scheduler.get_loop(S.GetLoopRequest(id=loop_id))
        if pred(loop):
            return loop
        assert loop.status not in FINAL, f"ended before the condition: {loop.message} {loop.error}"
        assert time.monotonic() < deadline, f"condition not reached; loop at {S.LoopStatus.Name(loop.status)}"
        time.sleep(0.1)


def job_running(client, loop: S.Loop) -> bool:  # noqa: ANN001
    if not loop.rounds or not loop.rounds[-1].job_id:
        return False
    return client.scheduler.get_job(S.GetJobRequest(id=loop.rounds[-1].job_id)).status == C.JOB_STATUS_RUNNING


def loop_events(client_home: Path, loop_id: str) -> list[S.LoopStatusEvent]:
    """Every LoopStatusEvent the stream holds for the loop, in order (a NATS-only reader)."""
    import asyncio

    from rlvr.infra.events import EventBus
    from rlvr.infra.subjects import loop_status_subject

    state = json.loads((client_home / "stack.json").read_text())
    nats_url = json.loads(Path(state["nats_file"]).read_text())["url"]  # with the stack's NATS password

    async def read() -> list[S.LoopStatusEvent]:
        bus = await EventBus.connect(nats_url, name="test-loop-events")
        events: list[S.LoopStatusEvent] = []
        try:
            async def collect() -> None:
                async for event in bus.watch(loop_status_subject(loop_id), from_start=True):
                    events.append(S.LoopStatusEvent.FromString(event.data))

            with_timeout = asyncio.create_task(collect())
            await asyncio.sleep(2.0)  # the history arrives at once; then nothing more is coming
            with_timeout.cancel()
            await asyncio.gather(with_timeout, return_exceptions=True)
        finally:
            await bus.close()
        return events

    return asyncio.run(read())


def _no_duplicates(events: list[S.LoopStatusEvent]) -> None:
    keys = [(e.round, e.status, e.HasField("score")) for e in events]
    assert len(keys) == len(set(keys)), f"an event was stored twice: {keys}"


def test_a_loop_reaches_its_target(stack) -> None:
    client, _, home = stack
    spec = loop_spec("to 90% format", column="format", target=90.0)
    spec.job.advanced.checkpoint_every = 1  # checkpoints beside the adapter, for reclaim to delete
    loop = finish(client, start(client, spec).id)
    assert loop.status == S.LOOP_STATUS_TARGET_REACHED, loop.message + loop.error
    assert loop.message.startswith("target 90% reached in round 1")
    assert loop.baseline_score >= 90.0 and loop.baseline_evaluation_id  # the base model writes the format
    (r1,) = loop.rounds
    assert r1.status == S.ROUND_STATUS_SCORED and r1.best and r1.score >= 90.0 and r1.base_round == 0
    assert loop.best_round == 1 and loop.best_score == r1.score and loop.gain_over_first == 0.0
    assert r1.training_seconds > 0 and r1.benchmarking_seconds > 0 and r1.duration_seconds >= r1.training_seconds
    assert loop.elapsed_seconds >= loop.training_seconds + loop.benchmarking_seconds - 1e-6
    # The round's job is an ordinary job: `rlvr jobs show` opens it, and its adapter is the round's.
    job = client.scheduler.get_job(S.GetJobRequest(id=r1.job_id))
    assert job.status == C.JOB_STATUS_COMPLETED and job.spec.name == "to 90% format R1"
    assert r1.adapter.name == job.adapter.name and Path(r1.adapter.path, "adapter_model.safetensors").is_file()
    # Reclaim storage (on by default) deleted the round's checkpoints, counted them, kept the adapter.
    checkpoints = Path(r1.adapter.path).parent / "checkpoints"
    assert not checkpoints.exists() and r1.reclaimed_bytes > 2 * Path(r1.adapter.path, "adapter_model.safetensors").stat().st_size
    # Its evaluation is on the leaderboard, labelled with the loop and round, scored as the loop says.
    evaluation = client.benchmark.get_evaluation(B.GetEvaluationRequest(id=r1.evaluation_id))
    assert evaluation.label == f"to 90% format R1 (loop {loop.id})" and evaluation.adapter_name == job.adapter.name
    assert r1.score == pytest.approx(100 * evaluation.scores.format)
    # min_gain unset: the real-gain threshold is one standard error of the gain, paired question by
    # question with the baseline's evaluation (rlvr/paired.py), as `rlvr eval compare` computes it
    from rlvr.clients.compare import results
    from rlvr.paired import compare_columns

    paired = compare_columns("format", list(results(client.benchmark, loop.baseline_evaluation_id)),
                             list(results(client.benchmark, r1.evaluation_id)))
    assert paired is not None and r1.gain_threshold == pytest.approx(paired.se_points, abs=1e-6)
    assert r1.real_gain == (r1.score - loop.baseline_score > r1.gain_threshold)
    events = loop_events(home, loop.id)
    statuses = [(e.round, S.LoopStatus.Name(e.status)) for e in events]
    assert statuses[0] == (0, "LOOP_STATUS_QUEUED") and statuses[-1] == (1, "LOOP_STATUS_TARGET_REACHED")
    assert (0, "LOOP_STATUS_BENCHMARKING") in statuses and (1, "LOOP_STATUS_TRAINING") in statuses
    assert any(e.HasField("score") and e.score == r1.score for e in events)
    _no_duplicates(events)


def test_a_loop_plateaus_and_stacks_each_round_on_the_best(stack) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rlvr.models import resolve_model

    client, _, _ = stack
    spec = loop_spec("plateau", column="accuracy", target=100.0, max_rounds=4, give_up_after=2, min_gain=50.0,
                     reclaim_storage=False)
    spec.job.advanced.checkpoint_every = 1
    loop = finish(client, start(client, spec).id)
    assert loop.status == S.LOOP_STATUS_PLATEAUED, loop.message + loop.error
    assert [r.index for r in loop.rounds] == [1, 2]  # Give Up After 2: two rounds without a real gain
    assert loop.message.startswith("plateaued: no real gain in 2 rounds in a row")
    assert all(not r.real_gain and r.gain_threshold == 50.0 for r in loop.rounds)
    r1, r2 = loop.rounds
    assert r2.base_round == 1  # round 2 trained on top of the best round so far
    for r in (r1, r2):  # reclaim off: what the rounds made beside their adapters survives
        assert r.reclaimed_bytes == 0
        assert sorted(p.name for p in (Path(r.adapter.path).parent / "checkpoints").iterdir()) == ["step-1", "step-2"]
    job2 = client.scheduler.get_job(S.GetJobRequest(id=r2.job_id))
    assert job2.spec.init_adapter.name == r1.adapter.name and job2.spec.advanced.seed == 1  # seed + round - 1
    # Round 2 published ONE adapter on the original base: rank 4 (R1) + 4 (its own), scaling 1.
    config = json.loads(Path(r2.adapter.path, "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (8, 8)
    base = AutoModelForCausalLM.from_pretrained(resolve_model(MODEL))
    PeftModel.from_pretrained(base, r2.adapter.path)
    # ... and the rollout server served it for the round's evaluation (vLLM, one LoRA module).
    evaluation = client.benchmark.get_evaluation(B.GetEvaluationRequest(id=r2.evaluation_id))
    assert evaluation.status == B.EVALUATION_STATUS_COMPLETED and evaluation.adapter_name == r2.adapter.name
    # The deltas and the BEST badge follow the stored scores.
    if r2.score > r1.score:
        assert r2.best and r2.delta == pytest.approx(r2.score - r1.score)
    else:
        assert r1.best and not r2.best and r2.delta == pytest.approx(r2.score - r1.score)


def test_stop_loop_cancels_the_running_round(stack) -> None:
    from rlvr.clients.sdk import RlvrError

    client, _, _ = stack
    loop = start(client, loop_spec("stopped", column="accuracy", target=100.0, steps=500))
    running = until(client, loop.id, lambda lp: job_running(client, lp))
    started = time.monotonic()
    stopped = client.scheduler.stop_loop(S.StopLoopRequest(id=loop.id))
    assert time.monotonic() - started < 30
    assert stopped.status == S.LOOP_STATUS_STOPPED and stopped.message == "stopped by request during round 1"
    assert stopped.rounds[0].status == S.ROUND_STATUS_STOPPED and stopped.baseline_score >= 0
    job = client.scheduler.get_job(S.GetJobRequest(id=running.rounds[0].job_id))
    assert job.status == C.JOB_STATUS_CANCELLED
    with pytest.raises(RlvrError) as e:
        client.scheduler.stop_loop(S.StopLoopRequest(id=loop.id))
    assert e.value.code.name == "FAILED_PRECONDITION" and "already ended (STOPPED)" in e.value.details
    time.sleep(2)  # nothing more happens to a stopped loop
    after = client.scheduler.get_loop(S.GetLoopRequest(id=loop.id))
    assert after.status == S.LOOP_STATUS_STOPPED and len(after.rounds) == 1


def _job_process(job_id: str, missing_ok: bool = False) -> int | None:
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"rlvr.services.trainer.process.job_process" in cmdline and any(job_id.encode() in part for part in cmdline):
            return int(proc.name)
    if missing_ok:
        return None
    raise AssertionError(f"no job process for {job_id}")


def test_a_failing_round_fails_the_loop_with_its_cause(stack) -> None:
    client, _, _ = stack
    loop = start(client, loop_spec("failing", column="accuracy", target=100.0, steps=500))
    running = until(client, loop.id, lambda lp: job_running(client, lp) and lp.rounds[0].current_step >= 1)
    job_id = running.rounds[0].job_id
    # A real fault that does not go away: the round's training process dies each time it runs. A
    # lost trainer is resumed (services/scheduler/dispatch.py MAX_RESUMES), so the job fails only after
    # its resumes are spent, with the cause.
    killed: set[int] = set()
    deadline = time.monotonic() + 300
    while client.scheduler.get_loop(S.GetLoopRequest(id=loop.id)).status not in FINAL:
        assert time.monotonic() < deadline, f"the loop did not end; killed {len(killed)} job processes"
        pid = _job_process(job_id, missing_ok=True)
        if pid is not None and pid not in killed:
            os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        time.sleep(0.1)
    ended = finish(client, loop.id)
    assert ended.status == S.LOOP_STATUS_FAILED and len(killed) == 4  # the first run and 3 resumes
    assert ended.error.startswith(f"round 1's job {job_id} failed: the job process killed by signal 9")
    assert ended.error.endswith("not resumed again after 3 resumes")
    assert "\n" not in ended.error and ended.rounds[0].status == S.ROUND_STATUS_FAILED
    assert ended.rounds[0].error == ended.error and ended.baseline_score >= 0  # what ran before is kept


@pytest.mark.slow  # a chaos run, make test-all (45 s); make test keeps the scheduler's restart in-process
# (test_scheduler_jobs.py: a JobManager restarted on its store and stream picks up its jobs where they stood)
def test_a_loop_survives_scheduler_restarts_and_spends_its_rounds(stack) -> None:
    client, running_stack, home = stack
    spec = loop_spec("restarted", column="accuracy", target=100.0, steps=6, limit=500, max_rounds=2,
                     give_up_after=3)
    loop = start(client, spec)
    first = until(client, loop.id, lambda lp: job_running(client, lp))
    assert running_stack.restart("scheduler")  # kill -9 while round 1 trains
    second = until(client, loop.id, lambda lp: len(lp.rounds) == 2 and lp.status == S.LOOP_STATUS_BENCHMARKING,
                   timeout=600)
    assert second.rounds[0].job_id == first.rounds[0].job_id  # adopted, not started again
    assert running_stack.restart("scheduler")  # and again while round 2 is being benchmarked
    ended = finish(client, loop.id)
    assert ended.status == S.LOOP_STATUS_ROUNDS_SPENT, ended.message + ended.error
    assert ended.message.startswith("all 2 rounds run")
    assert [r.status for r in ended.rounds] == [S.ROUND_STATUS_SCORED] * 2
    # Exactly one job per round, never a second one for the same round.
    names = [j.spec.name for j in client.scheduler.list_jobs(S.ListJobsRequest(limit=500)).jobs
             if j.spec.name.startswith("restarted R")]
    assert sorted(names) == ["restarted R1", "restarted R2"]
    evaluations = client.benchmark.list_evaluations(B.ListEvaluationsRequest(limit=500)).evaluations
    labels = [e.label for e in evaluations if e.label.endswith(f"(loop {loop.id})")]
    assert sorted(labels) == sorted({*labels})  # one evaluation per round and one baseline
    assert len(labels) == 3
    _no_duplicates(loop_events(home, loop.id))


def test_bad_loops_are_refused_and_create_nothing(stack) -> None:
    from rlvr.clients.sdk import RlvrError

    client, _, _ = stack
    before = client.scheduler.list_loops(S.ListLoopsRequest()).total
    good = loop_spec("checked", column="accuracy", target=50.0)
    cases = {
        "target": (lambda s: setattr(s, "target", 0.0), "target: 0.0 is out of range"),
        "benchmark": (lambda s: setattr(s, "benchmark", "mmlu"),
                      "benchmark: 'mmlu' is not a benchmark the benchmark service lists; choose one of "
                      "rlvr-math-pairs-heldout, gsm8k, boxed"),
        "score_column": (lambda s: setattr(s, "score_column", "bleu"), "score_column: 'bleu' is not a score column"),
        "job": (lambda s: setattr(s.job.grpo, "lora_rank", 2), "job.grpo.lora_rank: 2 is out of range"),
        "max_rounds": (lambda s: setattr(s, "max_rounds", 0), "max_rounds: 0 is out of range; allowed: 1-100"),
    }
    for field, (mutate, message) in cases.items():
        spec = S.LoopSpec()
        spec.CopyFrom(good)
        mutate(spec)
        with pytest.raises(RlvrError) as e:
            client.scheduler.create_loop(S.CreateLoopRequest(spec=spec))
        assert e.value.code.name == "INVALID_ARGUMENT", field
        assert message in e.value.details, (field, e.value.details)
    dry = client.scheduler.create_loop(S.CreateLoopRequest(spec=good, dry_run=True))
    assert not dry.HasField("loop") and dry.summary.model == MODEL and dry.resolved_spec.max_rounds == 8
    assert client.scheduler.list_loops(S.ListLoopsRequest()).total == before  # nothing was created
    for call in (lambda: client.scheduler.get_loop(S.GetLoopRequest(id="nope")),
                 lambda: client.scheduler.stop_loop(S.StopLoopRequest(id="nope")),
                 lambda: list(client.scheduler.watch_loop(S.WatchLoopRequest(id="nope")))):
        with pytest.raises(RlvrError) as e:
            call()
        assert e.value.code.name == "NOT_FOUND" and "loop 'nope' not found" in e.value.details
