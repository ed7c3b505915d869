"""Evaluations with an environment (services/benchmark/episodes.py) without gRPC: each question one
episode through the real episode loop, the real ChatCodec over the tiny model's tokenizer, a scripted
rollout twin that answers token ids (a tool call, then an answer), the real math_pairs reward and a
real store. What an evaluation's rows and counters show, that the same evaluation sends the same
requests twice, and how a failing environment or policy ends a question or the evaluation.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from test_benchmark_core import LocalPeers, finished, request

from rlvr.common.errors import InvalidArgument
from rlvr.environments.base import Environment, EnvironmentDefinition, EpisodeRow, Reply, environment, tool
from rlvr.infra.store import Store
from rlvr.peers.types import AdapterTag, Sampling
from rlvr.services.benchmark.episodes import (
    EvaluationError,
    TokenAnswer,
    episode_seed,
    load_tokenizer,
    model_path,
)
from rlvr.services.benchmark.evaluations import EvaluationManager
from rlvr.tiny.tokenizer import IM_END, build_tokenizer
from rlvr.v1 import benchmark_pb2 as B
from rlvr.v1 import common_pb2 as C

TOKENIZER = build_tokenizer()


@environment("bench_calc", display_name="Bench calculator", version="7", max_turns=3,
             instruction="Use the calculate tool, then answer inside <answer></answer>.")
class BenchCalc(Environment):
    """Math pairs with a calculate tool (the test's own, so the test does not lean on a built-in)."""

    def __init__(self, fail: str = "", own_reward: str = "") -> None:
        self.fail = set(filter(None, fail.split(",")))
        self.own_reward = own_reward == "1"
        self.truth = ""
        self.calls: list[str] = []

    def reset(self, row: EpisodeRow) -> str | None:
        if "*" in self.fail or row.ground_truth in self.fail:
            raise RuntimeError(f"no table for {row.ground_truth}")
        self.truth = row.ground_truth
        return "You have a calculator."

    @tool
    def calculate(self, expression: str) -> str:
        """Evaluates an arithmetic expression.

        Args:
            expression: e.g. "12 * (3 + 4)"
        """
        self.calls.append(expression)
        if not re.fullmatch(r"[0-9+*() -]+", expression):
            raise ValueError(f"not arithmetic: {expression!r}")
        return str(eval(expression, {"__builtins__": {}}))  # noqa: S307 (digits and operators only)

    def step(self, text: str) -> Reply:
        return Reply(done=True)

    def reward(self) -> Any:
        return None if not self.own_reward else {"score": 1.0 if self.calls else 0.0}

    def state(self) -> dict[str, Any]:
        return {"calls": list(self.calls)}


DEFINITIONS: dict[str, EnvironmentDefinition] = {"bench_calc": BenchCalc}


@pytest.fixture(autouse=True)
def registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The benchmark's environments: the test's own, then the registry's (the built-ins)."""
    from rlvr.environments import registry as reg

    real = reg.get_environment

    def get_environment(key: str) -> EnvironmentDefinition:
        return DEFINITIONS[key] if key in DEFINITIONS else real(key)

    monkeypatch.setattr(reg, "get_environment", get_environment)


def ids(text: str) -> list[int]:
    return [int(i) for i in TOKENIZER.encode(text, add_special_tokens=False)]


TurnScript = Callable[[int, str], str]  # (question-ish seed, the prompt as text) -> the turn's text


def calc_then_answer(truth_of: Callable[[str], str]) -> TurnScript:
    """Turn 1 calls calculate("2 + 2"); turn 2 answers the question's ground truth (read back from
    the prompt by `truth_of`)."""

    def script(_seed: int, prompt: str) -> str:
        if "<|im_start|>tool" not in prompt:
            return '<tool_call>\n{"name": "calculate", "arguments": {"expression": "2 + 2"}}\n</tool_call>'
        return f"<think>4</think><answer>{truth_of(prompt)}</answer>"

    return script


@dataclass
class EpisodePeers(LocalPeers):
    """LocalPeers with a token-id rollout twin: each turn's text from `turn`, every request kept."""

    turn: TurnScript = field(default=lambda seed, prompt: "<answer>0</answer>")
    requests: list[tuple[str, tuple[int, ...], int, int | None, float, AdapterTag]] = field(default_factory=list)
    turn_stamp: AdapterTag | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.token_generator = self

    async def generate_tokens(self, prompt_ids: Sequence[int], sampling: Sampling, adapter: AdapterTag,
                              request_id: str) -> TokenAnswer:
        self.requests.append((request_id, tuple(prompt_ids), sampling.max_tokens, sampling.seed,
                              sampling.temperature, adapter))
        await asyncio.sleep(0)  # the episodes of a batch interleave
        prompt = TOKENIZER.decode(list(prompt_ids), skip_special_tokens=False)
        out = ids(self.turn(sampling.seed or 0, prompt))[: sampling.max_tokens - 1]
        reason = "STOP" if len(out) < sampling.max_tokens - 1 else "LENGTH"
        if reason == "STOP":
            out += ids(IM_END)
        return TokenAnswer(out, reason, self.turn_stamp or adapter)  # type: ignore[arg-type]


TRUTHS: dict[str, str] = {}  # question text -> ground truth, filled by `peers`


def truth_in(prompt: str) -> str:
    for question, truth in TRUTHS.items():
        if question in prompt:
            return truth
    return "-1"


async def peers_with(**kw: Any) -> EpisodePeers:
    peers = EpisodePeers(**kw)
    for p in await peers.problems("math_pairs", 0, "", ""):
        TRUTHS[p.question] = p.ground_truth
    return peers


def manager_of(store: Store, peers: EpisodePeers, **kw: Any) -> EvaluationManager:
    return EvaluationManager(store, peers, tokenizer_loader=lambda model: TOKENIZER, **kw)


def env_request(limit: int = 6, **environment: Any) -> B.RunEvaluationRequest:
    settings = environment.pop("settings", {})
    return request(limit=limit, sampling=C.SamplingParams(max_tokens=128),
                   environment=C.EnvironmentConfig(key="bench_calc", settings=settings, **environment))


async def test_an_environment_evaluation_shows_every_turn_and_tool_call(sqlite_store: Store) -> None:
    def right_on_even(seed: int, prompt: str) -> str:
        truth = truth_in(prompt)
        wrong = str(int(truth) + 1) if truth.lstrip("-").isdigit() else "x"
        even = list(TRUTHS.values()).index(truth) % 2 == 0 if truth in TRUTHS.values() else False
        return calc_then_answer(lambda p: truth if even else wrong)(seed, prompt)

    peers = await peers_with(turn=right_on_even)
    manager = manager_of(sqlite_store, peers, batch_size=4)
    ev = await finished(manager, (await manager.run(env_request(limit=6))).id)
    assert ev.status == B.EVALUATION_STATUS_COMPLETED, ev.error
    assert (ev.environment.key, ev.environment.version, ev.environment.max_turns) == ("bench_calc", "7", 3)
    assert ev.environment.max_episode_tokens == 4 * 128
    assert (ev.episodes.episodes, ev.episodes.tool_calls, ev.episodes.tool_errors) == (6, 6, 0)
    assert ev.episodes.turns_mean == 2.0 and ev.episodes.failed_episodes == 0
    assert len(peers.requests) == 12  # two turns per question, one Generate call each
    assert ev.scores.accuracy == pytest.approx(3 / 6) and ev.scores.answered == 1.0

    results = (await manager.results(ev.id, False, 0, 0)).results
    assert [r.index for r in results] == list(range(6))
    first = results[0]
    assert first.completion.splitlines()[:2] == [
        "[turn 1] <tool_call>", '{"name": "calculate", "arguments": {"expression": "2 + 2"}}']
    assert "[tool calculate] 4" in first.completion and "[turn 2] <think>4</think><answer>" in first.completion
    episode = json.loads(first.episode)
    assert [len(t["tool_calls"]) for t in episode["turns"]] == [1, 0]
    call = episode["turns"][0]["tool_calls"][0]
    assert (call["name"], call["arguments"], call["result"], call["error"]) == ("calculate", {"expression": "2 + 2"},
                                                                               "4", "")
    assert episode["state"] == {"calls": ["2 + 2"]} and episode["ended_by"] in ("answer", "done")
    assert first.extracted_answer == first.ground_truth and first.accuracy == 1.0
    # The instruction is the environment's, and reset's text joined the question.
    prompt = TOKENIZER.decode(list(peers.requests[0][1]), skip_special_tokens=False)
    assert "Use the calculate tool" in prompt and "You have a calculator." in prompt


async def test_the_same_evaluation_sends_the_same_requests_twice(sqlite_store: Store) -> None:
    peers = await peers_with(turn=calc_then_answer(truth_in))
    manager = manager_of(sqlite_store, peers, batch_size=3)
    sampled = request(limit=5, seed=11, sampling=C.SamplingParams(max_tokens=96, temperature=0.8),
                      environment=C.EnvironmentConfig(key="bench_calc"))
    first = await finished(manager, (await manager.run(sampled)).id)
    once = sorted(peers.requests)
    peers.requests.clear()
    other = manager_of(sqlite_store, peers, batch_size=5)  # another batch size: the same requests
    second = await finished(other, (await other.run(sampled)).id)
    assert first.status == second.status == B.EVALUATION_STATUS_COMPLETED
    assert sorted(peers.requests) == once and len(once) == 10
    seeds = {(rid, seed) for rid, _, _, seed, _, _ in once}
    assert len({s for _, s in seeds}) == 10  # every question's every turn its own stream
    assert all(temperature == pytest.approx(0.8) for *_, temperature, _ in once)

    def episodes(evaluation_id: str) -> list[str]:  # the rows' episodes, but for the seconds they took
        return [re.sub(r'"seconds": [0-9.e-]+', "", r.episode) for r in sqlite_store.question_results(evaluation_id)]

    assert episodes(first.id) == episodes(second.id)
    assert episode_seed(11, 3) != episode_seed(11, 4) and episode_seed(11, 3) == episode_seed(11, 3)


async def test_a_failing_environment_scores_its_question_0_and_the_evaluation_goes_on(sqlite_store: Store) -> None:
    peers = await peers_with(turn=calc_then_answer(truth_in))
    questions = await peers.problems("math_pairs", 6, "", "")
    manager = manager_of(sqlite_store, peers, batch_size=4)
    ev = await finished(manager, (await manager.run(env_request(limit=6, settings={"fail": questions[2].ground_truth}))).id)
    assert ev.status == B.EVALUATION_STATUS_COMPLETED, ev.error
    assert ev.episodes.failed_episodes == sum(q.ground_truth == questions[2].ground_truth for q in questions)
    results = (await manager.results(ev.id, False, 0, 0)).results
    bad = results[2]
    assert bad.accuracy == 0 and bad.reward == 0
    assert "[failed] environment reset failed: RuntimeError: no table for" in bad.completion
    assert json.loads(bad.episode)["error"].startswith("environment reset failed")
    assert all(r.accuracy == 1 for r in results if r.ground_truth != questions[2].ground_truth)


async def test_every_episode_failing_fails_the_evaluation_with_the_first_reason(sqlite_store: Store) -> None:
    peers = await peers_with(turn=calc_then_answer(truth_in))
    manager = manager_of(sqlite_store, peers, batch_size=4)
    ev = await finished(manager, (await manager.run(env_request(limit=6, settings={"fail": "*"}))).id)
    assert ev.status == B.EVALUATION_STATUS_FAILED
    assert "every episode failed in the environment 'bench_calc' (v7)" in ev.error
    assert "environment reset failed: RuntimeError: no table for" in ev.error
    assert ev.questions_done == 0 and not peers.requests  # nothing was generated for a reset that failed
    # the failed batch's rows are kept: each one says why
    rows = sqlite_store.question_results(ev.id)
    assert len(rows) == 4 and all("[failed]" in r.completion for r in rows)


async def test_the_environments_own_reward_scores_and_per_question_settings_apply(sqlite_store: Store) -> None:
    peers = await peers_with(turn=calc_then_answer(lambda p: "-5"))  # always wrong for the reward
    manager = manager_of(sqlite_store, peers)
    ev = await finished(manager, (await manager.run(env_request(limit=4, settings={"own_reward": "1"}))).id)
    assert ev.status == B.EVALUATION_STATUS_COMPLETED and ev.scores.accuracy == 1.0  # it called the tool
    assert ev.environment.settings["own_reward"] == "1"


async def test_a_turn_from_another_policy_fails_the_evaluation(sqlite_store: Store) -> None:
    peers = await peers_with(turn=calc_then_answer(truth_in), turn_stamp=AdapterTag("other", 3))
    manager = manager_of(sqlite_store, peers)
    ev = await finished(manager, (await manager.run(env_request(limit=3))).id)
    assert ev.status == B.EVALUATION_STATUS_FAILED
    assert "turn 1 was answered by other v3" in ev.error and "refusing to score another policy" in ev.error


async def test_tool_errors_are_counted_not_fatal(sqlite_store: Store) -> None:
    def bad_call(seed: int, prompt: str) -> str:
        if "<|im_start|>tool" not in prompt:
            return '<tool_call>\n{"name": "calculate", "arguments": {"expression": "import os"}}\n</tool_call>'
        return f"<answer>{truth_in(prompt)}</answer>"

    peers = await peers_with(turn=bad_call)
    manager = manager_of(sqlite_store, peers)
    ev = await finished(manager, (await manager.run(env_request(limit=3))).id)
    assert ev.status == B.EVALUATION_STATUS_COMPLETED and ev.scores.accuracy == 1.0
    assert (ev.episodes.tool_calls, ev.episodes.tool_errors) == (3, 3)
    row = (await manager.results(ev.id, False, 0, 1)).results[0]
    assert "[tool calculate] error:" in row.completion


async def test_a_model_this_host_cannot_read_fails_the_evaluation_naming_it(sqlite_store: Store, tmp_path) -> None:
    missing = str(tmp_path / "no-such-model")
    peers = await peers_with(model=missing)
    manager = EvaluationManager(sqlite_store, peers)  # the real loader
    ev = await finished(manager, (await manager.run(env_request(limit=2))).id)
    assert ev.status == B.EVALUATION_STATUS_FAILED and not peers.requests
    assert f"the rollout service's model {missing!r} is not readable on the benchmark's host" in ev.error
    assert "\n" not in ev.error
    with pytest.raises(EvaluationError, match="not readable"):
        load_tokenizer(missing)
    assert model_path("~/m").startswith("/") and model_path("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"


async def test_bad_environment_requests_are_refused_before_anything_runs(sqlite_store: Store) -> None:
    peers = await peers_with()
    manager = manager_of(sqlite_store, peers)
    with pytest.raises(InvalidArgument, match="environment.key: 'nope' is not an environment; known: calculator"):
        await manager.run(request(limit=2, environment=C.EnvironmentConfig(key="nope")))
    with pytest.raises(InvalidArgument) as e:
        await manager.run(request(limit=2, environment=C.EnvironmentConfig(
            key="bench_calc", max_turns=65, max_episode_tokens=10, settings={"1x": "y"})))
    text = str(e.value)
    assert "environment.max_turns: 65 is out of range" in text and "environment.max_episode_tokens: 10" in text
    assert "environment.settings: key '1x'" in text
    with pytest.raises(InvalidArgument, match="environment.max_turns: set without environment.key"):
        await manager.run(request(limit=2, environment=C.EnvironmentConfig(max_turns=2)))
    assert not sqlite_store.list_evaluations(["QUEUED", "RUNNING", "COMPLETED", "FAILED"], 10)


async def test_a_single_answer_evaluation_has_no_environment_nor_episodes(sqlite_store: Store) -> None:
    peers = await peers_with()
    manager = manager_of(sqlite_store, peers)
    ev = await finished(manager, (await manager.run(request(limit=3))).id)
    assert ev.status == B.EVALUATION_STATUS_COMPLETED
    assert not ev.HasField("environment") and not ev.HasField("episodes")
    assert all(r.episode == "" for r in (await manager.results(ev.id, False, 0, 0)).results)


async def test_the_built_in_calculator_runs_as_the_registry_has_it(sqlite_store: Store) -> None:
    def multiply_then_answer(seed: int, prompt: str) -> str:
        if "<|im_start|>tool" not in prompt:
            return '<tool_call>\n{"name": "calculate", "arguments": {"expression": "(3 + 4) * (5 + 6)"}}\n</tool_call>'
        return f"<answer>{truth_in(prompt)}</answer>"

    peers = await peers_with(turn=multiply_then_answer)
    manager = manager_of(sqlite_store, peers)
    ev = await finished(manager, (await manager.run(request(
        limit=3, sampling=C.SamplingParams(max_tokens=128), environment=C.EnvironmentConfig(key="calculator")))).id)
    assert ev.status == B.EVALUATION_STATUS_COMPLETED, ev.error
    assert (ev.environment.key, ev.environment.version, ev.environment.max_turns) == ("calculator", "1", 4)
    assert (ev.episodes.tool_calls, ev.episodes.tool_errors, ev.scores.accuracy) == (3, 0, 1.0)
    row = (await manager.results(ev.id, False, 0, 1)).results[0]
    assert "[tool calculate] 77" in row.completion
    assert json.loads(row.episode)["turns"][0]["tool_calls"][0]["result"] == "77"


async def test_the_cli_asks_for_an_environment_and_shows_every_turn(sqlite_store: Store,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from rlvr.clients.cli import build_parser
    from rlvr.clients.commands import eval as eval_cmd

    args = build_parser().parse_args(["eval", "run", "--benchmark", "rlvr-math-pairs-heldout", "--environment",
                                      "calculator", "--environment-setting", "a=1", "--max-turns", "3"])
    asked = eval_cmd.run_request(args)
    assert (asked.environment.key, dict(asked.environment.settings), asked.environment.max_turns) == \
        ("calculator", {"a": "1"}, 3)
    assert not eval_cmd.run_request(build_parser().parse_args(["eval", "run", "--benchmark", "x"])).HasField(
        "environment")

    peers = await peers_with(turn=calc_then_answer(truth_in))
    manager = manager_of(sqlite_store, peers)
    ev = await finished(manager, (await manager.run(env_request(limit=2))).id)
    results = await manager.results(ev.id, False, 0, 0)

    class Client:  # the SDK's BenchmarkClient as cmd_show uses it
        def get_evaluation(self, _request: B.GetEvaluationRequest) -> B.Evaluation:
            return ev

        def get_evaluation_results(self, _request: B.GetEvaluationResultsRequest) -> B.GetEvaluationResultsResponse:
            return results

    show = build_parser().parse_args(["eval", "show", ev.id, "--turns"])
    assert eval_cmd.cmd_show(show, Client()) == 0  # type: ignore[arg-type]
    out = " ".join(capsys.readouterr().out.split())  # rich wraps at the terminal's width
    assert "environment bench_calc v7" in out and "2 episodes, 2.00 turns each, 2 tool calls (0 errors)" in out
    assert "[tool calculate] 4" in out and "question 1 (truth" in out
    assert '{"name": "calculate", "arguments": {"expression": "2 + 2"}}' in out


def test_episodes_are_scored_the_same_by_the_trainer_and_the_benchmark() -> None:
    """rlvr/episodes/scoring.py's one rule: failed -> 0 with its reason; the environment's own reward
    (per-turn rewards added, capped at 1); else the reward reads the episode (per-turn rewards added)."""
    from rlvr.episodes.scoring import EpisodeScores
    from rlvr.episodes.types import Episode
    from rlvr.peers.types import Score
    from rlvr.services.trainer.job.episodes import EpisodeRollout
    from rlvr.tasks import get_task

    def episode(**kw: Any) -> Episode:
        return Episode(messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                       samples=[], final_answer="<answer>7</answer>", **kw)

    episodes = [episode(error="environment reset failed: RuntimeError: x"), episode(env_reward=0.75, turn_rewards=[0.5]),
                episode(env_reward="many"), episode(turn_rewards=[0.25]), episode()]
    asked: list[Any] = []

    class Scorer:
        def score(self, items: Sequence[Any]) -> list[Score]:
            asked.extend(items)
            return [Score(1.0, 1.0, 0.0, True, "7") for _ in items]

    rollout = object.__new__(EpisodeRollout)
    rollout.definition = BenchCalc
    problems = get_task("math_pairs").prompts(n=5, split="test", shuffle=False)
    trained = rollout.score(episodes, problems, ["p"] * 5, Scorer(), 1)
    assert [s.reward for s in trained] == [0.0, 1.0, 0.0, 1.25, 1.0]
    assert trained[0].error.startswith("environment reset failed") and "environment reward" in trained[2].error
    assert len(asked) == 2 and asked[0].columns["environment"]["key"] == "bench_calc"
    assert asked[0].columns["environment"]["version"] == "7" and asked[0].completion == "<answer>7</answer>"
    split = EpisodeScores.split(episodes, lambda k, e: asked[0])
    assert [k for k, _ in split.pending] == [3, 4]
    assert [s.reward for s in split.complete([Score(1.0, 1.0, 0.0), Score(1.0, 1.0, 0.0)])] == [0.0, 1.0, 0.0, 1.25, 1.0]
