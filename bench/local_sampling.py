"""Seconds per generate of the transformers backend's in-process sampler (rollouts.LocalGenerator),
a step's prompts in one batched call against one call per prompt (how seeded steps were sampled
before: each prompt's group under its own global torch seed, so that a job split across processes
got the completions of one process).

    python bench/local_sampling.py                         # rlvr-tiny, the demo's recipe, 4/8/16 prompts
    python bench/local_sampling.py --model rlvr-tiny-test --prompts 8,16 --repeats 5 --threads 2

Rows, each over the same prompts (Math Pairs, rendered as a job renders them) and the policy as a
job samples it (the base under a fresh LoRA adapter of the demo's rank, B = 0), with the demo's
group size, completion length and temperature (clients/demo.py RECIPE):

- "per prompt": LocalGenerator.generate called once per prompt (its `prompt_offset` the prompt's
  index), the call pattern of the per-prompt sampler; the completions are exactly those of the
  batched row (the bench checks it), so the two rows time the same tokens;
- "batched": one LocalGenerator.generate call for all the prompts (what a step runs now);
- "transformers do_sample": one batched model.generate with transformers' own multinomial sampling
  (do_sample=True, top_k=0, top_p=1; other completions, see the token column): what the seeded
  sampler costs over an unseeded one.

Each row makes one warm-up call, then `--repeats` timed calls (at least 3), the rows taking turns
(one call of each, then the next round), with another step seed per round (the same seeds in every
row); each cell is the median [lowest-highest] over the rounds, "vs per prompt" of each round's ratio.
Prints the load average before and after (the host may be shared: compare rows of one invocation).
It never fails on time: it measures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from repeats import Spread, check_repeats  # noqa: E402  (bench/repeats.py)


def _policy(model_name: str, rank: int, alpha: int) -> tuple[Any, Any, list[int]]:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvr.models import resolve_model
    from rlvr.services.trainer.job.runner import _eos_ids

    path = resolve_model(model_name)
    tokenizer = AutoTokenizer.from_pretrained(path)
    base = AutoModelForCausalLM.from_pretrained(path)
    model = get_peft_model(base, LoraConfig(r=rank, lora_alpha=alpha, target_modules="all-linear",
                                            task_type="CAUSAL_LM")).eval()
    return model, tokenizer, _eos_ids(model, tokenizer)


def _prompts(tokenizer: Any, count: int) -> list[list[int]]:
    from rlvr.tasks import get_task, render_prompt

    problems = get_task("math_pairs").prompts(count, seed=0, split="train", shuffle=True)
    return [tokenizer(render_prompt(tokenizer, p), add_special_tokens=False)["input_ids"] for p in problems]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from rlvr.clients.demo import RECIPE as DEMO

    recipe: dict[str, Any] = dict(DEMO)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="rlvr-tiny")
    p.add_argument("--prompts", default="4,8,16", help="prompts per generate (comma-separated)")
    p.add_argument("--group-size", type=int, default=recipe["group_size"])
    p.add_argument("--max-tokens", type=int, default=recipe["max_tokens"])
    p.add_argument("--temperature", type=float, default=recipe["temperature"])
    p.add_argument("--rank", type=int, default=recipe["rank"])
    p.add_argument("--repeats", type=check_repeats, default=5, help="timed calls per row (>= 3), interleaved")
    p.add_argument("--threads", type=int, default=1, help="torch threads (a job's trainer.torch_threads)")
    p.set_defaults(alpha=recipe["alpha"])
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)

    import torch
    from transformers import GenerationConfig

    from rlvr.peers.types import BASE_MODEL, Sampling
    from rlvr.services.trainer.job.rollouts import LocalGenerator

    torch.set_num_threads(args.threads)
    model, tokenizer, eos = _policy(args.model, args.rank, args.alpha)
    counts = [int(c) for c in args.prompts.split(",")]
    prompts_all = _prompts(tokenizer, max(counts))

    def per_prompt(prompts: list[list[int]], sampling: Sampling) -> list[list[int]]:
        out: list[list[int]] = []
        for i, prompt in enumerate(prompts):
            generator = LocalGenerator(tokenizer, eos, prompt_offset=i)
            generator.bind(model)
            out += generator.generate([prompt], sampling, BASE_MODEL).completion_ids
        return out

    def batched(prompts: list[list[int]], sampling: Sampling) -> list[list[int]]:
        generator = LocalGenerator(tokenizer, eos)
        generator.bind(model)
        return generator.generate(prompts, sampling, BASE_MODEL).completion_ids

    def do_sample(prompts: list[list[int]], sampling: Sampling) -> list[list[int]]:
        assert sampling.seed is not None
        torch.manual_seed(sampling.seed)
        pad = int(tokenizer.pad_token_id)
        rows = [p for p in prompts for _ in range(sampling.group_size)]
        width = max(len(r) for r in rows)
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        config = GenerationConfig(do_sample=True, temperature=sampling.temperature, top_k=0, top_p=1.0,
                                  max_new_tokens=sampling.max_tokens, pad_token_id=pad, eos_token_id=eos)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        completions = []
        for generated in out[:, width:].tolist():
            stop = next((j for j, t in enumerate(generated) if t in eos), None)
            completions.append(generated if stop is None else generated[: stop + 1])
        return completions

    modes = {"per prompt": per_prompt, "batched": batched, "transformers do_sample": do_sample}
    load_before = os.getloadavg()
    print(f"model {args.model}, group {args.group_size}, max_tokens {args.max_tokens}, temperature "
          f"{args.temperature}, LoRA rank {args.rank}, {args.threads} torch thread(s), median [lowest-highest] of "
          f"{args.repeats} calls after a warm-up")
    print("| prompts | rows | sampler | s / generate | generate calls | tokens / row | vs per prompt |")
    print("|---|---|---|---|---|---|---|")
    same_all = []
    for count in counts:
        prompts = prompts_all[:count]
        times: dict[str, list[float]] = {name: [] for name in modes}
        results: dict[str, list[list[list[int]]]] = {name: [] for name in modes}
        for repeat in range(args.repeats + 1):  # the first round is a warm-up
            sampling = Sampling(temperature=args.temperature, max_tokens=args.max_tokens, seed=1000 + repeat,
                                group_size=args.group_size)
            for name, run in modes.items():  # interleaved: a slow spell of the host touches every row alike
                started = time.perf_counter()
                results[name].append(run(prompts, sampling))
                if repeat:
                    times[name].append(time.perf_counter() - started)
        same = results["per prompt"] == results["batched"]
        same_all.append(same)
        for name in modes:
            tokens = statistics.mean(len(c) for out in results[name] for c in out)
            calls = count if name == "per prompt" else 1
            ratio = Spread.of([a / b for a, b in zip(times["per prompt"], times[name], strict=True)])
            print(f"| {count} | {count * args.group_size} | {name} | {Spread.of(times[name]).cell(3)} | {calls} | "
                  f"{tokens:.1f} | {ratio.cell(2)}x |")
        if not same:
            print(f"| {count} | | WARNING: per-prompt and batched completions differ | | | | |")
    agreed = "the same completions" if all(same_all) else "DIFFERENT completions (see the warnings)"
    print(f"load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}; per prompt and batched "
          f"sampled {agreed}")


if __name__ == "__main__":
    main()
