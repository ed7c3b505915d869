"""rlvr.episodes.loop: one episode's turns between a scripted policy and an environment.

The policy is a script of token ids (no model), the codec the real ChatCodec over the tiny model's
template and tokenizer (and Qwen3's, for a split). What is checked: the sample's stream is the whole
conversation tokenized at once; the mask-1 ids decode to exactly what the policy sampled; limits end
an episode where they say; the environment's failures end that episode only; a slow episode holds
up no other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from rlvr.environments.base import Environment, EpisodeRow, Reply, tool
from rlvr.episodes.chat import ChatCodec
from rlvr.episodes.loop import EpisodeLimits, EpisodeTask, TurnOutput, run_episode, run_episodes, turn_seed
from rlvr.tiny.tokenizer import build_tokenizer

TOKENIZER = build_tokenizer()
CODEC = ChatCodec(TOKENIZER)
LIMITS = EpisodeLimits(max_turns=6, max_tokens_per_turn=64, max_episode_tokens=2000)


def ids(text: str) -> list[int]:
    return TOKENIZER(text, add_special_tokens=False)["input_ids"]


class Script:
    """A TurnSampler answering with the next text of its script (each followed by the stop token,
    unless it is marked cut), recording the prompts and seeds it was asked with."""

    def __init__(self, texts: Sequence[str], version: int = 3, cut: Sequence[int] = ()) -> None:
        self.texts, self.version, self.cut = list(texts), version, set(cut)
        self.calls: list[tuple[list[int], int, int]] = []

    async def sample(self, prompt_ids: list[int], max_tokens: int, seed: int) -> TurnOutput:
        turn = len(self.calls)
        self.calls.append((list(prompt_ids), max_tokens, seed))
        text = self.texts[turn]
        out = ids(text)[:max_tokens] if turn in self.cut else ids(text) + CODEC.stop_ids[:1]
        return TurnOutput(out, [-0.25] * len(out), "length" if turn in self.cut else "stop", "job-x", self.version)


class Game(Environment):
    """Higher/lower: the secret is the row's ground truth; replies until it is guessed."""

    def __init__(self) -> None:
        self.secret, self.guesses = 0, 0

    def reset(self, row: EpisodeRow) -> str:
        self.secret = int(row.ground_truth)
        return "Guess a number from 1 to 9."

    def step(self, text: str) -> Reply:
        self.guesses += 1
        guess = int(text.split()[-1])
        if guess == self.secret:
            return Reply(done=True, reward=0.1)
        return Reply(text="higher" if guess < self.secret else "lower")

    def reward(self) -> float:
        return 1.0

    def state(self) -> dict[str, int]:
        return {"guesses": self.guesses}


def play(env: Environment, script: Script, limits: EpisodeLimits = LIMITS, truth: str = "7", codec=CODEC):
    task = EpisodeTask(env, EpisodeRow("Play.", ground_truth=truth), [{"role": "user", "content": "Play."}], seed=11)
    return asyncio.run(run_episode(task, script, lambda _schemas: codec, limits,
                                   lambda i: TOKENIZER.decode(i, skip_special_tokens=True)))


def sampled_text(sample) -> str:
    return TOKENIZER.decode([t for t, m in zip(sample.completion_ids, sample.mask, strict=True) if m],
                            skip_special_tokens=True)


def test_a_game_episode_is_the_whole_conversation_tokenized_once() -> None:
    episode = play(Game(), Script(["I guess 3", "I guess 8", "I guess 7"]))
    assert episode.ended_by == "done" and episode.error == ""
    assert [t.reply for t in episode.turns] == ["higher", "lower", None]
    [sample] = episode.samples
    whole = TOKENIZER.apply_chat_template(episode.messages, tokenize=False)
    assert whole.startswith("<|im_start|>user\nPlay.\n\nGuess a number from 1 to 9.<|im_end|>")  # reset's text
    stream = TOKENIZER.decode(sample.prompt_ids + sample.completion_ids)
    assert whole == stream + "\n"  # the last turn's closing "\n" is not sampled, so not appended
    assert sampled_text(sample) == "I guess 3I guess 8I guess 7"  # no environment text is trained on
    assert all(lp == -0.25 for lp, m in zip(sample.logprobs, sample.mask, strict=True) if m)
    assert all(lp == 0.0 for lp, m in zip(sample.logprobs, sample.mask, strict=True) if not m)
    assert [(s.adapter_name, s.adapter_version) for s in sample.segments] == [("job-x", 3)] * 3
    assert episode.env_reward == 1.0 and episode.turn_rewards == [0.1] and episode.env_state == {"guesses": 3}
    assert episode.observation_tokens == sum(1 - m for m in sample.mask)


def test_each_turn_samples_from_the_stream_so_far_with_its_own_seed() -> None:
    script = Script(["I guess 3", "I guess 7"])
    episode = play(Game(), script)
    first, second = script.calls
    assert [c[2] for c in script.calls] == [turn_seed(11, 0), turn_seed(11, 1)]
    sample = episode.samples[0]
    assert first[0] == sample.prompt_ids
    assert second[0] == sample.prompt_ids + sample.completion_ids[: len(second[0]) - len(sample.prompt_ids)]
    assert second[0][-len(ids("assistant\n")):] == ids("assistant\n")  # the next turn's header ends it


def test_max_turns_ends_the_episode_and_the_last_reply_is_not_trained_on() -> None:
    episode = play(Game(), Script(["I guess 1", "I guess 2"]), EpisodeLimits(2, 64, 2000))
    assert episode.ended_by == "max_turns" and len(episode.turns) == 2
    assert episode.messages[-1] == {"role": "user", "content": "higher"}  # shown, not appended to the sample
    assert TOKENIZER.decode(episode.samples[0].completion_ids).endswith("I guess 2<|im_end|>")


def test_a_turn_cut_at_its_limit_ends_the_episode_truncated() -> None:
    episode = play(Game(), Script(["I guess 3", "I guess 5 and more"], cut=[1]))
    assert episode.truncated and episode.ended_by == "length" and len(episode.turns) == 2


def test_the_episode_token_cap_rolls_back_an_observation_and_shrinks_the_last_turn() -> None:
    long_reply = "higher " * 40

    class Chatty(Game):
        def step(self, text: str) -> Reply:
            return Reply(text=long_reply)

    first = len(ids("I guess 3")) + 1
    episode = play(Chatty(), Script(["I guess 3", "I guess 4"]), EpisodeLimits(6, 64, first + 100))
    assert episode.ended_by == "token_cap" and episode.truncated and episode.observations_cut == 1
    assert len(episode.turns) == 1 and episode.samples[0].completion_ids == ids("I guess 3") + CODEC.stop_ids[:1]
    script = Script(["I guess 3", "I guess 4"])
    capped = play(Game(), script, EpisodeLimits(6, 64, first + 30))
    assert script.calls[1][1] == first + 30 - first - capped.observation_tokens  # the room left, not 64


@pytest.mark.parametrize("stage", ["reset", "step", "reward"])
def test_an_environment_that_raises_ends_its_episode_with_the_reason(stage: str) -> None:
    class Broken(Game):
        def reset(self, row: EpisodeRow) -> str:
            if stage == "reset":
                raise RuntimeError("no board")
            return super().reset(row)

        def step(self, text: str) -> Reply:
            if stage == "step":
                raise ValueError("bad move")
            return super().step(text)

        def reward(self) -> float:
            if stage == "reward":
                raise KeyError("score")
            return 1.0

    closed = []
    env = Broken()
    env.close = lambda: closed.append(True)  # type: ignore[method-assign]
    episode = play(env, Script(["I guess 7"]))
    assert episode.ended_by == "error" and episode.error.startswith(f"environment {stage} failed: ")
    assert closed == [True]  # closed whatever happened


def test_a_slow_episode_holds_up_no_other() -> None:
    """The slow environment's step waits on an event the fast episodes set when they end: with a
    per-turn barrier across the batch the run would never finish."""
    done = asyncio.Event()
    finished: list[str] = []

    class Fast(Game):
        def step(self, text: str) -> Reply:
            reply = super().step(text)
            if reply.done:
                finished.append("fast")
                if len(finished) == 3:
                    done.set()
            return reply

    class Slow(Game):
        async def step(self, text: str) -> Reply:
            await asyncio.wait_for(done.wait(), timeout=30)
            finished.append("slow")
            return Reply(done=True)

    async def run() -> None:
        sampler = Script(["I guess 7"] * 8)
        tasks = [EpisodeTask(env, EpisodeRow("Play.", ground_truth="7"), [{"role": "user", "content": "Play."}], i)
                 for i, env in enumerate([Slow(), Fast(), Fast(), Fast()])]
        await run_episodes(tasks, sampler, lambda _s: CODEC, LIMITS,
                           lambda i: TOKENIZER.decode(i, skip_special_tokens=True))

    asyncio.run(run())
    assert finished == ["fast", "fast", "fast", "slow"]


def test_a_template_that_re_renders_earlier_turns_splits_the_episode() -> None:
    from test_episode_chat import codec_for

    codec = codec_for("tiny", "qwen3-think", tools=None)
    tokenizer = codec.tokenizer

    class Think:
        def __init__(self) -> None:
            self.turn = 0

        async def sample(self, prompt_ids: list[int], max_tokens: int, seed: int) -> TurnOutput:
            self.turn += 1
            text = f"<think>\nhm {self.turn}\n</think>\n\nI guess {3 if self.turn == 1 else 7}"
            out = tokenizer(text, add_special_tokens=False)["input_ids"] + codec.stop_ids[:1]
            return TurnOutput(out, None, "stop")

    task = EpisodeTask(Game(), EpisodeRow("Play.", ground_truth="7"), [{"role": "user", "content": "Play."}], 1)
    episode = asyncio.run(run_episode(task, Think(), lambda _s: codec, LIMITS,
                                      lambda i: tokenizer.decode(i, skip_special_tokens=True)))
    assert episode.ended_by == "done" and len(episode.samples) == 2  # the user's "higher" re-rendered turn 1
    second = episode.samples[1]
    assert second.prompt_ids == codec.prompt_ids(episode.messages[:3])  # rendered afresh, "higher" included
    assert "hm 2" in tokenizer.decode(second.completion_ids) and "hm 1" not in tokenizer.decode(second.completion_ids)


class Calculator(Environment):
    @tool
    def add(self, a: int, b: int) -> int:
        """Adds two integers.

        Args:
            a: the first
            b: the second
        """
        return a + b

    @tool
    def boom(self) -> str:
        """Always fails."""
        raise RuntimeError("kaput")


def test_tool_calls_run_and_their_results_are_observations() -> None:
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    bad = '<tool_call>\n{"name": "boom", "arguments": {}}\n</tool_call><tool_call>not json</tool_call>'
    episode = play(Calculator(), Script([call, bad, "It is 5"]))
    assert episode.ended_by == "done" and len(episode.turns) == 3
    assert episode.tool_calls == 3 and episode.tool_errors == 2
    first = episode.turns[0].tool_calls[0]
    assert (first["name"], first["arguments"], first["result"], first["error"]) == ("add", {"a": 2, "b": 3}, "5", "")
    sample = episode.samples[0]
    assert sampled_text(sample) == call + bad + "It is 5"
    stream = TOKENIZER.decode(sample.prompt_ids + sample.completion_ids)
    assert "<|im_start|>tool\n5<|im_end|>" in stream and "kaput" in stream
    assert stream + "\n" == TOKENIZER.apply_chat_template(episode.messages, tokenize=False)


def test_a_sampler_failure_cancels_the_other_episodes_and_is_raised() -> None:
    started: list[int] = []
    cancelled: list[int] = []

    class Failing:
        async def sample(self, prompt_ids: list[int], max_tokens: int, seed: int) -> TurnOutput:
            started.append(seed)
            if len(started) == 1:
                await asyncio.sleep(0)
                raise RuntimeError("rollout service gone")
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.append(seed)
                raise
            raise AssertionError("not cancelled")

    tasks = [EpisodeTask(Game(), EpisodeRow("Play.", ground_truth="7"), [{"role": "user", "content": "Play."}], i)
             for i in range(3)]
    with pytest.raises(RuntimeError, match="rollout service gone"):
        asyncio.run(run_episodes(tasks, Failing(), lambda _s: CODEC, LIMITS,
                                 lambda i: TOKENIZER.decode(i, skip_special_tokens=True)))
    assert len(started) == 3 and len(cancelled) == 2


def test_a_turn_ended_on_a_token_the_template_never_ends_a_turn_with_ends_the_episode() -> None:
    class EndOfText(Script):
        async def sample(self, prompt_ids: list[int], max_tokens: int, seed: int) -> TurnOutput:
            out = await super().sample(prompt_ids, max_tokens, seed)
            ids = out.token_ids[:-1] + [TOKENIZER.convert_tokens_to_ids("<|endoftext|>")]
            return TurnOutput(ids, out.logprobs, "stop", out.adapter_name, out.adapter_version)

    episode = play(Game(), EndOfText(["I guess 3", "I guess 7"]))
    assert episode.ended_by == "other_stop" and len(episode.turns) == 1
    assert sum(1 - m for m in episode.samples[0].mask) == 0  # nothing appended after it


def test_a_later_turn_gets_only_the_room_the_engine_s_context_leaves() -> None:
    script = Script(["I guess 3", "I guess 7"])
    first = play(Game(), script)
    prompt, completion = len(first.samples[0].prompt_ids), len(ids("I guess 3")) + 1
    context = prompt + completion + first.turns[0].observation_tokens + 40
    script = Script(["I guess 3", "I guess 7"])
    episode = play(Game(), script, EpisodeLimits(6, 64, 2000, max_context_tokens=context))
    assert [c[1] for c in script.calls] == [64, 40]
    assert episode.ended_by == "done"
    tight = play(Game(), Script(["I guess 3", "I guess 7"]),
                 EpisodeLimits(6, 64, 2000, min_turn_tokens=41, max_context_tokens=context))
    assert tight.ended_by == "token_cap" and tight.truncated  # under the sampler's floor: no turn sampled
    assert len(tight.turns) == 1


def test_a_rolled_back_observation_is_not_in_the_conversation() -> None:
    class Chatty(Game):
        def step(self, text: str) -> Reply:
            return Reply(text="higher " * 40)

    episode = play(Chatty(), Script(["I guess 3"]), EpisodeLimits(6, 64, len(ids("I guess 3")) + 1 + 60))
    assert episode.observations_cut == 1 and episode.messages[-1]["role"] == "assistant"


def test_an_environment_that_cannot_go_on_in_a_tool_ends_the_episode() -> None:
    from rlvr.environments.base import EnvironmentFailure

    class Gone(Environment):
        @tool
        def look(self, where: str) -> str:
            """Looks somewhere.

            Args:
                where: a place
            """
            raise EnvironmentFailure("the game server at 10.0.0.7:7000 is gone")

    call = '<tool_call>\n{"name": "look", "arguments": {"where": "north"}}\n</tool_call>'
    episode = play(Gone(), Script([call, "done"]))
    assert episode.ended_by == "error" and episode.error.startswith("environment tool failed: EnvironmentFailure")
    assert len(episode.turns) == 1  # the policy never read it as a tool result


def test_a_template_that_refuses_what_a_turn_made_ends_that_episode_only() -> None:
    from test_episode_chat import TOOLS, codec_for

    codec = codec_for("tiny", "llama3.1", tools=TOOLS)
    tokenizer = codec.tokenizer
    two = '{"name": "add", "parameters": {"a": 1, "b": 2}}; {"name": "add", "parameters": {"a": 3, "b": 4}}'

    class Twice:
        async def sample(self, prompt_ids: list[int], max_tokens: int, seed: int) -> TurnOutput:
            out = tokenizer(two, add_special_tokens=False)["input_ids"] + codec.turn_enders[:1]
            return TurnOutput(out, None, "stop")

    task = EpisodeTask(Calculator(), EpisodeRow("Add."), [{"role": "user", "content": "Add."}], 1)
    episode = asyncio.run(run_episode(task, Twice(), lambda _s: codec, LIMITS,
                                      lambda i: tokenizer.decode(i, skip_special_tokens=True)))
    assert episode.ended_by == "error" and "environment template failed" in episode.error
    assert "single tool-calls" in episode.error


def test_a_plain_environment_method_that_blocks_holds_up_no_other_episode() -> None:
    import threading

    released = threading.Event()
    finished: list[str] = []

    class Fast(Game):
        def step(self, text: str) -> Reply:
            finished.append("fast")
            released.set()
            return Reply(done=True)

    class Blocking(Game):
        def step(self, text: str) -> Reply:  # a plain method that waits: run in a thread, not on the loop
            assert released.wait(timeout=30)
            finished.append("blocking")
            return Reply(done=True)

    tasks = [EpisodeTask(env, EpisodeRow("Play.", ground_truth="7"), [{"role": "user", "content": "Play."}], i)
             for i, env in enumerate([Blocking(), Fast()])]
    asyncio.run(run_episodes(tasks, Script(["I guess 7"] * 4), lambda _s: CODEC, LIMITS,
                             lambda i: TOKENIZER.decode(i, skip_special_tokens=True)))
    assert finished == ["fast", "blocking"]
