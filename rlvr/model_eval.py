"""A quick held-out evaluation of a model folder, for `rlvr models show NAME --eval`: greedy answers to
a reward's held-out problems, generated here with transformers and scored by the reward registry as
the reward service scores them. A first look at whether a model has room to learn a task before a
long job; the benchmark service (`rlvr eval run`) is the evaluation of record.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_N = 50
DEFAULT_MAX_TOKENS = 256
BATCH = 8


@dataclass
class QuickEval:
    reward: str
    dataset: str
    split: str
    n: int
    correct: int
    max_tokens: int
    seconds: float
    answers: list[tuple[str, str, float]]  # (question, completion, accuracy) of each problem

    @property
    def accuracy(self) -> float:
        return self.correct / self.n

    @property
    def stderr(self) -> float:
        return math.sqrt(self.accuracy * (1 - self.accuracy) / self.n)

    def line(self) -> str:
        on = f"{self.reward}" + (f" on {self.dataset}" if self.dataset else "")
        return (f"held-out accuracy ({on}, {self.split} split, greedy, {self.n} problems, at most {self.max_tokens} "
                f"tokens): {100 * self.accuracy:.1f}% (SE {100 * self.stderr:.1f}) in {self.seconds:.0f} s")


def quick_eval(folder: str | Path, reward: str = "math_pairs", dataset: str | None = None, *, n: int = DEFAULT_N,
               max_tokens: int = DEFAULT_MAX_TOKENS, data_roots: Sequence[str | Path] = (),
               progress: Callable[[str], None] | None = None) -> QuickEval:
    """Greedy accuracy of the model in `folder` on the first `n` held-out problems of `reward` (with
    `dataset` when it takes one), each answer at most `max_tokens` tokens. TaskError naming the
    problem for a reward or dataset that cannot give problems."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvr.rewards.combine import score_samples
    from rlvr.rewards.registry import Sample, load_registry
    from rlvr.tasks import get_task, heldout_split, render_prompt

    say = progress or (lambda _: None)
    task = get_task(reward, dataset, data_roots)  # TaskError naming an unknown reward or a bad dataset
    definition = load_registry().get(reward)
    split = heldout_split(task.splits(), dataset or reward)
    problems = task.prompts(n, seed=0, split=split)
    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    answers: list[tuple[str, str, float]] = []
    for first in range(0, len(problems), BATCH):
        batch = problems[first:first + BATCH]
        texts = [render_prompt(tokenizer, p) for p in batch]
        encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            out = model.generate(**encoded, max_new_tokens=max_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
        completions = tokenizer.batch_decode(out[:, encoded.input_ids.shape[1]:], skip_special_tokens=True)
        samples = [Sample(c, p.ground_truth, prompt=p.question, columns=p.columns)
                   for p, c in zip(batch, completions, strict=True)]
        scored = score_samples([(definition, 1.0)], samples)  # the reward service's scoring, columns and all
        answers += [(p.question, c, r.accuracy) for p, c, r in zip(batch, completions, scored, strict=True)]
        say(f"{len(answers)}/{len(problems)} answered")
    return QuickEval(reward=reward, dataset=dataset or "", split=split, n=len(answers),
                     correct=sum(a == 1.0 for _, _, a in answers), max_tokens=max_tokens,
                     seconds=time.monotonic() - started, answers=answers)
