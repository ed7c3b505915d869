"""Episode throughput: multi-turn episodes through the training path against single-turn generation
of the same sampled token budget, on one rollout server.

    python bench/episodes.py                       # vLLM, rlvr-tiny-headroom, 16 episodes, 3 repeats
    python bench/episodes.py --backend transformers --repeats 3

The episodes run exactly as a job's step runs them (services/trainer/job/episodes.py's GeneratorSampler
over the trainer's ServiceGenerator, rlvr/episodes/loop.py, the model's chat template through
rlvr/episodes/chat.py), against an environment of this script: it answers each turn with a short
user message until the episode has K turns. Each case generates --episodes episodes (one prompt's
group, as a job's step does), per-turn max_tokens M:

- single: one turn of K*M tokens at most (the same sampled budget), the plain one-answer rollout;
- K turns (K = 1, 2, 4): each turn sampled at most M tokens, the environment's reply appended;
- slow: K = 4 with one episode in eight waiting 1 s in the environment at each turn (a slow tool):
  the other episodes' time against the K = 4 case shows whether a slow episode holds the rest up.

Reported per case (median over --repeats, one warm-up call first): seconds, episodes/s, sampled
tokens/s, the mean episode's sampled tokens and turns, and (slow) the other episodes' mean seconds.
Targets (the issue's): 4-turn sampled tokens/s at least 1/1.5 of single's (tool time excluded); the
slow case's other episodes within 10% of the 4-turn case's. It measures; it never fails on time.
Writes bench/results/episodes.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from repeats import check_repeats  # noqa: E402

from rlvr.environments.base import Environment, EpisodeRow, Reply  # noqa: E402

QUESTION = "Tell me about numbers."


class Turns(Environment):
    """Answers every turn with a short user message until the episode has `turns` turns; `slow`
    seconds of waiting in each reply (a slow tool's stand-in)."""

    def __init__(self, turns: int, slow: float = 0.0) -> None:
        self.turns, self.slow, self.seen = turns, slow, 0

    async def step(self, text: str) -> Reply:
        self.seen += 1
        if self.slow:
            await asyncio.sleep(self.slow)
        return Reply(done=True) if self.seen >= self.turns else Reply(text="Go on.")


@dataclass
class CaseRun:
    seconds: float
    episodes: int
    sampled_tokens: int
    turns: float
    others_seconds: float = 0.0  # the mean seconds of the episodes without the slow environment

    def row(self) -> dict[str, float]:
        return {"seconds": self.seconds, "episodes_per_s": self.episodes / self.seconds,
                "sampled_tokens_per_s": self.sampled_tokens / self.seconds,
                "sampled_tokens_mean": self.sampled_tokens / self.episodes, "turns_mean": self.turns,
                "others_seconds": self.others_seconds}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="rlvr-tiny-headroom")
    p.add_argument("--backend", default="vllm", choices=("vllm", "transformers"))
    p.add_argument("--episodes", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=32, help="per-turn max_tokens M (at least 32)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--repeats", type=check_repeats, default=3)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--start-timeout", type=float, default=900.0)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "episodes.json")
    return p.parse_args(argv)


def run_case(name: str, turns: int, args: argparse.Namespace, generator: Any, tokenizer: Any,
             seed: int) -> CaseRun:
    from rlvr.episodes.chat import ChatCodec
    from rlvr.episodes.loop import EpisodeLimits, EpisodeTask, run_episodes
    from rlvr.peers.types import AdapterTag, Sampling
    from rlvr.services.trainer.job.episodes import GeneratorSampler

    per_turn = args.max_tokens * (turns if name == "single" else 1)
    limits = EpisodeLimits(max_turns=1 if name == "single" else turns, max_tokens_per_turn=per_turn,
                           max_episode_tokens=10 * args.max_tokens * turns + 1024, min_turn_tokens=32)
    codec = ChatCodec(tokenizer)
    slow = [name == "slow" and i % 8 == 0 for i in range(args.episodes)]
    tasks = [EpisodeTask(Turns(turns, 1.0 if slow[i] else 0.0), EpisodeRow(QUESTION),
                         [{"role": "user", "content": QUESTION}], seed + i) for i in range(args.episodes)]
    sampler = GeneratorSampler(generator, Sampling(temperature=args.temperature), AdapterTag(), newest=False, workers=args.episodes)
    started = time.perf_counter()
    try:
        episodes = asyncio.run(run_episodes(tasks, sampler, lambda _schemas: codec, limits,
                                            lambda ids: tokenizer.decode(ids, skip_special_tokens=True)))
    finally:
        sampler.close()
    seconds = time.perf_counter() - started
    others = [e.seconds for e, s in zip(episodes, slow, strict=True) if not s]
    return CaseRun(seconds, len(episodes), sum(e.sampled_tokens for e in episodes),
                   statistics.mean(len(e.turns) for e in episodes), statistics.mean(others))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from rollout_throughput import quiet_transformers, rollout_server
    from transformers import AutoTokenizer

    from rlvr.models import resolve_model
    from rlvr.services.trainer.job.rollouts import ServiceGenerator

    quiet_transformers()
    model = Path(resolve_model(args.model))
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    cases = [("single", 4), ("1 turn", 1), ("2 turns", 2), ("4 turns", 4), ("slow", 4)]
    results: dict[str, list[CaseRun]] = {name: [] for name, _ in cases}
    server_args = argparse.Namespace(logs=None, max_model_len=args.max_model_len, start_timeout=args.start_timeout)
    with tempfile.TemporaryDirectory(prefix="bench-episodes-") as work, \
            rollout_server(model, args.backend, Path(work), {}, server_args) as (client, started, _log):
        generator = ServiceGenerator(client.address)
        try:
            run_case("1 turn", 1, args, generator, tokenizer, seed=10**6)  # warm-up
            for repeat in range(args.repeats):
                for name, turns in cases:
                    results[name].append(run_case(name, turns, args, generator, tokenizer, seed=1000 * repeat))
        finally:
            generator.close()
    table = {name: {k: statistics.median(r.row()[k] for r in runs) for k in runs[0].row()}
             for name, runs in results.items()}
    print(f"episodes: {args.model} on {args.backend}, {args.episodes} episodes per case, per-turn max_tokens "
          f"{args.max_tokens}, T={args.temperature}, median of {args.repeats}; {platform.processor() or platform.machine()}")
    print(f"{'case':<9} {'seconds':>8} {'episodes/s':>11} {'tokens/s':>9} {'tokens/ep':>10} {'turns':>6} {'others s':>9}")
    for name, row in table.items():
        print(f"{name:<9} {row['seconds']:8.2f} {row['episodes_per_s']:11.2f} {row['sampled_tokens_per_s']:9.1f} "
              f"{row['sampled_tokens_mean']:10.1f} {row['turns_mean']:6.2f} {row['others_seconds']:9.2f}")
    single, four, slow = table["single"], table["4 turns"], table["slow"]
    ratio = single["sampled_tokens_per_s"] / four["sampled_tokens_per_s"]
    slowdown = slow["others_seconds"] / four["others_seconds"] - 1
    print(f"4 turns take {ratio:.2f}x single's time per sampled token (target <= 1.5); the slow episodes "
          f"add {100 * slowdown:+.1f}% to the others' time (target <= 10%)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "table": table,
                                    "ratio_4_turns": ratio, "slow_overhead": slowdown}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
