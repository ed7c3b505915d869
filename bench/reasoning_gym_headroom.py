"""Headroom of a model on reasoning-gym tasks: greedy accuracy against pass@k on held-out problems.

    python bench/reasoning_gym_headroom.py MODEL_DIR
    python bench/reasoning_gym_headroom.py MODEL_DIR --tasks chain_sum,gcd --n 24 --k 8 --max-new-tokens 128

GRPO learns from a group whose completions differ in reward: a task the model never solves, even
once in k samples, gives it nothing to learn from, and one it already solves greedily leaves little
to gain. Where pass@k is well above greedy accuracy, RL has room. For each task this takes the
first ``--n`` problems of the reward's held-out pool (rlvr/tasks/reasoning_gym_tasks.py: the
problems a ``reasoning_gym`` benchmark scores), renders them as a job would (the model's chat
template, the reward's instruction), and scores every completion with the reward's own function
(the task's ``score_answer`` on the last ``<answer>`` block, else on the final answer wherever it
stands). Greedy: one completion per problem;
sampled: ``--k`` per problem at ``--temperature`` (top-p 1). A problem counts as solved at a score
of 1. Transformers ``generate`` on CPU, batched; prints a table and writes JSON (``--out``).
Two more columns: the share of sampled completions that close an ``<answer>`` block, and "lenient"
rates, the task's scorer on the block or else the final answer read here (the reward reads a
completion the same way but for its last fallback, the last line of a completion with no number).
docs/measurements/reasoning-gym-headroom.md has the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_TASKS = ("chain_sum", "basic_arithmetic", "products", "gcd", "leg_counting", "letter_counting",
                 "spell_backward", "number_sorting")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="a local model folder (e.g. one `rlvr models import` wrote)")
    p.add_argument("--tasks", default=",".join(DEFAULT_TASKS), help="reasoning-gym task specs, comma-separated")
    p.add_argument("--n", type=int, default=24, help="held-out problems per task")
    p.add_argument("--k", type=int, default=8, help="samples per problem for pass@k")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch", type=int, default=48, help="sequences per generate call")
    p.add_argument("--seed", type=int, default=0, help="the sampling seed")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "reasoning_gym_headroom.json"))
    return p.parse_args(argv)


def generate(model, tokenizer, prompts: list[str], *, sample: bool, k: int, temperature: float,
             max_new_tokens: int, batch: int) -> list[list[str]]:
    """Completions of each prompt: 1 greedy, or ``k`` sampled; ``batch`` sequences per call."""
    import torch

    per_prompt = k if sample else 1
    step = max(1, batch // per_prompt)
    out: list[list[str]] = []
    for start in range(0, len(prompts), step):
        chunk = prompts[start:start + step]
        enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            ids = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=sample,
                                 temperature=temperature if sample else None, top_p=1.0 if sample else None,
                                 top_k=0 if sample else None, num_return_sequences=per_prompt,
                                 pad_token_id=tokenizer.pad_token_id)
        texts = tokenizer.batch_decode(ids[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        out.extend(texts[i * per_prompt:(i + 1) * per_prompt] for i in range(len(chunk)))
    return out


def scores(problems: list, completions: list[list[str]]) -> list[list[float]]:
    """The reward's score of each completion (the task's own scorer), per problem."""
    from rlvr.rewards.registry import Sample
    from rlvr.tasks.reasoning_gym_tasks import score

    return [[score(Sample(c, p.ground_truth, p.question, columns=p.columns)).score for c in cs]
            for p, cs in zip(problems, completions, strict=True)]


def lenient_scores(problems: list, completions: list[list[str]]) -> list[list[float]]:
    """The task's own scorer on the answer a completion gives without the ``<answer>`` block too: the
    block when there is one, else the final answer the number rewards read (the last number, a box,
    "the answer is N"). Not the reward: what the model knows, before it learns the format."""
    from rlvr.rewards.answers import final_answer
    from rlvr.rewards.format import answer_block
    from rlvr.tasks.reasoning_gym_tasks import COLUMN, _scorer

    out = []
    for p, cs in zip(problems, completions, strict=True):
        data = json.loads(p.columns[COLUMN])
        scorer = _scorer(data["spec"])
        row = []
        for c in cs:
            block = answer_block(c)
            answer = block.strip() if block is not None else final_answer(c)
            row.append(float(scorer(answer, data["entry"])))
        out.append(row)
    return out


def rates(greedy: list[list[float]], sampled: list[list[float]], k: int) -> dict[str, float]:
    n = len(greedy)
    return {"greedy": sum(s[0] == 1.0 for s in greedy) / n,
            "sample_mean": sum(x == 1.0 for s in sampled for x in s) / (n * k),
            "pass_at_k": sum(any(x == 1.0 for x in s) for s in sampled) / n}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvr.tasks.reasoning_gym_tasks import REWARD, ReasoningGymTask
    from rlvr.tasks.render import FULL_STYLE, render_prompt

    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model, padding_side="left")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    rows = []
    started = time.perf_counter()
    for spec in [t.strip() for t in args.tasks.split(",") if t.strip()]:
        t0 = time.perf_counter()
        problems = ReasoningGymTask(spec).prompts(n=args.n, split="test")
        prompts = [render_prompt(tokenizer, p, FULL_STYLE, REWARD.instruction) for p in problems]

        common = dict(temperature=args.temperature, max_new_tokens=args.max_new_tokens, batch=args.batch)
        greedy_text = generate(model, tokenizer, prompts, sample=False, k=1, **common)
        sampled_text = generate(model, tokenizer, prompts, sample=True, k=args.k, **common)
        row = {"task": spec, "n": len(problems), **rates(scores(problems, greedy_text),
                                                         scores(problems, sampled_text), args.k),
               "lenient": rates(lenient_scores(problems, greedy_text), lenient_scores(problems, sampled_text), args.k),
               "answer_block": sum("<answer>" in c and "</answer>" in c for cs in sampled_text for c in cs)
               / (len(problems) * args.k),
               "example": greedy_text[0][0][:300], "seconds": round(time.perf_counter() - t0, 1)}
        rows.append(row)
        print(f"{spec:<24} greedy {row['greedy']:6.1%}  sampled {row['sample_mean']:6.1%}  pass@{args.k} "
              f"{row['pass_at_k']:6.1%}  | lenient {row['lenient']['greedy']:6.1%} {row['lenient']['sample_mean']:6.1%} "
              f"{row['lenient']['pass_at_k']:6.1%}  ({row['seconds']} s)", flush=True)
    print()
    k = args.k
    print(f"| task | greedy | sampled (T={args.temperature}) | pass@{k} | answer block | lenient greedy | "
          f"lenient pass@{k} |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| `{r['task']}` | {r['greedy']:.0%} | {r['sample_mean']:.0%} | {r['pass_at_k']:.0%} | "
              f"{r['answer_block']:.0%} | {r['lenient']['greedy']:.0%} | {r['lenient']['pass_at_k']:.0%} |")
    result = {"model": args.model, "args": vars(args), "rows": rows, "seconds": round(time.perf_counter() - started, 1),
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
              "torch_threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"\n{len(rows)} tasks in {result['seconds']} s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
