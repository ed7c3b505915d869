"""The agent endpoint's cost per call: a turn asked for through the `openai` client, the gateway and
the episode recorder against the same turn sampled directly, on one rollout server.

    python bench/agent_gateway.py                       # vLLM, rlvr-tiny-headroom, 200 calls, 3 repeats
    python bench/agent_gateway.py --backend transformers --calls 100

Both paths sample through services/trainer/job/episodes.py's GeneratorSampler over the trainer's
ServiceGenerator (gRPC to the rollout service), as a job's step does. The turn is the calculator
agent's first call (its prompt and tool, rlvr/agents/builtin/calculator.py; rendered by the model's
chat template, rlvr/episodes/chat.py), max_tokens M, temperature 1. The calls come in episodes of
--episode-calls calls (4: the calculator agent's most), the paths alternating episode by episode
(the order rotating), and call k of episode e samples from ``turn_seed(seed + e, k)`` on both paths:

- direct: ``GeneratorSampler.sample`` on the prompt's ids (rendered once), the calls back to back:
  the Generate call an environment's episode makes for a turn;
- endpoint: a real agent episode (``rlvr.episodes.loop.run_episode`` of an `agent`-declared
  function, as a job runs one: its session on the process's gateway, its own `AsyncOpenAI` client)
  whose agent asks for the same turn each call, back to back on its client's connection:
  ``chat.completions.create`` -> HTTP on loopback (rlvr/agents/gateway.py) -> the episode's
  `EpisodeRecorder` (it renders the messages afresh, the agent having "rewritten" its history,
  samples through the same GeneratorSampler, records the tokens) -> the JSON answer. Each call is
  timed around ``create``; the episode's set-up (session, client, closing) is what is left of it.

Reported (median [range] over --repeats, one warm-up round first): median and p99 seconds per call,
the mean sampled tokens (the same work: the paths must match) and how many calls sampled the very ids
of the direct call; the endpoint's overhead over direct (endpoint/direct - 1) at the median, at p99
and over whole episodes (set-up included); where the time goes: per call, sampling and the rest; and,
without a model (a sampler that answers at once), the pieces: a call through the endpoint, the
recorder alone, its render of the prompt, the chat codec's ``after_turn`` (the two renders a call
extending its conversation costs), and making a default `AsyncOpenAI` client (which loads the
certificate store; an episode's client loads none, rlvr/agents/base.py).
Target (the issue's): the endpoint at most 10% over direct per call on the bundled model. It
measures; it never fails on time. Writes bench/results/agent_gateway.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from repeats import Spread, check_repeats  # noqa: E402

PATHS = ("direct", "endpoint")
LABELS = {"direct": "direct (GeneratorSampler.sample)", "endpoint": "endpoint (openai client -> gateway -> recorder)"}
TARGET = 0.10
QUESTION = "What is 17 * 23?"
PIECE_CALLS = 200  # calls of each model-free piece


@dataclass
class PathRun:
    """One path's calls in one repeat."""

    seconds: list[float] = field(default_factory=list)  # per call
    sample_s: list[float] = field(default_factory=list)  # of which in GeneratorSampler.sample
    tokens: list[int] = field(default_factory=list)
    same_ids: int = 0  # calls that sampled exactly the direct call's ids
    episode_s: list[float] = field(default_factory=list)  # per episode, set-up included (the endpoint)

    def row(self) -> dict[str, float]:
        row = {"median_s": percentile(self.seconds, 50), "p99_s": percentile(self.seconds, 99),
               "total_s": sum(self.episode_s or self.seconds), "tokens_mean": sum(self.tokens) / len(self.tokens),
               "same_ids": float(self.same_ids), "sample_median_s": percentile(self.sample_s, 50),
               "rest_median_s": percentile([a - b for a, b in zip(self.seconds, self.sample_s, strict=True)], 50)}
        if self.episode_s:
            calls = len(self.seconds) // len(self.episode_s)
            row["setup_median_s"] = percentile([e - sum(self.seconds[i * calls:(i + 1) * calls])
                                                for i, e in enumerate(self.episode_s)], 50)
        return row


class TimedSampler:
    """The sampler, with the seconds of its last call."""

    def __init__(self, sampler: Any) -> None:
        self.sampler, self.last = sampler, 0.0

    async def sample(self, prompt_ids: list[int], max_tokens: int, seed: int) -> Any:
        started = time.perf_counter()
        try:
            return await self.sampler.sample(prompt_ids, max_tokens, seed)
        finally:
            self.last = time.perf_counter() - started


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank q-th percentile; q = 50: the median (the mean of the middle two of an even count)."""
    ordered = sorted(values)
    if q == 50:
        mid = len(ordered) // 2
        return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="rlvr-tiny-headroom")
    p.add_argument("--backend", default="vllm", choices=("vllm", "transformers"))
    p.add_argument("--calls", type=int, default=200, help="calls per path and repeat (p99 wants 100 or more)")
    p.add_argument("--episode-calls", type=int, default=4, help="calls per episode, back to back")
    p.add_argument("--max-tokens", type=int, default=32, help="max_tokens M of every call (at least 32)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--repeats", type=check_repeats, default=3)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--start-timeout", type=float, default=900.0)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "agent_gateway.json")
    args = p.parse_args(argv)
    if args.episode_calls < 1 or args.calls < args.episode_calls:
        p.error("--episode-calls must be at least 1 and --calls at least --episode-calls")
    if args.max_tokens < 32:
        p.error("--max-tokens must be at least 32 (the rollout service's smallest max_tokens)")
    args.calls -= args.calls % args.episode_calls  # whole episodes
    return args


def _setting(max_tokens: int, episode_calls: int) -> tuple[list[dict[str, Any]], Any]:
    """The calculator agent's first prompt and one episode's limits."""
    from rlvr.agents.builtin.calculator import INSTRUCTION
    from rlvr.episodes.loop import EpisodeLimits

    messages = [{"role": "user", "content": f"{QUESTION}\n\n{INSTRUCTION}"}]
    limits = EpisodeLimits(max_turns=episode_calls, max_tokens_per_turn=max_tokens,
                           max_episode_tokens=episode_calls * max_tokens + 1024, min_turn_tokens=32)
    return messages, limits


async def run_round(calls: int, episode_calls: int, max_tokens: int, generator_sampler: Any, codecs: Any,
                    seed: int) -> dict[str, PathRun]:
    """`calls` calls on each path in episodes of `episode_calls`, the paths alternating by episode."""
    import openai

    from rlvr.agents import agent
    from rlvr.agents.builtin.calculator import TOOLS
    from rlvr.environments.base import EpisodeRow
    from rlvr.episodes.loop import EpisodeTask, run_episode, turn_seed

    messages, limits = _setting(max_tokens, episode_calls)
    prompt_ids = codecs(TOOLS).prompt_ids(messages)
    sampler = TimedSampler(generator_sampler)
    runs = {path: PathRun() for path in PATHS}

    async def same_turn_each_call(client: openai.AsyncOpenAI, row: Any) -> None:
        run = runs["endpoint"]
        for _ in range(episode_calls):
            started = time.perf_counter()
            reply = await client.chat.completions.create(model="policy", messages=row.messages, tools=TOOLS,
                                                         max_tokens=max_tokens)
            run.seconds.append(time.perf_counter() - started)
            run.sample_s.append(sampler.last)
            assert reply.usage is not None
            run.tokens.append(reply.usage.completion_tokens)

    environment = agent("bench_same_turn", timeout_seconds=600,
                        max_turns=episode_calls)(same_turn_each_call).__rlvr_environment__.make()

    async def direct(episode_seed: int) -> list[list[int]]:
        run, got = runs["direct"], []
        for k in range(episode_calls):
            started = time.perf_counter()
            out = await sampler.sample(list(prompt_ids), max_tokens, turn_seed(episode_seed, k))
            run.seconds.append(time.perf_counter() - started)
            run.sample_s.append(sampler.last)
            run.tokens.append(len(out.token_ids))
            got.append(list(out.token_ids))
        return got

    async def endpoint(episode_seed: int) -> list[list[int]]:
        task = EpisodeTask(environment, EpisodeRow(QUESTION), [dict(m) for m in messages], episode_seed)
        started = time.perf_counter()
        episode = await run_episode(task, sampler, codecs, limits, codecs.decode)  # as a job's step runs it
        runs["endpoint"].episode_s.append(time.perf_counter() - started)
        if episode.error:
            raise RuntimeError(f"the agent's episode failed: {episode.error}")
        # Each call after the first "rewrote" the history (the same messages again): a sample each.
        return [list(s.completion_ids) for s in episode.samples]

    steps = {"direct": direct, "endpoint": endpoint}
    for e in range(calls // episode_calls):
        order = PATHS if e % 2 == 0 else PATHS[::-1]
        got = {path: await steps[path](seed + e) for path in order}
        runs["endpoint"].same_ids += sum(a == b for a, b in zip(got["endpoint"], got["direct"], strict=True))
    return runs


class _AtOnce:
    """A sampler that answers at once with the ids it was made with (the model-free pieces)."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    async def sample(self, prompt_ids: list[int], max_tokens: int, seed: int) -> Any:
        from rlvr.episodes.loop import TurnOutput

        return TurnOutput(list(self.ids[:max_tokens]), [-1.0] * min(len(self.ids), max_tokens), "stop", "", 0)


async def pieces(codecs: Any, max_tokens: int, reply_ids: list[int], calls: int = PIECE_CALLS) -> dict[str, float]:
    """Median seconds of the endpoint's pieces without a model: what it adds to a turn, apart."""
    import openai

    from rlvr.agents.builtin.calculator import TOOLS
    from rlvr.agents.gateway import Gateway
    from rlvr.agents.recorder import EpisodeRecorder

    messages, limits = _setting(max_tokens, 1)
    codec = codecs(TOOLS)
    at_once = _AtOnce(reply_ids)
    body = {"model": "policy", "messages": messages, "tools": TOOLS, "max_tokens": max_tokens}
    reply = codecs.decode(reply_ids)
    conversation = [*messages, codec.assistant_message(reply, codec.parse_tool_calls(reply)[0])]
    after = [{"role": "user", "content": "Go on."}]

    def timed(fn: Callable[[], Any]) -> float:
        seconds = []
        for _ in range(calls):
            started = time.perf_counter()
            fn()
            seconds.append(time.perf_counter() - started)
        return percentile(seconds, 50)

    async def timed_async(make: Callable[[], Any]) -> float:
        seconds = []
        for _ in range(calls):
            started = time.perf_counter()
            await make()
            seconds.append(time.perf_counter() - started)
        return percentile(seconds, 50)

    def recorder() -> EpisodeRecorder:
        return EpisodeRecorder(at_once, codecs, limits, codecs.decode, 0)

    gateway, loop = Gateway.shared(), asyncio.get_running_loop()
    shared = openai.AsyncOpenAI(base_url=f"http://{gateway.host}:{gateway.port}/v1", api_key="none", max_retries=0)

    async def call() -> None:  # back to back on a kept-alive connection, as an agent's calls are
        key = gateway.open(recorder(), loop)
        try:
            await shared.with_options(base_url=gateway.base_url(key), api_key=key).chat.completions.create(**body)
        finally:
            gateway.close(key)

    try:
        out = {"call_s": await timed_async(call),
               "recorder_s": await timed_async(lambda: recorder().complete(body)),
               "prompt_render_s": timed(lambda: codec.prompt_ids(messages)),
               "after_turn_s": timed(lambda: codec.after_turn(conversation, after)),
               "client_s": timed(lambda: openai.AsyncOpenAI(base_url=gateway.base_url("k"), api_key="k",
                                                            max_retries=0))}
    finally:
        await shared.close()
    return out


def summarise(rounds: list[dict[str, PathRun]], parts: list[dict[str, float]]) -> dict[str, dict[str, Any]]:
    """Per path, each figure's Spread over the repeats (as JSON), with the endpoint's overheads over direct;
    "pieces": the model-free pieces' Spreads."""
    rows = [{path: run.row() for path, run in r.items()} for r in rounds]
    table: dict[str, dict[str, Any]] = {}
    for path in PATHS:
        cells = {key: Spread.of([row[path].get(key) for row in rows]) for key in rows[0][path]}
        for at in ("median", "p99", "total"):
            cells[f"overhead_{at}"] = Spread.of([row[path][f"{at}_s"] / row["direct"][f"{at}_s"] - 1 for row in rows])
        table[path] = {key: spread.to_json() for key, spread in cells.items()}
    table["pieces"] = {key: Spread.of([p[key] for p in parts]).to_json() for key in parts[0]}
    return table


def meets_target(table: dict[str, dict[str, Any]]) -> bool:
    """The endpoint's overhead per call at most TARGET at the median and at p99 (the medians over the repeats)."""
    return all(table["endpoint"][f"overhead_{at}"]["median"] <= TARGET for at in ("median", "p99"))


def report(table: dict[str, dict[str, Any]], calls: int) -> list[str]:
    """The markdown tables: seconds per call and overheads; where the time goes; the model-free pieces."""
    def cell(path: str, key: str) -> Spread:
        return Spread.from_json(table[path][key])

    def percent(spread: Spread) -> str:
        assert spread.median is not None and spread.low is not None and spread.high is not None
        return f"{100 * spread.median:+.1f}% [{100 * spread.low:+.1f}..{100 * spread.high:+.1f}]"

    def ms(path: str, key: str, digits: int = 1) -> str:
        if key not in table[path]:
            return "-"
        s = cell(path, key)
        return Spread(*(None if v is None else 1000 * v for v in (s.median, s.low, s.high)), s.n).cell(digits)

    lines = ["| path | median s/call | p99 s/call | overhead at median | overhead at p99 | "
             "overhead, whole episodes | sampled tokens/call | same ids as direct |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for path in PATHS:
        over = ["-"] * 3 if path == "direct" else [percent(cell(path, f"overhead_{at}")) for at in ("median", "p99", "total")]
        same = "-" if path == "direct" else f"{cell(path, 'same_ids').low:.0f}/{calls}"  # the fewest of a repeat
        lines.append(f"| {LABELS[path]} | {cell(path, 'median_s').cell(4)} | {cell(path, 'p99_s').cell(4)} | "
                     f"{' | '.join(over)} | {cell(path, 'tokens_mean').cell(1)} | {same} |")
    lines += ["", "| path (median ms) | sampling per call | the rest per call | set-up per episode |",
              "|---|---:|---:|---:|"]
    for path in PATHS:
        lines.append(f"| {path} | {ms(path, 'sample_median_s')} | {ms(path, 'rest_median_s', 2)} | "
                     f"{ms(path, 'setup_median_s')} |")
    names = {"call_s": "a call through the endpoint (openai client, HTTP, recorder)",
             "recorder_s": "of which EpisodeRecorder.complete (parse, render, record)",
             "prompt_render_s": "of which the prompt's render (ChatCodec.prompt_ids)",
             "after_turn_s": "ChatCodec.after_turn (a call extending its conversation: two renders)",
             "client_s": "making a default AsyncOpenAI client (an episode's loads no certificates)"}
    lines += ["", "| without a model (median ms) | |", "|---|---:|"]
    lines += [f"| {names[key]} | {ms('pieces', key, 2)} |" for key in names]
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from rollout_throughput import quiet_transformers, rollout_server
    from transformers import AutoTokenizer

    from rlvr.episodes.chat import ChatCodecs
    from rlvr.models import resolve_model
    from rlvr.peers.types import AdapterTag, Sampling
    from rlvr.services.trainer.job.episodes import GeneratorSampler
    from rlvr.services.trainer.job.rollouts import ServiceGenerator

    quiet_transformers()
    model = Path(resolve_model(args.model))
    codecs = ChatCodecs(AutoTokenizer.from_pretrained(str(model)))
    rounds: list[dict[str, PathRun]] = []
    parts: list[dict[str, float]] = []
    server_args = argparse.Namespace(logs=None, max_model_len=args.max_model_len, start_timeout=args.start_timeout)
    with tempfile.TemporaryDirectory(prefix="bench-agent-gateway-") as work, \
            rollout_server(model, args.backend, Path(work), {}, server_args) as (client, _started, _log):
        generator = ServiceGenerator(client.address)
        sampler = GeneratorSampler(generator, Sampling(temperature=args.temperature), AdapterTag(), newest=False, workers=2)
        try:
            round_args = (args.episode_calls, args.max_tokens, sampler, codecs)
            asyncio.run(run_round(min(args.calls, 4 * args.episode_calls), *round_args, seed=10**6))  # warm-up
            for repeat in range(args.repeats):
                rounds.append(asyncio.run(run_round(args.calls, *round_args, seed=1000 * repeat)))
        finally:
            sampler.close()
            generator.close()
    reply_ids = codecs.tokenizer.encode("<think>17 * 23 = 391</think> <answer>391</answer>", add_special_tokens=False)
    for _ in range(args.repeats):
        parts.append(asyncio.run(pieces(codecs, args.max_tokens, reply_ids)))
    table = summarise(rounds, parts)
    print(f"agent_gateway: {args.model} on {args.backend}, {args.calls} calls per path in episodes of "
          f"{args.episode_calls}, max_tokens {args.max_tokens}, T={args.temperature}, median [range] of "
          f"{args.repeats} repeats; {platform.processor() or platform.machine()}")
    print()
    print("\n".join(report(table, args.calls)))
    met = meets_target(table)
    print()
    print(f"endpoint overhead per call {100 * table['endpoint']['overhead_median']['median']:+.1f}% at the median, "
          f"{100 * table['endpoint']['overhead_p99']['median']:+.1f}% at p99 (target <= {100 * TARGET:.0f}%: "
          f"{'met' if met else 'missed'})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "table": table,
                                    "target": TARGET, "met": met,
                                    "runs": [{path: vars(run) for path, run in r.items()} for r in rounds]},
                                   indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
