"""Where a model's errors lie, and how much room GRPO has on them: ``python -m rlvr.tiny eval
MODEL --diagnose`` (``rlvr models inspect MODEL``).

GRPO turns pass@k into pass@1 when the model's errors are global (one wrong habit on every prompt);
when they are scattered facts it has little to learn from. These measures tell which, on any
saved causal LM (transformers) and the Math Pairs problems of either split:

- greedy accuracy (pass@1 at temperature 0);
- pass@k: at least one of k samples right; maj@k: the most frequent extracted answer of the k
  samples is right (ties go to the first answer seen);
- zero-spread groups: the share of groups of ``group`` samples (the first ``group`` of the k)
  whose rewards are all equal, so they carry no GRPO advantage;
- per part (Math Pairs' worked chain ``a+b=X c+d=Y X*Y=Z``, read from the greedy completion): both
  sums right, and the product right given right sums;
- format: the share of greedy completions in the ``<think>…</think><answer>…</answer>`` form;
- chains sampled: the share of the k samples that write the worked chain, and the accuracy of
  those samples and of the others (a base whose chain is accurate but seldom chosen has a global
  habit for RL to fix: choosing the chain).

Pure measurement: no training, nothing written.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

CHAIN = re.compile(r"(\d+)\+(\d+)=(\d+)\s+(\d+)\+(\d+)=(\d+)\s+(\d+)\*(\d+)=(\d+)")


@dataclass(frozen=True)
class Diagnosis:
    model: str
    split: str
    n: int
    k: int
    group: int
    temperature: float
    greedy: float
    pass_at_k: float
    maj_at_k: float
    never_right: float  # share of problems with no right answer in k samples
    zero_spread_groups: float
    sums_right: float  # greedy chains with both sums right, of the chains written
    product_right_given_sums: float
    chains_written: float  # greedy completions with a parsable worked chain
    format: float
    chains_sampled: float = 0.0  # samples with a parsable worked chain, of all n * k samples
    sampled_chain_accuracy: float = 0.0  # accuracy of the samples that write the chain
    sampled_other_accuracy: float = 0.0  # accuracy of the samples that do not

    def rows(self) -> list[tuple[str, str]]:
        return [
            ("problems", f"{self.n} ({self.split})"),
            ("greedy accuracy", f"{self.greedy:.1%}"),
            (f"pass@{self.k} (T={self.temperature:g})", f"{self.pass_at_k:.1%}"),
            (f"maj@{self.k}", f"{self.maj_at_k:.1%}"),
            (f"pass@{self.k} - greedy", f"{100 * (self.pass_at_k - self.greedy):+.1f} points"),
            (f"maj@{self.k} - greedy", f"{100 * (self.maj_at_k - self.greedy):+.1f} points"),
            (f"never right in {self.k}", f"{self.never_right:.1%}"),
            (f"groups of {self.group} with no reward spread", f"{self.zero_spread_groups:.1%}"),
            ("worked chain written (greedy)", f"{self.chains_written:.1%}"),
            ("both sums right", f"{self.sums_right:.1%}"),
            ("product right given right sums", f"{self.product_right_given_sums:.1%}"),
            ("format (greedy)", f"{self.format:.1%}"),
            ("samples writing the chain", f"{self.chains_sampled:.1%}"),
            ("accuracy of samples with / without the chain",
             f"{self.sampled_chain_accuracy:.1%} / {self.sampled_other_accuracy:.1%}"),
        ]

    def table(self) -> str:
        width = max(len(k) for k, _ in self.rows())
        lines = [f"{self.model}", f"| {'measure':<{width}} | value |", f"|{'-' * (width + 2)}|-------|"]
        lines += [f"| {k:<{width}} | {v} |" for k, v in self.rows()]
        return "\n".join(lines)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def majority(answers: Sequence[str | None]) -> str | None:
    """The most frequent answer (None = no answer, never chosen); ties to the first seen.

    >>> majority(["3", None, "4", "4", "3"])
    '3'
    """
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    top = max(counts.values())
    return next(a for a in answers if a is not None and counts[a] == top)


def chain_parts(completion: str, numbers: Sequence[int]) -> tuple[bool, bool] | None:
    """(both sums right, product right given the sums written) of a Math Pairs chain; None when
    the completion has no chain for these numbers (in any order of the pairs and within them)."""
    from rlvr.tasks.math_pairs import canonical_key

    m = CHAIN.search(completion)
    if m is None:
        return None
    a, b, s1, c, d, s2, x, y, z = (int(g) for g in m.groups())
    if (a, b, c, d) != tuple(numbers) and canonical_key((a, b, c, d)) != canonical_key(numbers):
        return None  # a chain for other numbers (one in another order of the same pairs counts)
    sums = s1 == a + b and s2 == c + d
    return sums, sums and x == s1 and y == s2 and z == x * y


def summarize(model: str, split: str, numbers: Sequence[Sequence[int]], truths: Sequence[str],
              greedy: Sequence[str], samples: Sequence[Sequence[str]], group: int, temperature: float,
              score: Callable[[str, str], tuple[float, str | None, float]]) -> Diagnosis:
    """The measures from completions: `score(completion, truth)` -> (accuracy, extracted, format)."""
    n = len(truths)
    k = len(samples[0]) if samples else 0
    greedy_scores = [score(c, t) for c, t in zip(greedy, truths, strict=True)]
    passed = majority_right = never = zero_spread = 0
    with_chain = [0, 0]  # samples, right
    without_chain = [0, 0]
    for sampled, truth, nums in zip(samples, truths, numbers, strict=True):
        scored = [score(c, truth) for c in sampled]
        right = [s[0] >= 1.0 for s in scored]
        for completion, ok in zip(sampled, right, strict=True):
            tally = with_chain if chain_parts(completion, nums) is not None else without_chain
            tally[0] += 1
            tally[1] += ok
        passed += any(right)
        never += not any(right)
        majority_right += majority([s[1] for s in scored]) == truth
        rewards = [s[0] for s in scored[:group]]
        zero_spread += len(set(rewards)) <= 1
    parts = [chain_parts(c, nums) for c, nums in zip(greedy, numbers, strict=True)]
    written = [p for p in parts if p is not None]
    sums_right = [p for p in written if p[0]]
    return Diagnosis(
        model=model, split=split, n=n, k=k, group=group, temperature=temperature,
        greedy=sum(s[0] >= 1.0 for s in greedy_scores) / n, pass_at_k=passed / n, maj_at_k=majority_right / n,
        never_right=never / n, zero_spread_groups=zero_spread / n,
        sums_right=len(sums_right) / len(written) if written else 0.0,
        product_right_given_sums=sum(p[1] for p in sums_right) / len(sums_right) if sums_right else 0.0,
        chains_written=len(written) / n, format=sum(s[2] for s in greedy_scores) / n,
        chains_sampled=with_chain[0] / max(1, with_chain[0] + without_chain[0]),
        sampled_chain_accuracy=with_chain[1] / max(1, with_chain[0]),
        sampled_other_accuracy=without_chain[1] / max(1, without_chain[0]))


def sample(model, tokenizer, prompts: list[str], k: int, temperature: float, max_new_tokens: int,  # noqa: ANN001
           batch_size: int, seed: int) -> list[list[str]]:
    """k sampled completions per prompt (torch's generator seeded once: reproducible on one machine)."""
    import torch

    torch.manual_seed(seed)
    tokenizer.padding_side = "left"
    out: list[list[str]] = []
    per_batch = max(1, batch_size // k)
    with torch.inference_mode():
        for start in range(0, len(prompts), per_batch):
            batch = tokenizer(prompts[start:start + per_batch], return_tensors="pt", padding=True,
                              add_special_tokens=False)
            ids = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=True, temperature=temperature,
                                 top_p=1.0, top_k=0, num_return_sequences=k, pad_token_id=tokenizer.pad_token_id)
            texts = tokenizer.batch_decode(ids[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
            out += [texts[i:i + k] for i in range(0, len(texts), k)]
    return out


def diagnose(model_path: str | Path, n: int = 500, k: int = 16, group: int = 8, temperature: float = 0.3,
             split: str = "heldout", seed: int = 0, max_new_tokens: int = 48, batch_size: int = 128) -> Diagnosis:
    """Loads a saved model and measures it on `n` Math Pairs problems of `split` (heldout or train)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvr.tiny.generate import torch_threads

    check_arguments(split, k, group)
    with torch_threads():
        tokenizer = AutoTokenizer.from_pretrained(str(model_path))
        model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype="float32").eval()
        return diagnose_model(model, tokenizer, str(model_path), n, k, group, temperature, split, seed,
                              max_new_tokens, batch_size)


def check_arguments(split: str, k: int, group: int) -> None:
    if split not in ("heldout", "train"):
        raise ValueError(f"split: {split!r} is not heldout or train")
    if not 2 <= k <= 64 or not 2 <= group <= k:
        raise ValueError(f"k: {k} must be 2-64 and group: {group} 2-k")


def diagnose_model(model, tokenizer, label: str, n: int = 500, k: int = 16, group: int = 8,  # noqa: ANN001
                   temperature: float = 0.3, split: str = "heldout", seed: int = 0, max_new_tokens: int = 48,
                   batch_size: int = 128) -> Diagnosis:
    """The measures of a loaded model (a build's gate measures the model it has just trained)."""
    from rlvr.rewards.scoring import score
    from rlvr.tasks import math_pairs
    from rlvr.tasks.render import render_prompt
    from rlvr.tiny.generate import generate_greedy

    check_arguments(split, k, group)
    problems = (math_pairs.heldout_problems(n, seed) if split == "heldout"
                else math_pairs.training_problems(n, seed))
    prompts = [render_prompt(tokenizer, p) for p in problems]
    greedy = generate_greedy(model, tokenizer, prompts, max_new_tokens, batch_size)
    samples = sample(model, tokenizer, prompts, k, temperature, max_new_tokens, batch_size, seed)

    def scored(completion: str, truth: str) -> tuple[float, str | None, float]:
        r = score("math_pairs", completion, truth)
        return r.accuracy, r.extracted_answer, r.format

    numbers = [math_pairs.parse_numbers(p.question) for p in problems]
    return summarize(label, split, numbers, [p.ground_truth for p in problems], greedy, samples, group,
                     temperature, scored)
