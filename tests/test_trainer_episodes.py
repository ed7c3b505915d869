"""A job with an environment, in-process on the "test"-size tiny model: real GRPO steps over
episodes through TRL (the transformers backend), and one step's rollout with a scripted policy.

What users rely on: the rows TRL trains on are the episodes' exact ids with the observations masked
out (env_mask), every step reports its episode metrics, a failing environment fails only its
episode (and the job only when every episode fails), and a resumed environment job ends bit for bit
where the uninterrupted one does.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from rlvr.peers.types import AdapterTag, Sampling
from rlvr.services.trainer.job.config import job_config
from rlvr.services.trainer.job.rollouts import RolloutBatch
from rlvr.services.trainer.job.runner import JobDeps, run_job
from rlvr.services.trainer.job.scorers import LocalScorer, ScoreSettings
from rlvr.v1 import common_pb2 as C

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/fixtures_trainer.py

EPISODE_FIELDS = ("turns_mean", "turns_max", "tool_calls", "tool_errors", "tool_seconds",
                  "observation_tokens_mean", "episode_tokens_mean", "truncated_episodes", "failed_episodes",
                  "episode_splits")


def _job(tmp_path: Path, model: str, **overrides: Any):
    options: dict[str, Any] = dict(
        job_id="e1", base_model=model, artifact_root=tmp_path, group_size=2, batch_size=4,
        max_completion_tokens=32, lora_rank=4, lora_alpha=64, learning_rate=1e-3, max_steps=2,
        loss_type="dapo", generation_backend="transformers", synthetic_prompts=8,
        reward_function="guess_number", environment="guess_number", max_turns=3, max_episode_tokens=200,
    )
    options.update(overrides)
    return job_config(**options)


def test_an_environment_job_trains_on_episodes_and_reports_their_metrics(tmp_path: Path, tiny_model: str) -> None:
    events: list[C.MetricEvent] = []
    samples: list[C.CompletionSamples] = []
    result = run_job(_job(tmp_path, tiny_model), JobDeps(scorer=LocalScorer(ScoreSettings("guess_number")),
                                                         publish=events.append, publish_samples=samples.append))
    assert result.status == "completed", result.error
    assert [e.step for e in events] == [1, 2]
    for event in events:
        assert all(event.HasField(name) for name in EPISODE_FIELDS), event
        assert 1 <= event.turns_mean <= event.turns_max <= 3
        # the game answers every wrong guess: observations exist whenever an episode went on
        assert (event.observation_tokens_mean > 0) == (event.turns_max > 1)
        assert event.episode_tokens_mean >= event.completion_length_mean  # sampled + observations
        assert event.tool_calls == 0 and event.failed_episodes == 0
    assert samples and "[turn 1]" in samples[0].samples[0].completion  # shown turn by turn


class Scripted:
    """A PolicyGenerator that answers an episode's turn t with guess t of its script (the turn read
    from the prompt: its assistant headers)."""

    def __init__(self, tokenizer: Any, guesses: Sequence[str]) -> None:
        self.tokenizer, self.guesses, self.calls = tokenizer, list(guesses), []
        self.lock = threading.Lock()

    def generate(self, prompts: Sequence[list[int]], sampling: Sampling, expected: AdapterTag) -> RolloutBatch:
        turn = self.tokenizer.decode(prompts[0]).count("<|im_start|>assistant") - 1
        with self.lock:
            self.calls.append((list(prompts[0]), sampling))
        text = self.guesses[turn % len(self.guesses)]
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        return RolloutBatch([list(prompts[0])], [ids], [[-0.5] * len(ids)], [False], expected, 0.01)


def _step(tmp_path: Path, tiny_model: str, guesses: Sequence[str], environment: str = "guess_number",
          reward: str = "guess_number", **overrides: Any):
    from transformers import AutoTokenizer

    from rlvr.services.trainer.job.episodes import EpisodeRollout
    from rlvr.services.trainer.job.prompts import rendered_with, training_problems
    from rlvr.services.trainer.job.step import Step, StepContext, StepHooks

    job = _job(tmp_path, tiny_model, environment=environment, reward_function=reward, **overrides)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    problems, instruction = training_problems(job)
    episodes = EpisodeRollout(job, tokenizer, instruction)
    rendered = rendered_with(tokenizer, problems[:2], episodes.instruction)
    generator = Scripted(tokenizer, guesses)
    ctx = StepContext(job=job, tokenizer=tokenizer, generator=generator,  # type: ignore[arg-type]
                      scorer=LocalScorer(ScoreSettings(reward)),
                      hooks=StepHooks(save_adapter=lambda m, s: tmp_path, publish=lambda e: None,
                                      cancel=threading.Event()),
                      total_steps=1, truth={t: p.ground_truth for t, p in rendered}, draw=None,
                      live=AdapterTag("job-e1", 0), problems={(t, p.ground_truth): p for t, p in rendered},
                      episodes=episodes)
    step = Step(ctx, 1)
    prompts = [t for t, _ in rendered for _ in range(job.group_size)]
    return step, step.rollout(prompts), tokenizer, generator


def test_a_steps_rows_are_the_episodes_ids_with_observations_masked(tmp_path: Path, tiny_model: str) -> None:
    step, rows, tokenizer, generator = _step(tmp_path, tiny_model, ["<answer>50</answer>", "<answer>25</answer>"])
    assert set(rows) == {"prompt_ids", "completion_ids", "logprobs", "env_mask", "score"}
    assert len(rows["completion_ids"]) == 4  # 2 prompts x group 2: one row per episode
    for completion, mask, logprobs in zip(rows["completion_ids"], rows["env_mask"], rows["logprobs"], strict=True):
        sampled = [t for t, m in zip(completion, mask, strict=True) if m]
        observed = tokenizer.decode([t for t, m in zip(completion, mask, strict=True) if not m])
        assert tokenizer.decode(sampled, skip_special_tokens=True) in (
            "<answer>50</answer><answer>25</answer><answer>50</answer>",  # 3 turns, none right
            "<answer>50</answer>", "<answer>50</answer><answer>25</answer>")
        assert "higher" in observed.lower() or "lower" in observed.lower() or sum(mask) == len(mask)
        assert all(lp == -0.5 for lp, m in zip(logprobs, mask, strict=True) if m)
    # every turn's prompt extends an earlier turn's prompt with what followed it: nothing re-rendered
    prompts = sorted((p for p, _ in generator.calls), key=len)
    for later in (p for p in prompts if len(p) > min(map(len, prompts))):
        assert any(later[: len(earlier)] == earlier for earlier in prompts if len(earlier) < len(later))
    assert len({s.seed for _, s in generator.calls}) == len(generator.calls)  # a seed per episode turn
    record = step.record
    assert record.episodes is not None and len(record.episodes.turns) == 4
    assert [s.reward for s in rows["score"]] == [s.reward for s in record.scores]


def test_a_failing_environment_fails_its_episodes_and_the_step_only_when_all_fail(
        tmp_path: Path, tiny_model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlvr.environments.builtin import guess_number
    from rlvr.services.trainer.job.episodes import EpisodeFailure

    game = guess_number.ENVIRONMENT.environment_class
    original = game.reset
    calls = {"n": 0}

    def flaky(self, row):  # noqa: ANN001, ANN202
        calls["n"] += 1
        if calls["n"] % 2:
            raise RuntimeError("board missing")
        return original(self, row)

    monkeypatch.setattr(game, "reset", flaky)
    step, rows, _, _ = _step(tmp_path, tiny_model, ["<answer>50</answer>"])
    errors = [s.error for s in rows["score"]]
    assert sum(bool(e) for e in errors) == 2 and all("board missing" in e for e in errors if e)
    assert all(s.reward == 0 for s in rows["score"] if s.error)
    for score, mask in zip(rows["score"], rows["env_mask"], strict=True):  # a failed episode is not trained on
        assert (sum(mask) == 0) == bool(score.error)
    assert step.record.episodes.failed == 2

    def broken(self, row):  # noqa: ANN001, ANN202
        raise RuntimeError("board missing")

    monkeypatch.setattr(game, "reset", broken)
    with pytest.raises(EpisodeFailure, match="every episode of the step failed.*board missing"):
        _step(tmp_path / "all", tiny_model, ["<answer>50</answer>"])


def test_a_resumed_environment_job_ends_with_the_uninterrupted_runs_adapter_bit_for_bit(
        tmp_path: Path, tiny_model: str) -> None:
    import torch
    from safetensors.torch import load_file

    options: dict[str, Any] = dict(max_steps=3, checkpoint_every=2)
    scorer = LocalScorer(ScoreSettings("guess_number"))
    whole = run_job(_job(tmp_path / "whole", tiny_model, **options), JobDeps(scorer=scorer, publish=lambda e: None))
    assert whole.status == "completed", whole.error

    def lost(step: int, total: int) -> None:
        if step == 3:
            raise RuntimeError("the trainer was lost")

    root = tmp_path / "resumed"
    first = run_job(_job(root, tiny_model, **options), JobDeps(scorer=scorer, publish=lambda e: None, on_step=lost))
    assert first.status == "failed"
    resumed = run_job(_job(root, tiny_model, resume=True, **options), JobDeps(scorer=scorer, publish=lambda e: None))
    assert resumed.status == "completed", resumed.error
    expected = load_file(str(Path(whole.adapter_path) / "adapter_model.safetensors"))
    got = load_file(str(Path(resumed.adapter_path) / "adapter_model.safetensors"))
    assert set(expected) == set(got) and all(torch.equal(expected[k], got[k]) for k in expected)


@pytest.mark.parametrize("offset", [0, 3])
def test_a_turn_samples_the_same_stream_whatever_the_processes_share_of_the_step(offset: int) -> None:
    """A process whose share of the step starts at prompt `offset` seeds its first prompt as that
    prompt of the step; the episode's turn seed already says where it is, so the stream the engine
    samples from (prompt_seed of the request's seed and the prompt's place) is the same."""
    import asyncio

    from rlvr.seeds import prompt_seed
    from rlvr.services.trainer.job.episodes import GeneratorSampler

    seen: list[int] = []

    class Generator:
        prompt_offset = offset

        def generate(self, prompts, sampling, expected):  # noqa: ANN001, ANN202
            seen.append(prompt_seed(sampling.from_prompt(self.prompt_offset).seed, 0))  # what the engine draws from
            return RolloutBatch([prompts[0]], [[1]], [[-0.1]], [False], expected, 0.0)

    sampler = GeneratorSampler(Generator(), Sampling(temperature=1.0), AdapterTag(), newest=False, workers=1)
    try:
        asyncio.run(sampler.sample([5, 6], 32, seed=12345))
    finally:
        sampler.close()
    assert seen == [prompt_seed(12345, 0)]


# An agent program (rlvr/agents) as the job's environment: the built-in calculator_agent, plain
# `openai` client code whose calls reach the job process's OpenAI-compatible endpoint.
CALCULATE = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "9 * 11"}}\n</tool_call>'
TURNS = dict(max_completion_tokens=96, max_episode_tokens=300)  # the tool call is 85 tokens of the test model


def test_an_agent_job_trains_on_its_episodes_and_reports_their_metrics(
        tmp_path: Path, tiny_model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlvr.agents.gateway import Gateway

    opened: list[str] = []
    real_open = Gateway.open

    def open_session(self: Gateway, recorder: Any, loop: Any) -> str:  # the real endpoint, its sessions counted
        opened.append(real_open(self, recorder, loop))
        return opened[-1]

    monkeypatch.setattr(Gateway, "open", open_session)
    events: list[C.MetricEvent] = []
    samples: list[C.CompletionSamples] = []
    job = _job(tmp_path, tiny_model, environment="calculator_agent", reward_function="math_pairs", max_turns=2)
    result = run_job(job, JobDeps(scorer=LocalScorer(ScoreSettings("math_pairs")), publish=events.append,
                                  publish_samples=samples.append))
    assert result.status == "completed", result.error
    assert [e.step for e in events] == [1, 2]
    for event in events:
        assert all(event.HasField(name) for name in EPISODE_FIELDS), event
        assert 1 <= event.turns_mean <= event.turns_max <= 2
        assert event.failed_episodes == 0  # every agent episode ran to its end
        assert event.episode_tokens_mean >= event.completion_length_mean
    assert samples and "[turn 1]" in samples[0].samples[0].completion
    assert len(set(opened)) == 2 * 4  # 2 steps of 4 episodes, each the agent's own run through the endpoint


def test_an_agent_steps_rows_are_its_episodes_exact_ids_with_the_tool_result_masked(
        tmp_path: Path, tiny_model: str) -> None:
    script = [CALCULATE, "<answer>99</answer>"]
    step, rows, tokenizer, generator = _step(tmp_path, tiny_model, script, "calculator_agent", "math_pairs", **TURNS)
    assert set(rows) == {"prompt_ids", "completion_ids", "logprobs", "env_mask", "score"}
    assert len(rows["completion_ids"]) == 4 and len(generator.calls) == 8  # 4 episodes of 2 model calls
    said = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for t in script]
    turns = {tuple(p): n for p, n in ((p, tokenizer.decode(p).count("<|im_start|>assistant")) for p, _ in generator.calls)}
    for prompt, completion, mask, logprobs in zip(rows["prompt_ids"], rows["completion_ids"], rows["env_mask"],
                                                  rows["logprobs"], strict=True):
        assert turns[tuple(prompt)] == 1  # the episode's first call's prompt, as sampled
        observation = [t for t, m in zip(completion, mask, strict=True) if not m]
        # the exact ids: the first turn as sampled, the tool result (mask 0), the second turn as sampled
        assert completion == said[0] + observation + said[1]
        assert mask == [1] * len(said[0]) + [0] * len(observation) + [1] * len(said[1])
        assert tokenizer.decode(observation) == "\n<|im_start|>tool\n99<|im_end|>\n<|im_start|>assistant\n"
        assert tuple(prompt + completion[:len(said[0]) + len(observation)]) in turns  # the second call's prompt
        assert all(lp == -0.5 for lp, m in zip(logprobs, mask, strict=True) if m)
    # the job's reward (math_pairs) scored the agent's last answer
    assert all(s.extracted_answer == "99" and not s.error for s in rows["score"])
    record = step.record
    assert record.episodes is not None and record.episodes.turns == [2, 2, 2, 2]
    assert record.episodes.tool_calls == 4 and record.episodes.failed == 0
    # The calculator environment, with the same script: the same rows, token for token.
    _, env_rows, _, _ = _step(tmp_path / "env", tiny_model, script, "calculator", "math_pairs", **TURNS)
    for name in ("prompt_ids", "completion_ids", "env_mask", "logprobs"):
        assert rows[name] == env_rows[name], name


def test_a_failing_agent_fails_its_own_episodes_masked_and_scored_0_and_the_step_only_when_all_fail(
        tmp_path: Path, tiny_model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlvr.agents.builtin import calculator
    from rlvr.services.trainer.job.episodes import EpisodeFailure

    calls = {"n": 0}

    def flaky(name: str, arguments: str) -> str:  # the agent's own tool code raises, in every other episode
        calls["n"] += 1
        if calls["n"] % 2:
            raise RuntimeError("calculator offline")
        return "99"

    monkeypatch.setattr(calculator, "calculate", flaky)
    script = [CALCULATE, "<answer>99</answer>"]
    step, rows, _, _ = _step(tmp_path, tiny_model, script, "calculator_agent", "math_pairs", **TURNS)
    errors = [s.error for s in rows["score"]]
    assert sum(bool(e) for e in errors) == 2
    assert all("the agent raised RuntimeError: calculator offline" in e for e in errors if e)
    for score, mask in zip(rows["score"], rows["env_mask"], strict=True):
        assert (score.reward == 0 and sum(mask) == 0) if score.error else sum(mask) > 0  # not trained on
    assert step.record.episodes.failed == 2

    def broken(name: str, arguments: str) -> str:
        raise RuntimeError("calculator offline")

    monkeypatch.setattr(calculator, "calculate", broken)
    with pytest.raises(EpisodeFailure, match="every episode of the step failed.*calculator offline"):
        _step(tmp_path / "all", tiny_model, script, "calculator_agent", "math_pairs", **TURNS)
