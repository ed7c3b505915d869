"""Building the tiny base model: random init, then a short supervised warm-up on Math Pairs.

RL needs a policy that is sometimes right: with a random model every reward is zero and GRPO has no
signal. The warm-up teaches the answer format and part of the arithmetic on worked training problems
(``<think>3+4=7 5+6=11 7*11=77</think><answer>77</answer>``), and stops early on purpose, so the
greedy accuracy on the held-out Math Pairs set is partial (about 10-40%) and a training run has room
to show a gain. Offline, CPU only, and deterministic for a (size, seed) with the default single
thread (see :func:`torch_threads`).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from rlvr.tasks import math_pairs as mp
from rlvr.tasks.render import render_prompt
from rlvr.tiny.model import count_parameters, init_model, save_model
from rlvr.tiny.tokenizer import IM_END, build_tokenizer

REPORT_FILE = "rlvr_build.json"
Progress = Callable[[str], None]


@dataclass(frozen=True)
class WarmupRecipe:
    steps: int
    batch_size: int
    learning_rate: float
    warmup_steps: int = 10


# Measured on the shared 2-core machine (one thread): "default" (300 x 32) takes 150-460 s by load and
# reaches 12.6% greedy held-out accuracy with seed 0: room for RL, as DESIGN.md's 17% starting point
# had (450 x 32 reached 23-27%, and RLVR moved it less). 150x64 gave 1.4%, 600x16 gave 4%, and
# lr 5e-3 or 1e-2 trained worse.
RECIPES: dict[str, WarmupRecipe] = {
    "test": WarmupRecipe(steps=20, batch_size=16, learning_rate=3e-3, warmup_steps=2),
    # 300 x 16 on the test shape, 8 s: format 100%, every completion stops, ~5% greedy accuracy
    "small": WarmupRecipe(steps=300, batch_size=16, learning_rate=3e-3, warmup_steps=5),
    "default": WarmupRecipe(steps=300, batch_size=32, learning_rate=3e-3),
}


@dataclass(frozen=True)
class BuildReport:
    path: str
    size: str
    seed: int
    params: int
    build_seconds: float
    heldout_accuracy: float
    heldout_n: int
    recipe: dict[str, float]  # the WarmupRecipe used; a changed recipe invalidates a cached build
    final_loss: float

    def summary(self) -> str:
        return (
            f"tiny model '{self.size}' at {self.path}: {self.params / 1e6:.2f}M parameters, built in "
            f"{self.build_seconds:.1f} s; greedy held-out Math Pairs accuracy "
            f"{self.heldout_accuracy:.1%} on {self.heldout_n} problems"
        )


def rlvr_home() -> Path:
    return Path(os.environ.get("RLVR_HOME") or Path.home() / ".cache" / "rlvr").expanduser()


def default_model_dir(name: str) -> Path:
    """``$RLVR_HOME/models/<name>`` (``RLVR_HOME`` defaults to ``~/.cache/rlvr``)."""
    return rlvr_home() / "models" / name


def default_model_name(size: str) -> str:
    return "rlvr-tiny" if size == "default" else f"rlvr-tiny-{size}"


@contextmanager
def torch_threads(threads: int | None = None) -> Iterator[int]:
    """Run with ``threads`` torch threads (default ``$RLVR_TINY_THREADS`` or 1), then restore.

    One thread by default, for two reasons: float reductions then run in one order on any machine,
    so a build is reproducible whatever the core count; and on this project's shared 2-core machines
    one thread measured 5-30x faster than two while other processes ran (OpenMP spin-waiting).
    """
    import torch

    count = max(1, threads or int(os.environ.get("RLVR_TINY_THREADS", "1")))
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield count
    finally:
        torch.set_num_threads(previous)


def _examples(tokenizer, n: int, seed: int):  # -> (input_ids, labels) LongTensors [n, T]
    """Worked training problems as token ids, loss only on the completion (answer + end of turn)."""
    import torch

    rows: list[tuple[list[int], list[int]]] = []
    for problem in mp.training_problems(n, seed):
        prompt = tokenizer(render_prompt(tokenizer, problem), add_special_tokens=False)["input_ids"]
        answer_text = mp.worked_solution(mp.parse_numbers(problem.question)) + IM_END
        answer = tokenizer(answer_text, add_special_tokens=False)["input_ids"]
        rows.append((prompt, answer))
    width = max(len(p) + len(a) for p, a in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.full((n, width), pad, dtype=torch.long)
    labels = torch.full((n, width), -100, dtype=torch.long)
    for i, (prompt, answer) in enumerate(rows):  # right padding: training needs no generation
        ids = prompt + answer
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, len(prompt) : len(ids)] = torch.tensor(answer)
    return input_ids, labels


def warm_up(model, tokenizer, recipe: WarmupRecipe, seed: int, progress: Progress | None = None) -> float:
    """Supervised warm-up; returns the last step's loss."""
    import torch

    torch.manual_seed(seed)
    input_ids, labels = _examples(tokenizer, recipe.steps * recipe.batch_size, seed)
    attention = (input_ids != tokenizer.pad_token_id).long()
    # beta2 0.95: the usual choice for short runs, where 0.999 adapts too slowly
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=recipe.learning_rate, betas=(0.9, 0.95), weight_decay=0.0
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: (
            min(1.0, (step + 1) / recipe.warmup_steps)
            * max(0.0, (recipe.steps - step) / max(1, recipe.steps - recipe.warmup_steps))
        ),
    )
    model.train()
    loss_value = float("nan")
    for step in range(recipe.steps):
        rows = slice(step * recipe.batch_size, (step + 1) * recipe.batch_size)
        used = int(attention[rows].sum(dim=1).max())  # trim the batch to its longest row
        out = model(
            input_ids=input_ids[rows, :used],
            attention_mask=attention[rows, :used],
            labels=labels[rows, :used],
        )
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        loss_value = out.loss.item()
        if progress and (step % 25 == 0 or step == recipe.steps - 1):
            progress(f"warm-up step {step + 1}/{recipe.steps} loss {loss_value:.3f}")
    model.eval()
    return loss_value


def generate_greedy(model, tokenizer, prompts: list[str], max_new_tokens: int, batch_size: int) -> list[str]:
    """Greedy completions (special tokens dropped; the answer tags are ordinary tokens and stay)."""
    import torch

    tokenizer.padding_side = "left"
    completions: list[str] = []
    with torch.inference_mode():
        for start in range(0, len(prompts), batch_size):
            batch = tokenizer(
                prompts[start : start + batch_size],
                return_tensors="pt",
                padding=True,
                add_special_tokens=False,
            )
            out = model.generate(
                **batch, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
            completions += tokenizer.batch_decode(
                out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True
            )
    return completions


def heldout_accuracy(
    model, tokenizer, n: int = 500, seed: int = 0, batch_size: int = 128
) -> tuple[float, int]:
    from services.reward.scoring import score

    problems = mp.heldout_problems(n, seed)
    prompts = [render_prompt(tokenizer, p) for p in problems]
    completions = generate_greedy(model, tokenizer, prompts, max_new_tokens=48, batch_size=batch_size)
    correct = sum(
        score("math_pairs", c, p.ground_truth).accuracy for c, p in zip(completions, problems, strict=True)
    )
    return correct / len(problems), len(problems)


def evaluate_heldout(model_path: str | Path, n: int = 500, seed: int = 0) -> tuple[float, int]:
    """Greedy accuracy of a saved model on ``n`` held-out Math Pairs problems, with transformers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with torch_threads():
        tokenizer = AutoTokenizer.from_pretrained(str(model_path))
        model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype="float32").eval()
        return heldout_accuracy(model, tokenizer, n, seed)


def build_tiny_model(
    out_dir: str | Path | None = None,
    size: str = "default",
    seed: int = 0,
    progress: Progress | None = None,
    force: bool = False,
    eval_n: int = 500,
) -> BuildReport:
    """Build (or reuse) the tiny base model and return its report (also saved as rlvr_build.json).

    ``out_dir`` defaults to ``default_model_dir("rlvr-tiny")`` (``rlvr-tiny-<size>`` for other
    sizes). An existing build of the same size, seed and recipe is reused unless ``force``.
    """
    if size not in RECIPES:
        raise ValueError(
            f"size {size!r} is not a tiny model size; choose one of {sorted(RECIPES)} "
            f"(bench-large is untrained: use build_untrained_model)"
        )
    out = Path(out_dir) if out_dir is not None else default_model_dir(default_model_name(size))
    existing = None if force else _existing_build(out, size, seed)
    if existing is not None:
        if progress:
            progress(f"reusing {out} (pass force=True to rebuild)")
        return existing
    started = time.perf_counter()
    with torch_threads() as threads:
        if progress:
            progress(f"building tiny model '{size}' (seed {seed}) with {threads} thread(s) into {out}")
        tokenizer = build_tokenizer()
        model = init_model(size, seed, len(tokenizer))
        final_loss = warm_up(model, tokenizer, RECIPES[size], seed, progress)
        # Save to a sibling and rename, so a crash never leaves a half model that looks built.
        staging = out.with_name(out.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        save_model(model, staging)
        accuracy, n = heldout_accuracy(model, tokenizer, eval_n)
    report = BuildReport(
        path=str(out),
        size=size,
        seed=seed,
        params=count_parameters(model),
        build_seconds=round(time.perf_counter() - started, 2),
        heldout_accuracy=accuracy,
        heldout_n=n,
        recipe=asdict(RECIPES[size]),
        final_loss=round(final_loss, 4),
    )
    (staging / REPORT_FILE).write_text(json.dumps(asdict(report), indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(out)
    if progress:
        progress(report.summary())
    return report


def _existing_build(out: Path, size: str, seed: int) -> BuildReport | None:
    """The saved report when ``out`` holds a complete build of this size, seed and recipe."""
    try:
        report = BuildReport(**json.loads((out / REPORT_FILE).read_text()))
    except (OSError, ValueError, TypeError):  # absent, corrupt or from another version: rebuild
        return None
    same = (report.size, report.seed, report.recipe) == (size, seed, asdict(RECIPES[size]))
    return report if same and (out / "model.safetensors").is_file() else None
