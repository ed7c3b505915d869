"""rlvr.agents: an agent program (plain `openai` client code) as the policy, through the real endpoint.

The policy is a script of token ids (no model); the agent's calls go through the real `openai`
client to the process's real OpenAI-compatible endpoint (rlvr/agents/gateway.py), and the chat
codec is the real one over the tools model's template and tokenizer. What is checked: the recorded
ids are what the policy sampled and the mask-1 ids decode to exactly its text; the calculator agent's
episode is token for token the calculator environment's; a rewritten history splits the episode and
is counted; an agent that raises, runs too long or returns garbage ends its own episode only; a
wrong or expired key and a bad request are refused with OpenAI's errors naming every bad field.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import openai
import pytest

from rlvr.agents import AgentResult, AgentRow, agent
from rlvr.agents.builtin.calculator import TOOLS, calculator_agent
from rlvr.agents.gateway import Gateway
from rlvr.agents.recorder import EpisodeRecorder
from rlvr.environments.base import EpisodeRow
from rlvr.environments.builtin import calculator
from rlvr.environments.tools import tool_schemas
from rlvr.episodes.chat import ChatCodecs
from rlvr.episodes.loop import EpisodeLimits, EpisodeTask, TurnOutput, run_episode, run_episodes, turn_seed
from rlvr.episodes.scoring import transcript
from rlvr.tiny.tokenizer import build_tokenizer

TOKENIZER = build_tokenizer(tool_tags=True)
CODECS = ChatCodecs(TOKENIZER)
LIMITS = EpisodeLimits(max_turns=4, max_tokens_per_turn=96, max_episode_tokens=2000, min_turn_tokens=1)
CALL = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "17 * 23"}}\n</tool_call>'
PROMPT = [{"role": "user", "content": "What is 17 * 23?\n\n" + calculator.ENVIRONMENT.instruction}]


def ids(text: str) -> list[int]:
    return TOKENIZER(text, add_special_tokens=False)["input_ids"]


class Script:
    """A TurnSampler answering with the next text of its script followed by the stop token (unless
    it is marked cut), recording the prompts and seeds it was asked with."""

    def __init__(self, texts: Sequence[str], cut: Sequence[int] = ()) -> None:
        self.texts, self.cut = list(texts), set(cut)
        self.calls: list[tuple[list[int], int, int]] = []
        self.sampled: list[list[int]] = []

    async def sample(self, prompt_ids: list[int], max_tokens: int, seed: int) -> TurnOutput:
        turn = len(self.calls)
        self.calls.append((list(prompt_ids), max_tokens, seed))
        stop = CODECS([]).stop_ids[:1]
        out = ids(self.texts[turn])[:max_tokens] if turn in self.cut else ids(self.texts[turn]) + stop
        self.sampled.append(out)
        return TurnOutput(out, [-0.5] * len(out), "length" if turn in self.cut else "stop", "job-a", 2)


def run(env, script: Script, limits: EpisodeLimits = LIMITS, seed: int = 5):
    task = EpisodeTask(env, EpisodeRow("What is 17 * 23?", ground_truth="391", seed=seed), [dict(m) for m in PROMPT],
                       seed)
    return asyncio.run(run_episode(task, script, CODECS, limits, CODECS.decode))


def agent_env(fn, **declared):
    return agent("test_agent", **declared)(fn).__rlvr_environment__.make()


def sampled_text(sample) -> str:
    return TOKENIZER.decode([t for t, m in zip(sample.completion_ids, sample.mask, strict=True) if m],
                            skip_special_tokens=True)


def test_the_calculator_agent_records_what_was_sampled_and_renders_as_the_environment_does() -> None:
    script = Script([CALL, "<answer>391</answer>"])
    episode = run(calculator_agent.__rlvr_environment__.make(), script)
    assert episode.error == "" and episode.ended_by == "answer" and len(episode.turns) == 2
    [sample] = episode.samples  # one sample: the tool result was appended, nothing re-rendered
    assert [c[0] for c in script.calls] == [sample.prompt_ids, (sample.prompt_ids + sample.completion_ids)[
        :len(script.calls[1][0])]]
    assert [c[2] for c in script.calls] == [turn_seed(5, 0), turn_seed(5, 1)]
    sampled = [t for t, m in zip(sample.completion_ids, sample.mask, strict=True) if m]
    assert sampled == script.sampled[0] + script.sampled[1]  # the exact ids, in order
    assert sampled_text(sample) == CALL + "<answer>391</answer>"  # decoding the mask-1 ids gives the text back
    assert all(lp == -0.5 for lp, m in zip(sample.logprobs, sample.mask, strict=True) if m)
    assert "<|im_start|>tool\n391<|im_end|>" in TOKENIZER.decode(sample.completion_ids)  # observation, mask 0
    assert episode.tool_calls == 1 and episode.turns[0].tool_calls[0]["result"] == "391"
    assert episode.final_answer == "<answer>391</answer>" and episode.env_reward is None  # the job's reward scores
    # The environment-class version of the same task, with the same script: the same tokens and mask.
    assert tool_schemas(calculator.ENVIRONMENT.make()) == TOOLS
    env_episode = run(calculator.ENVIRONMENT.make(), Script([CALL, "<answer>391</answer>"]))
    [env_sample] = env_episode.samples
    assert (env_sample.prompt_ids, env_sample.completion_ids, env_sample.mask) == (
        sample.prompt_ids, sample.completion_ids, sample.mask)


def test_an_agent_that_rewrites_its_history_splits_the_episode_and_it_is_counted() -> None:
    async def summarising(client: openai.AsyncOpenAI, row: AgentRow) -> float:
        first = await client.chat.completions.create(model="m", messages=row.messages, tools=TOOLS)
        call = first.choices[0].message.tool_calls[0]
        # The agent keeps a summary instead of its history: the next prompt does not extend the last.
        summary = [{"role": "user", "content": f"{row.prompt} A calculator said {json.loads(call.function.arguments)}"
                                               " is 391. Answer."}]
        second = await client.chat.completions.create(model="m", messages=summary)
        return 1.0 if "391" in (second.choices[0].message.content or "") else 0.0

    script = Script([CALL, "<answer>391</answer>"])
    episode = run(agent_env(summarising), script)
    assert episode.error == "" and episode.env_reward == 1.0
    assert len(episode.samples) == 2 and episode.env_state["splits"] == 1 and episode.env_state["history_rewrites"] == 1
    first, second = episode.samples
    assert script.calls[1][0] == second.prompt_ids  # the new sample's prompt is the rewritten history, rendered afresh
    assert TOKENIZER.decode(second.prompt_ids).startswith("<|im_start|>user\nWhat is 17 * 23? A calculator said")
    assert sampled_text(first) == CALL and sampled_text(second) == "<answer>391</answer>"
    assert second.mask == [1] * len(second.completion_ids)
    # The step's metrics count the split (MetricEvent.episode_splits); the trainer trains the last sample.
    from rlvr.services.trainer.job.episodes import EpisodeStats
    from rlvr.v1 import common_pb2

    stats, event = EpisodeStats(), common_pb2.MetricEvent()
    stats.add(episode)
    stats.add(run(calculator_agent.__rlvr_environment__.make(), Script([CALL, "<answer>391</answer>"])))
    stats.fill(event)
    assert event.episode_splits == 1 and event.turns_mean == 2.0 and event.tool_calls == 2


@pytest.mark.parametrize("failure", ["raises", "timeout", "garbage"])
def test_an_agent_that_fails_ends_its_own_episode_with_the_reason(failure: str) -> None:
    async def failing(client: openai.AsyncOpenAI, row: AgentRow):
        await client.chat.completions.create(model="m", messages=row.messages)
        if failure == "raises":
            raise KeyError("no such field")
        if failure == "timeout":
            await asyncio.sleep(30)
        return "391"

    # 2 s of the agent's own time: room for the client's own work on a loaded host
    episode = run(agent_env(failing, timeout_seconds=2), Script(["<answer>391</answer>"]))
    assert episode.ended_by == "error"
    assert {"raises": "the agent raised KeyError: 'no such field'",
            "timeout": "the agent took longer than its time limit of 2 s",
            "garbage": "the agent's result: the agent returned a str; expected a number"}[failure] in episode.error
    assert len(episode.turns) == 1  # what it sampled is still recorded (and the trainer masks it out)


def test_calls_past_the_turn_limit_are_answered_empty_and_end_the_episode_truncated() -> None:
    async def looping(client: openai.AsyncOpenAI, row: AgentRow) -> AgentResult:
        messages, finishes = list(row.messages), []
        while len(finishes) < 10:
            reply = await client.chat.completions.create(model="m", messages=messages)
            finishes.append(reply.choices[0].finish_reason)
            if finishes[-1] == "length":
                break
            messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "again"}]
        return AgentResult(reward=0.5, components={"tries": float(len(finishes))}, answer=" ".join(finishes))

    script = Script(["one", "two", "three"])
    episode = run(agent_env(looping, max_turns=2), script, EpisodeLimits(2, 96, 2000, min_turn_tokens=1))
    assert len(script.calls) == 2 and episode.ended_by == "max_turns" and episode.truncated
    assert episode.final_answer == "stop stop length" and episode.env_state["calls_past_limits"] == 1
    assert episode.env_reward.score == 0.5 and episode.env_reward.components == {"tries": 3.0}
    assert len(episode.samples) == 1 and sampled_text(episode.samples[0]) == "onetwo"


def test_a_sampler_failure_fails_the_episode_run_not_just_the_agent() -> None:
    class Down:
        async def sample(self, prompt_ids, max_tokens, seed):
            raise ConnectionError("the rollout service is gone")

    with pytest.raises(ConnectionError, match="rollout service is gone"):
        run(calculator_agent.__rlvr_environment__.make(), Down())


def _session(script: Script) -> tuple[Gateway, str, EpisodeRecorder, asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    recorder = EpisodeRecorder(script, CODECS, LIMITS, CODECS.decode, seed=1)
    gateway = Gateway.shared()
    return gateway, gateway.open(recorder, loop), recorder, loop


def test_a_wrong_or_expired_key_is_refused_and_only_the_episode_key_reaches_its_episode() -> None:
    script = Script(["<answer>1</answer>", "<answer>2</answer>"])
    gateway, key, recorder, loop = _session(script)

    async def call(**client_args) -> str:
        async with openai.AsyncOpenAI(max_retries=0, **client_args) as client:
            reply = await client.chat.completions.create(model="m", messages=PROMPT)
            return reply.choices[0].message.content or ""

    root = f"http://{gateway.host}:{gateway.port}/v1"
    try:
        assert loop.run_until_complete(call(base_url=gateway.base_url(key), api_key=key)) == "<answer>1</answer>"
        assert loop.run_until_complete(call(base_url=root, api_key=key)) == "<answer>2</answer>"  # the key alone
        with pytest.raises(openai.AuthenticationError, match="unknown API key"):
            loop.run_until_complete(call(base_url=root, api_key="rlvr-ep-guess"))
        with pytest.raises(openai.AuthenticationError, match="not the key of the base URL"):
            loop.run_until_complete(call(base_url=gateway.base_url(key), api_key="another"))
        gateway.close(key)
        with pytest.raises(openai.AuthenticationError, match="expired"):
            loop.run_until_complete(call(base_url=gateway.base_url(key), api_key=key))
    finally:
        gateway.close(key)
        loop.close()
    assert len(script.calls) == 2 and len(recorder.episode.turns) == 2


def test_a_bad_request_is_refused_naming_every_bad_field() -> None:
    gateway, key, _, loop = _session(Script([]))

    async def call() -> None:
        async with openai.AsyncOpenAI(base_url=gateway.base_url(key), api_key=key, max_retries=0) as client:
            await client.chat.completions.create(model="m", messages=[{"role": "robot", "content": "hi"}], n=2,
                                                 temperature=7, max_tokens=0, tool_choice="always")

    try:
        with pytest.raises(openai.BadRequestError) as caught:
            loop.run_until_complete(call())
    finally:
        gateway.close(key)
        loop.close()
    message = str(caught.value)
    for field in ("messages[0].role: 'robot' is not one of", "tool_choice: 'always'", "max_tokens: 0",
                  "n: 2", "temperature: 7"):
        assert field in message


def test_the_endpoint_sends_each_answer_at_once_without_waiting_on_the_clients_ack() -> None:
    # With Nagle's algorithm an answer's body waited for the client's delayed ACK of its headers:
    # 45 ms on every call after an agent's first (bench/agent_gateway.py).
    handler = Gateway.shared().server.RequestHandlerClass
    assert getattr(handler, "disable_nagle_algorithm", False) is True


# ---------------------------------------------------------------- docs/agents.md

def test_the_pages_agent_trains_through_the_endpoint_and_runs_unchanged_with_any_client() -> None:
    import re
    from pathlib import Path

    page = Path(__file__).resolve().parent.parent / "docs" / "agents.md"
    source = next(code for lang, code in re.findall(r"```(\w+)\n(.*?)```", page.read_text(), re.DOTALL)
                  if lang == "python")
    namespace: dict[str, object] = {}
    exec(compile(source, str(page), "exec"), namespace)  # noqa: S102 (the page's own code)
    adder = namespace["adder"]
    definition = adder.__rlvr_environment__  # type: ignore[attr-defined]
    assert (definition.key, definition.display_name, definition.max_turns) == ("adder", "Adder", 3)
    assert definition.description == "Answers with the help of an add tool; scores itself against the row's answer."
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 17, "b": 25}}\n</tool_call>'
    # As a job's episode: through the endpoint, recorded, scored by what the function returned.
    task = EpisodeTask(definition.make(), EpisodeRow("What is 17 + 25?", ground_truth="42", seed=3),
                       [{"role": "user", "content": "What is 17 + 25?"}], 3)
    episode = asyncio.run(run_episode(task, Script([call, "<answer>42</answer>"]), CODECS, LIMITS, CODECS.decode))
    assert episode.error == "" and episode.env_reward.score == 1.0 and episode.final_answer == "<answer>42</answer>"
    assert "<|im_start|>tool\n42<|im_end|>" in TOKENIZER.decode(episode.samples[0].completion_ids)
    # The same function, called directly with a plain client against an OpenAI-compatible server.
    gateway, key, _, loop = _session(Script([call, "<answer>41</answer>"]))
    try:
        client = openai.AsyncOpenAI(base_url=gateway.base_url(key), api_key=key)
        result = loop.run_until_complete(adder(client, AgentRow("What is 17 + 25?", "42", messages=[
            {"role": "user", "content": "What is 17 + 25?"}])))
        loop.run_until_complete(client.close())
    finally:
        gateway.close(key)
        loop.close()
    assert result == AgentResult(reward=0.0, answer="<answer>41</answer>")


def test_a_call_with_other_tools_starts_a_new_sample_rendered_with_them() -> None:
    async def switching(client: openai.AsyncOpenAI, row: AgentRow) -> None:
        messages = list(row.messages)
        first = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "now alone"}]
        await client.chat.completions.create(model="m", messages=messages)  # no tools any more

    episode = run(agent_env(switching), Script(["<answer>1</answer>", "<answer>2</answer>"]))
    first, second = episode.samples  # (this template does not render tools, but another's prompt would change)
    assert second.prompt_ids == CODECS([]).prompt_ids(episode.messages[:-1])  # rendered afresh, without tools
    assert first.mask == [1] * len(first.completion_ids)  # nothing was appended to the first
    assert episode.env_state["splits"] == 1 and episode.env_state["history_rewrites"] == 0


def test_hundreds_of_episodes_at_once_all_reach_the_endpoint() -> None:
    """A step or an evaluation batch starts all its episodes together: every agent must connect."""
    from rlvr.episodes.loop import run_episodes

    class Answers:
        async def sample(self, prompt_ids: list[int], max_tokens: int, seed: int) -> TurnOutput:
            await asyncio.sleep(0.01)
            out = ids("<answer>391</answer>") + CODECS([]).stop_ids[:1]
            return TurnOutput(out, [-0.5] * len(out), "stop", "job-a", 2)

    tasks = [EpisodeTask(calculator_agent.__rlvr_environment__.make(), EpisodeRow("q", "391", seed=i),
                         [dict(m) for m in PROMPT], i) for i in range(256)]
    episodes = asyncio.run(run_episodes(tasks, Answers(), CODECS, LIMITS, CODECS.decode))
    assert [e.error for e in episodes if e.error] == []
    assert all(e.final_answer == "<answer>391</answer>" for e in episodes)


def test_the_time_limit_counts_the_agents_own_time_not_its_waits_for_the_policy() -> None:
    class Busy(Script):
        async def sample(self, prompt_ids: list[int], max_tokens: int, seed: int) -> TurnOutput:
            await asyncio.sleep(0.4)  # a policy server busy with other episodes
            return await super().sample(prompt_ids, max_tokens, seed)

    async def patient(client: openai.AsyncOpenAI, row: AgentRow) -> float:
        for _ in range(3):
            await client.chat.completions.create(model="m", messages=row.messages)
        return 1.0

    episode = run(agent_env(patient, timeout_seconds=0.5), Busy(["a", "b", "c"]))
    assert episode.error == "" and episode.env_reward == 1.0 and episode.seconds > 1.2


def test_the_agents_client_reaches_the_endpoint_whatever_proxy_the_environment_names(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The endpoint is on loopback in the same process: a proxy set for the host (HTTP_PROXY without
    127.0.0.1 in NO_PROXY, as on many clusters) must not carry the agent's calls away from it."""
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing listens there
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)

    def plain(client: openai.OpenAI, row: AgentRow) -> None:
        client.chat.completions.create(model="m", messages=row.messages)

    for env in (calculator_agent.__rlvr_environment__.make(), agent_env(plain)):
        episode = run(env, Script(["<answer>391</answer>"]))
        assert episode.error == "" and episode.ended_by == "answer" and len(episode.turns) == 1


def test_plain_agents_of_a_step_all_run_at_once() -> None:
    """A plain (not async) agent runs in a thread of its own: more of them at once than a default
    thread pool holds (at most 32 threads) all run together, none waiting for another to end (such
    a wait counted against its time limit and serialised the step's rollout)."""
    import threading

    n = 40
    together = threading.Barrier(n, timeout=20)

    def plain(client: openai.OpenAI, row: AgentRow) -> float:
        client.chat.completions.create(model="m", messages=row.messages)
        together.wait()  # passes only once all n agents are running
        return 1.0

    definition = agent("plain_agent", timeout_seconds=60)(plain).__rlvr_environment__
    tasks = [EpisodeTask(definition.make(), EpisodeRow("What is 17 * 23?", ground_truth="391", seed=k),
                         [dict(m) for m in PROMPT], k) for k in range(n)]
    episodes = asyncio.run(run_episodes(tasks, Script(["<answer>391</answer>"] * n), CODECS, LIMITS, CODECS.decode))
    assert [e.error for e in episodes] == [""] * n and all(e.env_reward == 1.0 for e in episodes)


def test_the_tool_results_of_the_last_allowed_turn_are_recorded_as_the_environment_records_them() -> None:
    """At the turn limit the agent's next call (its tool results) is answered empty; the results it
    brings still go onto the last turn's calls, as the calculator environment records them."""
    limits = EpisodeLimits(max_turns=1, max_tokens_per_turn=96, max_episode_tokens=2000, min_turn_tokens=1)
    episode = run(calculator_agent.__rlvr_environment__.make(), Script([CALL, "<answer>391</answer>"]), limits)
    env_episode = run(calculator.ENVIRONMENT.make(), Script([CALL, "<answer>391</answer>"]), limits)
    assert episode.ended_by == env_episode.ended_by == "max_turns"
    assert episode.turns[0].tool_calls[0]["result"] == env_episode.turns[0].tool_calls[0]["result"] == "391"
    assert transcript(episode) == transcript(env_episode)


def test_the_server_extra_installs_the_openai_client_that_agents_run_with() -> None:
    """Without openai (it came only with vLLM) a scheduler or benchmark service on `rlvr[server]`
    could not load calculator_agent (its registry listed it as failed) nor run an agent's episode."""
    import re
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    assert "openai" in {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0] for r in project["optional-dependencies"]["server"]}


def _one_call(**create_args):
    async def caller(client: openai.AsyncOpenAI, row: AgentRow) -> AgentResult:
        messages = list(row.messages)
        first = await client.chat.completions.create(model="m", messages=messages, **create_args)
        messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "go on"}]
        await client.chat.completions.create(model="m", messages=messages)
        return AgentResult(answer=f"{first.choices[0].finish_reason}|{first.choices[0].message.content}")
    return caller


def test_a_stop_string_ends_the_answer_before_it_and_drops_what_was_sampled_after() -> None:
    script = Script(["<answer>391</answer> and more", "done"])
    episode = run(agent_env(_one_call(stop=["</answer>", "more"])), script)
    assert episode.final_answer == "stop|<answer>391"  # the text stops before the first stop completed
    first, second = episode.samples  # the cut turn did not end on its stop token: the next call splits
    assert sampled_text(first) == "<answer>391</answer>"  # ids up to the token that completed it
    assert first.logprobs == [-0.5] * len(first.completion_ids)
    assert sampled_text(second) == "done" and episode.env_state["splits"] == 1
    # the stop completed first wins, as an engine stopping at it would answer
    recorder = EpisodeRecorder(script, CODECS, LIMITS, CODECS.decode, seed=1)
    cut = recorder._cut_at_stop(ids("xabcdy"), None, "xabcdy", ["abcd", "bc"])
    assert (TOKENIZER.decode(cut[0]), cut[2], cut[3]) == ("xabc", "xa", True)


def test_max_tokens_cuts_the_answer_and_the_next_call_splits() -> None:
    episode = run(agent_env(_one_call(max_tokens=3)), Script(["<answer>391</answer>", "done"]))
    assert episode.final_answer == "length|" + TOKENIZER.decode(ids("<answer>391</answer>")[:3])
    first, second = episode.samples
    assert first.completion_ids == ids("<answer>391</answer>")[:3] and first.mask == [1, 1, 1]
    assert episode.env_state["splits"] == 1 and episode.truncated


def test_an_end_of_text_the_template_never_ends_a_turn_with_is_not_appended_to() -> None:
    class PlainEnd(Script):
        async def sample(self, prompt_ids: list[int], max_tokens: int, seed: int) -> TurnOutput:
            out = await super().sample(prompt_ids, max_tokens, seed)
            ender = ids("!")  # stopped on a token the template never closes a turn with
            return TurnOutput(out.token_ids[:-1] + ender, [-0.5] * len(out.token_ids), "stop", "job-a", 2)

    episode = run(agent_env(_one_call()), PlainEnd(["<answer>391</answer>", "done"]))
    assert len(episode.samples) == 2 and episode.env_state["splits"] == 1


def test_a_call_the_agent_abandons_is_cancelled_and_its_answer_not_recorded() -> None:
    class Slow(Script):
        async def sample(self, prompt_ids: list[int], max_tokens: int, seed: int) -> TurnOutput:
            await asyncio.sleep(0.6)
            return await super().sample(prompt_ids, max_tokens, seed)

    async def impatient(client: openai.AsyncOpenAI, row: AgentRow) -> float:
        with pytest.raises(openai.APITimeoutError):
            await client.with_options(timeout=0.2).chat.completions.create(model="m", messages=row.messages)
        return 0.25

    async def episode_then_wait():
        task = EpisodeTask(agent_env(impatient), EpisodeRow("q", seed=1), [dict(m) for m in PROMPT], 1)
        episode = await run_episode(task, script, CODECS, LIMITS, CODECS.decode)
        await asyncio.sleep(1.0)  # the abandoned call's sampling would have ended by now
        return episode

    script = Slow(["<answer>1</answer>"])
    episode = asyncio.run(episode_then_wait())
    assert episode.error == "" and episode.env_reward == 0.25
    assert episode.turns == [] and episode.samples[0].completion_ids == []  # nothing of the late answer
