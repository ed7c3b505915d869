"""The benchmark service as users meet it: its own process over real gRPC on loopback, with a real
rollout service (transformers backend; one test on the real vLLM engine), a real reward service and
NATS, on the test-size tiny model; the `rlvr eval` commands against it.

The base score check uses the model that build_tiny_model(size="test") builds with a small eval_n:
the benchmark must report exactly its held-out accuracy, and more strictly each completion must be
the one build-tiny's own greedy evaluation produced. The same check on the real `rlvr-tiny` default
model (500 questions) is marked slow.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from test_bootstrap import _free_port, _wait_serving
from test_rollout_core import make_lora

from rlvr.clients import cli
from rlvr.clients.sdk import BenchmarkClient, RlvrError, RolloutClient
from rlvr.tiny import BuildReport, build_tiny_model
from rlvr.v1 import benchmark_pb2 as B
from rlvr.v1 import common_pb2 as C

HELDOUT = "rlvr-math-pairs-heldout"
EVAL_N = 40
BUILD_MAX_TOKENS = 48  # what build-tiny's evaluate_heldout generates with


@dataclass
class Stack:
    client: BenchmarkClient
    address: str
    rollout: str
    reward: str
    model: Path
    report: BuildReport
    adapters: Path  # the benchmark's adapter root
    data: Path  # the reward service's data root
    logs: Path


class Services:
    """Service subprocesses with their logs; stopped (and checked for a clean exit) at the end."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, *args: str, log_name: str | None = None, timeout: float = 120) -> str:
        port = _free_port()
        log = self.logs / f"{log_name or name}.log"
        # One torch thread: on this project's shared 2-core machines it decodes several times faster
        # than two (OpenMP spin-waiting; bench/eval_throughput.py --rollout-threads measures it).
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        with log.open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", f"rlvr.services.{name}.main", "--port", str(port),
                                     "--log-format", "text", *args], stdout=out, stderr=subprocess.STDOUT, env=env)
        self.procs.append((name, proc))
        try:
            _wait_serving(f"127.0.0.1:{port}", timeout=timeout)
        except TimeoutError:
            proc.kill()
            pytest.fail(f"{name} did not start:\n{log.read_text()[-3000:]}")
        return f"127.0.0.1:{port}"

    def stop(self) -> None:
        for _, proc in reversed(self.procs):
            proc.terminate()
        for name, proc in self.procs:
            assert proc.wait(timeout=60) == 0, f"{name} exited {proc.returncode}"


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    running = Services(tmp_path_factory.mktemp("logs"))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def stack(services: Services, nats_server, tmp_path_factory: pytest.TempPathFactory) -> Stack:
    root = tmp_path_factory.mktemp("bench")
    report = build_tiny_model(root / "rlvr-tiny-test", size="test", eval_n=EVAL_N)
    (root / "adapters").mkdir()
    (root / "data").mkdir()
    rollout = services.start("rollout", "--model", report.path, "--backend", "transformers", "--max-model-len", "512",
                             "--max-lora-rank", "8", "--adapter-root", str(root / "rollout-adapters"), timeout=240)
    reward = services.start("reward", "--data-roots", str(root / "data"))
    address = services.start("benchmark", "--rollout-address", rollout, "--reward-address", reward,
                             "--nats-url", nats_server.url, "--database-url", f"sqlite:///{root / 'rlvr.db'}",
                             "--adapter-roots", str(root / "adapters"), "--batch-size", "16")
    return Stack(BenchmarkClient(address), address, rollout, reward, Path(report.path), report, root / "adapters",
                 root / "data", services.logs)


def run(client: BenchmarkClient, timeout: float = 300, **fields) -> B.Evaluation:
    """RunEvaluation, then WatchEvaluation to the end; the final stored evaluation."""
    fields.setdefault("benchmark", HELDOUT)
    started = client.run_evaluation(B.RunEvaluationRequest(**fields))
    events = list(client.watch_evaluation(B.WatchEvaluationRequest(id=started.id), timeout=timeout))
    assert events[-1].status in (B.EVALUATION_STATUS_COMPLETED, B.EVALUATION_STATUS_FAILED)
    done = [e.questions_done for e in events]
    assert done == sorted(done)
    final = client.get_evaluation(B.GetEvaluationRequest(id=started.id))
    assert final.status == B.EVALUATION_STATUS_COMPLETED, final.error
    return final


def results(client: BenchmarkClient, evaluation_id: str, only_wrong: bool = False) -> list[B.QuestionResult]:
    return list(client.get_evaluation_results(B.GetEvaluationResultsRequest(id=evaluation_id,
                                                                           only_wrong=only_wrong)).results)


def greedy(max_tokens: int = BUILD_MAX_TOKENS) -> C.SamplingParams:
    return C.SamplingParams(max_tokens=max_tokens)


def build_tiny_completions(model: Path, n: int) -> list[str]:
    """What build-tiny's own held-out evaluation generates for the first n problems."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvr.tasks import math_pairs
    from rlvr.tasks.render import render_prompt
    from rlvr.tiny.build import generate_greedy, torch_threads

    with torch_threads():
        tokenizer = AutoTokenizer.from_pretrained(str(model))
        lm = AutoModelForCausalLM.from_pretrained(str(model), dtype="float32").eval()
        prompts = [render_prompt(tokenizer, p) for p in math_pairs.heldout_problems(n, 0)]
        return generate_greedy(lm, tokenizer, prompts, BUILD_MAX_TOKENS, batch_size=128)


def test_list_benchmarks(stack: Stack) -> None:
    listed = {b.name: b for b in stack.client.list_benchmarks().benchmarks}
    assert listed[HELDOUT].size == 500 and listed[HELDOUT].display_name == "RLVR Math Pairs held-out"
    assert listed["gsm8k"].size > 1000 and listed["boxed"].needs_dataset
    assert list(listed[HELDOUT].score_columns) == ["accuracy", "accuracy_strict", "format", "answered"]


def test_base_score_matches_build_tiny(stack: Stack) -> None:
    ev = run(stack.client, limit=EVAL_N, sampling=greedy())
    assert ev.scores.accuracy == pytest.approx(stack.report.heldout_accuracy, abs=1e-12)
    assert stack.report.heldout_n == ev.questions_total == ev.questions_done == EVAL_N
    rows = results(stack.client, ev.id)
    assert [r.index for r in rows] == list(range(EVAL_N))  # every per-question row stored
    assert [r.completion for r in rows] == build_tiny_completions(stack.model, EVAL_N)
    assert all(r.prompt and r.ground_truth and r.finish_reason != C.FINISH_REASON_UNSPECIFIED for r in rows)
    assert ev.model == str(stack.model) and ev.adapter_name == "" and ev.sampling.max_tokens == BUILD_MAX_TOKENS


def test_adapter_differs_from_base_and_runs_repeat(stack: Stack) -> None:
    lora = make_lora(stack.model, stack.adapters / "round-1", seed=5)
    base = run(stack.client, limit=16, sampling=greedy())
    uploaded = run(stack.client, limit=16, sampling=greedy(), adapter=C.AdapterSelector(name="bench-lora"),
                   adapter_path=str(lora), label="round 1")
    again = run(stack.client, limit=16, sampling=greedy(), adapter=C.AdapterSelector(name="bench-lora"))
    base_again = run(stack.client, limit=16, sampling=greedy())
    assert (uploaded.adapter_name, uploaded.adapter_version, again.adapter_version) == ("bench-lora", 1, 1)
    answers = {k: [r.completion for r in results(stack.client, e.id)] for k, e in
               {"base": base, "adapter": uploaded, "again": again, "base_again": base_again}.items()}
    assert answers["adapter"] != answers["base"]
    assert answers["adapter"] == answers["again"] and answers["base"] == answers["base_again"]
    assert uploaded.scores == again.scores and base.scores == base_again.scores
    sampled = [run(stack.client, limit=16, sampling=C.SamplingParams(temperature=1.0, max_tokens=32), seed=s)
               for s in (7, 7, 8)]
    texts = [[r.completion for r in results(stack.client, e.id)] for e in sampled]
    assert texts[0] == texts[1] != texts[2] and sampled[0].seed == 7


def test_breakdown_counts_cut_offs(stack: Stack) -> None:
    ev = run(stack.client, limit=16, sampling=greedy(32))
    rows = results(stack.client, ev.id)
    stopped = sum(r.finish_reason == C.FINISH_REASON_STOP for r in rows)
    assert stopped < len(rows) and ev.scores.answered == pytest.approx(stopped / len(rows))
    assert ev.scores.accuracy_strict <= ev.scores.accuracy  # strict does not depend on format
    assert all(r.strict <= (r.accuracy >= 1) for r in rows)  # on every stored row of a real model
    assert ev.scores.accuracy_strict == pytest.approx(sum(r.strict for r in rows) / len(rows))
    assert ev.scores.format == pytest.approx(sum(r.format for r in rows) / len(rows))
    wrong = results(stack.client, ev.id, only_wrong=True)
    assert len(wrong) == sum(r.accuracy < 1 for r in rows)


def test_an_environment_evaluation_runs_episodes_through_the_rollout_service(stack: Stack) -> None:
    """Each question one episode in the built-in calculator: every turn a token-id Generate call to
    the real rollout service, the chat template the tiny model's own (its folder is readable here),
    each row the episode turn by turn; greedy, so the same evaluation twice gives the same rows."""
    asked = dict(limit=4, sampling=greedy(), environment=C.EnvironmentConfig(key="calculator", max_turns=2))
    first, second = run(stack.client, **asked), run(stack.client, **asked)
    assert (first.environment.key, first.environment.version, first.environment.max_turns) == ("calculator", "1", 2)
    assert first.environment.max_episode_tokens == 4 * BUILD_MAX_TOKENS and first.episodes.episodes == 4
    assert 1 <= first.episodes.turns_mean <= 2 and first.episodes.failed_episodes == 0
    rows, again = results(stack.client, first.id), results(stack.client, second.id)
    assert [r.completion for r in rows] == [r.completion for r in again]
    for row in rows:
        episode = json.loads(row.episode)
        assert 1 <= len(episode["turns"]) <= 2 and row.completion.startswith("[turn 1] ")
        assert row.completion.splitlines()[0] == f"[turn 1] {episode['turns'][0]['assistant']}".splitlines()[0]


def test_an_agent_evaluation_runs_its_episodes_through_the_rollout_service(stack: Stack) -> None:
    """Each question one episode of the built-in calculator_agent: the agent's own `openai` client
    calls the benchmark process's endpoint, every call one token-id Generate call to the real
    rollout service; greedy, so the same evaluation twice gives the same rows, and the agent, which
    renders as the calculator environment, answers each question as the environment's episode does."""
    asked = dict(limit=4, sampling=greedy(), environment=C.EnvironmentConfig(key="calculator_agent", max_turns=2))
    first, second = run(stack.client, **asked), run(stack.client, **asked)
    assert (first.environment.key, first.environment.version, first.environment.max_turns) == (
        "calculator_agent", "1", 2)
    assert first.environment.max_episode_tokens == 4 * BUILD_MAX_TOKENS and first.episodes.episodes == 4
    assert 1 <= first.episodes.turns_mean <= 2 and first.episodes.failed_episodes == 0
    rows, again = results(stack.client, first.id), results(stack.client, second.id)
    assert [r.completion for r in rows] == [r.completion for r in again]
    for row in rows:
        episode = json.loads(row.episode)
        assert 1 <= len(episode["turns"]) <= 2 and not episode["error"] and row.completion.startswith("[turn 1] ")
        # every turn was a call of the agent's, answered by the policy (the rollout service)
        assert episode["state"]["model_calls"] == len(episode["turns"]) and episode["state"]["splits"] == 0
    environment = run(stack.client, **{**asked, "environment": C.EnvironmentConfig(key="calculator", max_turns=2)})
    assert [(r.completion, r.accuracy) for r in rows] == [
        (r.completion, r.accuracy) for r in results(stack.client, environment.id)]


def test_boxed_dataset(stack: Stack) -> None:
    data = stack.data / "tiny_boxed.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i}+{i}?", "ground_truth": str(2 * i)}) + "\n"
                            for i in range(5)))
    ev = run(stack.client, benchmark="boxed", dataset=str(data), sampling=greedy(32))
    assert ev.questions_total == 5 and [r.ground_truth for r in results(stack.client, ev.id)] == list("02468")


def test_bad_input_is_refused_before_any_generation(stack: Stack) -> None:
    before = len(stack.client.list_evaluations().evaluations)
    (stack.data / "wrong_columns.jsonl").write_text(json.dumps({"question": "1+1", "answer": "2"}) + "\n")
    cases = [
        (dict(benchmark="mmlu"), grpc.StatusCode.INVALID_ARGUMENT, "benchmark"),
        (dict(adapter=C.AdapterSelector(name="nobody")), grpc.StatusCode.NOT_FOUND, "nobody"),
        (dict(model="someone/else"), grpc.StatusCode.FAILED_PRECONDITION, "someone/else"),
        (dict(benchmark="boxed", dataset=str(stack.data / "wrong_columns.jsonl")),
         grpc.StatusCode.INVALID_ARGUMENT, "columns present: ['question', 'answer']"),
        (dict(limit=10_000), grpc.StatusCode.INVALID_ARGUMENT, "limit"),
        (dict(adapter=C.AdapterSelector(name="x"), adapter_path="/etc"), grpc.StatusCode.INVALID_ARGUMENT, "outside"),
    ]
    for fields, code, text in cases:
        fields.setdefault("benchmark", HELDOUT)
        with pytest.raises(RlvrError) as err:
            stack.client.run_evaluation(B.RunEvaluationRequest(**fields))
        assert err.value.code == code and text in err.value.details, (fields, err.value)
    assert len(stack.client.list_evaluations().evaluations) == before
    with pytest.raises(RlvrError) as err:
        stack.client.get_evaluation(B.GetEvaluationRequest(id="nope"))
    assert err.value.code == grpc.StatusCode.NOT_FOUND


async def test_progress_events_on_nats(stack: Stack, nats_server) -> None:
    from fixtures_infra import connected_bus

    from rlvr.infra.subjects import eval_status_subject

    ev = run(stack.client, limit=EVAL_N, sampling=greedy())
    seen: list[B.EvaluationEvent] = []
    async with connected_bus(nats_server.url) as bus:
        async for event in bus.watch(eval_status_subject(ev.id)):
            seen.append(B.EvaluationEvent.FromString(event.data))
            if seen[-1].status == B.EVALUATION_STATUS_COMPLETED:
                break
    statuses = [B.EvaluationStatus.Name(e.status)[18:] for e in seen]
    assert statuses[:2] == ["QUEUED", "RUNNING"] and statuses[-1] == "COMPLETED"
    assert [e.questions_done for e in seen if e.status == B.EVALUATION_STATUS_RUNNING][1:] == [16, 32, 40]
    assert seen[-1].scores.accuracy == ev.scores.accuracy


def test_leaderboard_best_first(stack: Stack) -> None:
    board = stack.client.get_leaderboard(B.GetLeaderboardRequest(benchmark=HELDOUT, score_column="format"))
    assert board.score_column == "format" and len(board.entries) >= 4
    assert sum(q.entries for q in board.question_sets) == len(board.entries)
    for question_set in board.question_sets:  # ranked within its question set only
        group = [e for e in board.entries if e.question_set == question_set.id]
        keys = [(-e.scores.format, e.finished_at.ToDatetime()) for e in group]
        assert keys == sorted(keys) and [e.rank for e in group] == list(range(1, len(group) + 1))
        assert all(e.questions == question_set.questions for e in group)
    assert any(e.label == "round 1" and e.adapter_name == "bench-lora" for e in board.entries)


def test_cli(stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setenv("RLVR_BENCHMARK_ADDRESS", stack.address)
    assert cli.main(["eval", "run", "--benchmark", HELDOUT, "--limit", "8", "--max-tokens", "48"]) == 0
    out = capsys.readouterr().out
    evaluation_id = out.split("evaluation ")[1].split()[0]
    assert "Accuracy Strict" in out and "Answered" in out
    assert cli.main(["eval", "show", evaluation_id, "--wrong"]) == 0
    assert "Detailed Results" in capsys.readouterr().out
    for fmt in ("csv", "jsonl"):
        target = tmp_path / f"results.{fmt}"
        assert cli.main(["eval", "export", evaluation_id, "-o", str(target)]) == 0
        rows = (list(csv.DictReader(target.open())) if fmt == "csv"
                else [json.loads(line) for line in target.read_text().splitlines()])
        assert len(rows) == 8 and {"prompt", "completion", "finish_reason", "strict"} <= set(rows[0])
    assert cli.main(["eval", "list"]) == 0 and evaluation_id in capsys.readouterr().out
    assert cli.main(["eval", "leaderboard", HELDOUT, "--column", "answered"]) == 0
    assert "answered" in capsys.readouterr().out.lower()
    assert cli.main(["eval", "run", "--benchmark", "nope"]) == 2 and "benchmark" in capsys.readouterr().err


def test_eval_compare_pairs_two_evaluations_of_the_same_questions(stack: Stack, capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch) -> None:
    from rlvr.paired import compare

    monkeypatch.setenv("RLVR_BENCHMARK_ADDRESS", stack.address)
    lora = make_lora(stack.model, stack.adapters / "compare", seed=11)
    base = run(stack.client, limit=24, sampling=greedy())
    tuned = run(stack.client, limit=24, sampling=greedy(), adapter=C.AdapterSelector(name="compare-lora"),
                adapter_path=str(lora))
    assert base.question_set == tuned.question_set
    expected = compare([r.accuracy for r in results(stack.client, base.id)],
                       [r.accuracy for r in results(stack.client, tuned.id)])
    assert cli.main(["eval", "compare", base.id, tuned.id]) == 0
    out = capsys.readouterr().out
    assert f"{expected.gained} wrong -> right, {expected.lost} right -> wrong" in out
    assert expected.verdict() in out and f"{base.scores.accuracy:7.1%}" in out
    other = run(stack.client, limit=8, sampling=greedy())  # the first 8 only: another question set
    assert cli.main(["eval", "compare", base.id, other.id]) == 2
    assert "asked different questions" in capsys.readouterr().err


def test_delete_evaluation(stack: Stack, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    """DeleteEvaluation over gRPC and `rlvr eval delete`: rows and results gone, a second delete
    NOT_FOUND, an evaluation still queued or running refused; ListEvaluations pages with a total."""
    monkeypatch.setenv("RLVR_BENCHMARK_ADDRESS", stack.address)
    client = stack.client
    running = client.run_evaluation(B.RunEvaluationRequest(benchmark=HELDOUT, limit=16, sampling=greedy(48)))
    with pytest.raises(RlvrError) as refused:  # it cannot have ended yet: it was just queued
        client.delete_evaluation(B.DeleteEvaluationRequest(id=running.id))
    assert refused.value.code.name == "FAILED_PRECONDITION"
    assert re.fullmatch(rf"evaluation {running.id} is (QUEUED|RUNNING); cancel it first \(rlvr eval cancel "
                        rf"{running.id}\), then delete it", refused.value.details)
    list(client.watch_evaluation(B.WatchEvaluationRequest(id=running.id), timeout=300))
    assert len(results(client, running.id)) == 16

    everything = client.list_evaluations(B.ListEvaluationsRequest(limit=500))
    assert everything.total == len(everything.evaluations) >= 2
    page = client.list_evaluations(B.ListEvaluationsRequest(limit=1, offset=1))
    assert page.total == everything.total and [e.id for e in page.evaluations] == [everything.evaluations[1].id]

    assert cli.main(["eval", "delete", running.id]) == 0
    assert capsys.readouterr().out.strip() == f"evaluation {running.id} deleted with its 16 per-question result(s)"
    for call in (lambda: client.get_evaluation(B.GetEvaluationRequest(id=running.id)),
                 lambda: results(client, running.id),
                 lambda: client.delete_evaluation(B.DeleteEvaluationRequest(id=running.id))):
        with pytest.raises(RlvrError) as gone:
            call()
        assert gone.value.code.name == "NOT_FOUND" and running.id in gone.value.details
    after = client.list_evaluations(B.ListEvaluationsRequest(limit=500))
    assert after.total == everything.total - 1 and running.id not in {e.id for e in after.evaluations}
    assert cli.main(["eval", "delete", running.id]) == 2 and "NOT_FOUND" in capsys.readouterr().err
    assert cli.main(["eval", "list", "--limit", "1", "--offset", "1"]) == 0
    assert f"2-2 of {after.total} evaluation(s)" in capsys.readouterr().out


async def test_cancel_evaluation(stack: Stack, nats_server, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    """CancelEvaluation over gRPC and `rlvr eval cancel`, with both slots held by whole-benchmark runs:
    a queued evaluation cancelled never starts; a running one stops within seconds with fewer rows
    than questions (those kept, its last NATS event CANCELLED), and the next queued one takes its
    slot. Cancel again answers the same; a completed one is refused naming its status, an unknown
    id is NOT_FOUND; the loop manager's wait ends on it; a cancelled evaluation deletes."""
    from fixtures_infra import connected_bus

    from rlvr.infra.subjects import eval_status_subject
    from rlvr.services.scheduler.benchmarks import GrpcBenchmarks
    from rlvr.services.scheduler.loop_driver import not_completed

    monkeypatch.setenv("RLVR_BENCHMARK_ADDRESS", stack.address)
    client = stack.client
    whole = [client.run_evaluation(B.RunEvaluationRequest(benchmark=HELDOUT, sampling=greedy())) for _ in range(2)]
    queued, nxt = [client.run_evaluation(B.RunEvaluationRequest(benchmark=HELDOUT, limit=8, sampling=greedy()))
                   for _ in range(2)]
    assert cli.main(["eval", "cancel", queued.id]) == 0
    assert capsys.readouterr().out.strip() == (f"evaluation {queued.id} cancelled after 0 of 8 questions; their "
                                               f"results are kept (`rlvr eval delete {queued.id}` removes them)")
    never = client.get_evaluation(B.GetEvaluationRequest(id=queued.id))
    assert never.status == B.EVALUATION_STATUS_CANCELLED and not never.started_at.seconds
    assert results(client, queued.id) == []

    runaway = whole[0]
    deadline = time.monotonic() + 120
    while client.get_evaluation(B.GetEvaluationRequest(id=runaway.id)).questions_done < 16:
        assert time.monotonic() < deadline, "no batch stored within 120 s"
        time.sleep(0.1)
    t0 = time.monotonic()
    stopped = client.cancel_evaluation(B.CancelEvaluationRequest(id=runaway.id))
    assert time.monotonic() - t0 < 10 and stopped.status == B.EVALUATION_STATUS_CANCELLED
    assert 16 <= stopped.questions_done < stopped.questions_total == 500 and stopped.finished_at.seconds
    kept = results(client, runaway.id)
    assert [r.index for r in kept] == list(range(stopped.questions_done))

    # The slot it held goes to the next queued one, which completes while the other whole run goes on.
    list(client.watch_evaluation(B.WatchEvaluationRequest(id=nxt.id), timeout=120))
    done = client.get_evaluation(B.GetEvaluationRequest(id=nxt.id))
    assert done.status == B.EVALUATION_STATUS_COMPLETED and done.questions_done == 8
    assert client.get_evaluation(B.GetEvaluationRequest(id=whole[1].id)).status == B.EVALUATION_STATUS_RUNNING
    assert client.cancel_evaluation(B.CancelEvaluationRequest(id=whole[1].id)).status == B.EVALUATION_STATUS_CANCELLED
    waited = await GrpcBenchmarks(stack.address).wait(whole[1].id)  # a loop's wait ends on it
    assert waited is not None and not_completed(waited) == "was cancelled"
    assert len(results(client, runaway.id)) == len(kept)  # nothing stored after the cancel

    assert client.cancel_evaluation(B.CancelEvaluationRequest(id=runaway.id)) == stopped  # idempotent
    for evaluation_id, code, text in ((nxt.id, "FAILED_PRECONDITION", f"evaluation {nxt.id} has already ended "
                                       "(COMPLETED); only a QUEUED or RUNNING evaluation can be cancelled"),
                                      ("no-such-evaluation", "NOT_FOUND", "no-such-evaluation")):
        with pytest.raises(RlvrError) as refused:
            client.cancel_evaluation(B.CancelEvaluationRequest(id=evaluation_id))
        assert refused.value.code.name == code and text in refused.value.details
    assert cli.main(["eval", "cancel", nxt.id]) == 2 and "COMPLETED" in capsys.readouterr().err

    seen: list[B.EvaluationEvent] = []
    async with connected_bus(nats_server.url) as bus:
        async for event in bus.watch(eval_status_subject(runaway.id)):
            seen.append(B.EvaluationEvent.FromString(event.data))
            if seen[-1].status == B.EVALUATION_STATUS_CANCELLED:
                break
    assert seen[-1].questions_done == stopped.questions_done
    assert seen[-1].message == f"cancelled by request after {stopped.questions_done} of 500 questions"

    deleted = client.delete_evaluation(B.DeleteEvaluationRequest(id=runaway.id))
    assert deleted.results_deleted == len(kept)
    for ev in (queued, whole[1]):
        client.delete_evaluation(B.DeleteEvaluationRequest(id=ev.id))


def test_a_rollout_refusal_mid_run_fails_the_evaluation_with_its_cause(stack: Stack, services: Services,
                                                                      nats_server, tmp_path: Path) -> None:
    """A trainer pushes v2 of an adapter while an evaluation of v1 waits for its slot: the rollout
    service refuses the stale version, and the evaluation ends FAILED with that cause (no hang)."""
    address = services.start("benchmark", "--rollout-address", stack.rollout, "--reward-address", stack.reward,
                             "--nats-url", nats_server.url, "--database-url", f"sqlite:///{tmp_path / 'f.db'}",
                             "--max-concurrent", "1", "--batch-size", "8", log_name="benchmark-one-slot")
    client, rollout = BenchmarkClient(address), RolloutClient(stack.rollout)
    rollout.load_adapter("pushed", 1, make_lora(stack.model, tmp_path / "v1", seed=11))
    busy = client.run_evaluation(B.RunEvaluationRequest(benchmark=HELDOUT, sampling=greedy()))  # holds the slot
    waiting = client.run_evaluation(B.RunEvaluationRequest(benchmark=HELDOUT, limit=8, sampling=greedy(),
                                                           adapter=C.AdapterSelector(name="pushed")))
    rollout.load_adapter("pushed", 2, make_lora(stack.model, tmp_path / "v2", seed=12))
    events = list(client.watch_evaluation(B.WatchEvaluationRequest(id=waiting.id), timeout=120))
    failed = client.get_evaluation(B.GetEvaluationRequest(id=waiting.id))
    assert events[-1].status == failed.status == B.EVALUATION_STATUS_FAILED
    assert "rollout service at" in failed.error and "Generate failed" in failed.error and "live version is 2" in failed.error
    assert failed.finished_at.seconds and failed.questions_done == 0
    list(client.watch_evaluation(B.WatchEvaluationRequest(id=busy.id), timeout=120))
    assert client.get_evaluation(B.GetEvaluationRequest(id=busy.id)).status == B.EVALUATION_STATUS_COMPLETED


@pytest.mark.vllm
@pytest.mark.slow  # 50 s; `make test-all`: the loop tests evaluate on vLLM in `make test`
def test_vllm_backend_gives_the_same_answers(stack: Stack, services: Services, nats_server, tmp_path: Path) -> None:
    rollout = services.start("rollout", "--model", str(stack.model), "--backend", "vllm", "--max-model-len", "512",
                             "--adapter-root", str(tmp_path / "adapters"), log_name="rollout-vllm", timeout=300)
    address = services.start("benchmark", "--rollout-address", rollout, "--reward-address", stack.reward,
                             "--nats-url", nats_server.url, "--database-url", f"sqlite:///{tmp_path / 'v.db'}",
                             log_name="benchmark-vllm")
    t0 = time.perf_counter()
    ev = run(BenchmarkClient(address), limit=EVAL_N, sampling=greedy())
    assert ev.scores.accuracy == pytest.approx(stack.report.heldout_accuracy, abs=1e-12), time.perf_counter() - t0
    hf = run(stack.client, limit=EVAL_N, sampling=greedy())
    assert [r.completion for r in results(BenchmarkClient(address), ev.id)] == \
        [r.completion for r in results(stack.client, hf.id)]


@pytest.mark.slow
def test_default_tiny_model_matches_build_tiny(services: Services, nats_server, tmp_path: Path) -> None:
    """The real `rlvr-tiny` (built or reused under $RLVR_HOME; minutes the first time), all 500."""
    from rlvr.models import resolve_model
    from rlvr.tiny.build import REPORT_FILE

    path = Path(resolve_model("rlvr-tiny"))
    report = json.loads((path / REPORT_FILE).read_text())
    rollout = services.start("rollout", "--model", "rlvr-tiny", "--backend", "transformers", "--max-model-len", "512",
                             "--adapter-root", str(tmp_path / "adapters"), log_name="rollout-default", timeout=300)
    reward = services.start("reward", log_name="reward-default")
    address = services.start("benchmark", "--rollout-address", rollout, "--reward-address", reward,
                             "--nats-url", nats_server.url, "--database-url", f"sqlite:///{tmp_path / 'd.db'}",
                             log_name="benchmark-default")
    client = BenchmarkClient(address)
    for max_tokens in (BUILD_MAX_TOKENS, 0):  # build-tiny's 48 tokens, and the benchmark's default 256
        ev = run(client, sampling=C.SamplingParams(max_tokens=max_tokens), timeout=900)
        assert ev.questions_total == report["heldout_n"] == 500
        assert ev.scores.accuracy == pytest.approx(report["heldout_accuracy"], abs=1e-12), max_tokens


async def test_the_loop_managers_view_of_the_benchmark_service(stack: Stack) -> None:
    """services/scheduler/benchmarks.GrpcBenchmarks (the loop core's Benchmarks) over the typed
    asyncio client against the real service: each call's answer, and each failure as the project's
    error kind (unknown evaluation None, refusal InvalidArgument, unreachable Unavailable)."""
    from rlvr.common.errors import InvalidArgument, Unavailable
    from rlvr.services.scheduler.benchmarks import GrpcBenchmarks

    benchmarks = GrpcBenchmarks(stack.address)
    assert HELDOUT in {b.name for b in await benchmarks.list()}
    assert await benchmarks.get("no-such-evaluation") is None
    assert await benchmarks.wait("no-such-evaluation") is None
    started = await benchmarks.run(B.RunEvaluationRequest(benchmark=HELDOUT, limit=4, sampling=greedy(),
                                                          label="loop view"))
    done = await benchmarks.wait(started.id)
    assert done is not None and done.status == B.EVALUATION_STATUS_COMPLETED and done.questions_done == 4
    found = await benchmarks.find(HELDOUT, "loop view")
    assert found is not None and found.id == started.id
    with pytest.raises(InvalidArgument, match="limit"):
        await benchmarks.run(B.RunEvaluationRequest(benchmark=HELDOUT, limit=-1))
    with pytest.raises(Unavailable, match="unreachable"):
        await GrpcBenchmarks(f"127.0.0.1:{_free_port()}").list()
