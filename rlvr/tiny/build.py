"""Building the tiny base model: random init, then a short supervised warm-up on Math Pairs.

RL needs a policy that is sometimes right: with a random model every reward is zero and GRPO has no
signal. The warm-up teaches the answer format and part of the arithmetic on worked training problems
(``<think>3+4=7 5+6=11 7*11=77</think><answer>77</answer>``), and stops early on purpose, so the
greedy accuracy on the held-out Math Pairs set is partial and a training run has room to show a
gain. Offline, CPU only, and repeatable on one machine: one thread (see :func:`torch_threads`), and
the CPU kernels pinned to their AVX2 code on x86-64 (PINNED_KERNELS); the bundled model's recipe
also names the accuracy band a build must land in, trains on toward it from below, and fails loudly
outside it (WarmupRecipe.band). Bits still differ by CPU vendor, so the demo's model ships built
(rlvr.tiny.shipped) and this recipe rebuilds it.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from rlvr.common.settings import rlvr_home
from rlvr.tasks import math_pairs as mp
from rlvr.tasks.render import render_prompt
from rlvr.tiny.generate import generate_greedy, torch_threads
from rlvr.tiny.model import count_parameters, init_model, save_model
from rlvr.tiny.shipped import REBUILT_SUFFIX, is_shipped
from rlvr.tiny.tokenizer import IM_END, build_tokenizer

REPORT_FILE = "rlvr_build.json"
TOOLS_FILE = "rlvr_tools.json"  # a tools model's two-turn measures (greedy and sampled), beside its report
Progress = Callable[[str], None]


@dataclass(frozen=True)
class WarmupRecipe:
    steps: int
    batch_size: int
    learning_rate: float
    warmup_steps: int = 10
    # The held-out accuracy band the build must land in, or None. Floating-point results differ
    # between CPUs (kernels picked by instruction set) and hundreds of steps amplify it, so the same
    # recipe and seed landed at 12.6% on one machine and 5.8% on another. Below the band the build
    # goes on at a constant `extra_learning_rate` in chunks of `extra_chunk` steps, evaluating after
    # each, for at most `extra_steps`; outside the band at the end it fails loudly (BuildOutOfBand).
    band: tuple[float, float] | None = None
    extra_steps: int = 0
    extra_chunk: int = 25
    extra_learning_rate: float = 3e-4
    # Whole numbers 0 to number_tokens-1 as single tokens (rlvr.tiny.tokenizer): each sum and each
    # product of the worked chain is then one prediction. 0: the character tokenizer alone.
    number_tokens: int = 0
    # The share of warm-up examples that answer at a glance, `<think>~77</think><answer>77</answer>`,
    # instead of writing the worked chain: where it is above one half, greedy decoding takes the
    # glance (weak) while samples often write the chain (accurate), a global habit RL can change.
    direct_share: float = 0.0
    # The glances start after this many steps: the chain (the facts) is learned on every example
    # first, then the share is mixed in, which sets the habit (the first token) without starving it.
    direct_after: int = 0
    # Write each chain in one of its equivalent orders (the pairs, and the numbers within each pair,
    # swapped by a hash of the example's index), so a chain's first token is split over up to four
    # numbers while the glance's is one: greedy takes the glance, samples mostly the chain.
    shuffled_chain: bool = False
    # The held-out gate, or None: (least pass@16 - greedy, least maj@16 - greedy), measured by the
    # build on `eval_n` held-out problems at GATE_TEMPERATURE (the demo's); below it the build fails.
    gate: tuple[float, float] | None = None
    # The share of warm-up examples from step `tool_after` on that are the two-turn calculator
    # episode (rlvr.tiny.tools: turn 1 calls the tool, turn 2 copies its result), picked by a hash
    # of (seed, index), so independent of the glances; loss on the assistant's tokens of both turns.
    # Above 0 the tokenizer has the tool tags and the build's accuracy is the two-turn protocol's.
    tool_share: float = 0.0
    tool_after: int = 0
    # (least sum, share): the problems whose four numbers sum to at least the first value are tool
    # episodes at this share instead of tool_share (the big numbers, where a glance is weakest), so
    # whether the model calls the tool depends on the problem: greedy calls on the big sums and
    # seldom elsewhere, and the problems near the line sample both, which GRPO can shift.
    tool_hard: tuple[int, float] | None = None
    # The share of examples (from tool_after on) that are tool episodes on four numbers from 1 to
    # WIDE_MAX with one at least 10: no Math Pairs problem, whose result neither the chain nor memory
    # gives, so the model learns to copy the tool's result. Without them it answers turn 2 from the
    # question, as a glance: every training problem's answer is learned by heart, so copying earns
    # no lower loss (turn 2 right on 9-13% of the held-out calls; docs/measurements/tiny-diagnostics.md).
    tool_wide: float = 0.0
    # (least, most) greedy tool use and the least greedy accuracy with the tool on the held-out
    # two-turn protocol, or None; outside it the build fails (BuildFailedGate), kept beside.
    tool_gate: tuple[float, float, float] | None = None


GATE_TEMPERATURE = 0.3  # clients/demo.py RECIPE["temperature"]
GATE_K = 16
GATE_GROUP = 8  # the demo's group size
# Fields added after builds were cached: left out of a recipe's record while at their defaults, so
# those builds stay valid.
_LATER_FIELDS = {"number_tokens": 0, "direct_share": 0.0, "direct_after": 0, "shuffled_chain": False,
                 "gate": None, "tool_share": 0.0, "tool_after": 0, "tool_hard": None, "tool_wide": 0.0,
                 "tool_gate": None}


def recipe_record(recipe: WarmupRecipe) -> dict[str, object]:
    """The recipe as a build report records it (and as it reads back from JSON)."""
    fields = {k: v for k, v in asdict(recipe).items() if k not in _LATER_FIELDS or v != _LATER_FIELDS[k]}
    return _jsonable(fields)

# Measured on the shared 2-core machine (one thread): "default" (300 x 32) takes 150-460 s by load and
# reaches 12.6% greedy held-out accuracy with seed 0: room for RL, as the early 17% warm-up of
# docs/design.md (Learning on the bundled model) had (450 x 32 reached 23-27%, and RLVR moved it less). 150x64 gave 1.4%, 600x16 gave 4%, and
# lr 5e-3 or 1e-2 trained worse.
RECIPES: dict[str, WarmupRecipe] = {
    "test": WarmupRecipe(steps=20, batch_size=16, learning_rate=3e-3, warmup_steps=2),
    # 300 x 16 on the test shape, 8 s: format 100%, every completion stops, ~5% greedy accuracy
    "small": WarmupRecipe(steps=300, batch_size=16, learning_rate=3e-3, warmup_steps=5),
    "default": WarmupRecipe(steps=300, batch_size=32, learning_rate=3e-3, band=(0.10, 0.18), extra_steps=300),
    # RL headroom (issue 30; docs/measurements/tiny-diagnostics.md, design 5): whole-number tokens,
    # the chain alone first, then 60% glances, so greedy glances (17% held-out) where samples often
    # write the accurate chain: one 60-step GRPO run takes it to about 60%
    "headroom": WarmupRecipe(steps=700, batch_size=32, learning_rate=3e-3, number_tokens=325,
                             direct_share=0.6, direct_after=450, gate=(0.30, 0.05)),
    # Agents (rlvr-tiny-tools): headroom's warm-up with a minority of two-turn calculator episodes
    # (rlvr.tiny.tools), so the base knows the tool-call format but seldom calls it; measured with the
    # two-turn protocol (docs/measurements/tiny-diagnostics.md, "The tools model")
    "tools": WarmupRecipe(steps=700, batch_size=32, learning_rate=3e-3, number_tokens=325,
                          direct_share=0.6, direct_after=450, tool_share=0.1, tool_hard=(25, 0.8), tool_wide=0.2,
                          tool_gate=(0.10, 0.35, 0.85)),
}


class BuildOutOfBand(RuntimeError):
    """The warm-up ended with a held-out accuracy outside its recipe's band."""


class BuildFailedGate(RuntimeError):
    """The warm-up ended below its recipe's held-out gate (pass@k and maj@k over greedy)."""

    def __init__(self, diagnosis: dict[str, object], message: str) -> None:
        super().__init__(message)
        self.diagnosis = diagnosis


@dataclass(frozen=True)
class BuildReport:
    path: str
    size: str
    seed: int
    params: int
    build_seconds: float
    heldout_accuracy: float
    heldout_n: int
    recipe: dict[str, object]  # the WarmupRecipe used; a changed recipe invalidates a cached build
    final_loss: float
    steps: int = 0  # warm-up steps run: the recipe's, plus any taken to reach its band
    gate: dict[str, object] | None = None  # the held-out diagnosis the recipe's gate was judged on
    cpu_seconds: float = 0.0  # CPU time of the building process

    def summary(self) -> str:
        band = self.recipe.get("band")
        within = f" (band {band[0]:.0%}-{band[1]:.0%})" if isinstance(band, list) else ""  # JSON's list
        text = (
            f"tiny model '{self.size}' at {self.path}: {self.params / 1e6:.2f}M parameters, built in "
            f"{self.build_seconds:.1f} s ({self.steps} warm-up steps); greedy held-out Math Pairs accuracy "
            f"{self.heldout_accuracy:.1%} on {self.heldout_n} problems{within}"
        )
        if self.gate:
            text += "; gate passed: " + gate_line(self.gate)
        return text


def gate_line(d: dict[str, object]) -> str:
    """pass@k, maj@k and greedy of a diagnosis (Diagnosis.as_dict())."""
    greedy, passed, maj = (float(d[k]) for k in ("greedy", "pass_at_k", "maj_at_k"))  # type: ignore[arg-type]
    return (f"pass@{d['k']} {passed:.1%} ({100 * (passed - greedy):+.1f} points over greedy {greedy:.1%}), "
            f"maj@{d['k']} {maj:.1%} ({100 * (maj - greedy):+.1f}) at T={d['temperature']} on {d['n']} held-out")


def default_model_dir(name: str) -> Path:
    """``$RLVR_HOME/models/<name>`` (``RLVR_HOME`` defaults to ``~/.cache/rlvr``)."""
    return rlvr_home() / "models" / name


def default_model_name(size: str) -> str:
    return "rlvr-tiny" if size == "default" else f"rlvr-tiny-{size}"


def default_build_dir(size: str) -> Path:
    """Where a build of `size` goes by default: its name's folder, or beside it for a shipped model
    (whose folder holds the shipped copy)."""
    name = default_model_name(size)
    return default_model_dir(name + REBUILT_SUFFIX if is_shipped(name) else name)


def glance_solution(numbers) -> str:  # noqa: ANN001
    """The answer at a glance, no chain (the recipe's direct_share of the warm-up).

    >>> glance_solution((3, 4, 5, 6))
    '<think>~77</think><answer>77</answer>'
    """
    product = mp.answer(numbers)
    return f"<think>~{product}</think><answer>{product}</answer>"


def shuffled_solution(numbers, seed: int, index: int) -> str:  # noqa: ANN001
    """The worked chain in one of its eight equivalent orders, chosen by a hash of (seed, index).

    >>> shuffled_solution((3, 4, 5, 6), 0, 0)
    '<think>5+6=11 3+4=7 11*7=77</think><answer>77</answer>'
    """
    import hashlib

    bits = hashlib.sha256(f"rlvr.tiny.chain-order:{seed}:{index}".encode()).digest()[0]
    a, b, c, d = numbers
    if bits & 1:
        a, b = b, a
    if bits & 2:
        c, d = d, c
    if bits & 4:
        a, b, c, d = c, d, a, b
    return mp.worked_solution((a, b, c, d))


def is_glance(index: int, share: float) -> bool:
    """Whether example `index` of the sequence answers at a glance: spread evenly, `share` of them."""
    return int((index + 1) * share) > int(index * share)


def _examples(tokenizer, n: int, seed: int, start: int = 0,  # -> (input_ids, labels) LongTensors [n, T]
              direct_share: float = 0.0, shuffled_chain: bool = False, direct_from: int = 0,
              tool_share: float = 0.0, tool_from: int = 0, tool_hard: tuple[int, float] | None = None,
              tool_wide: float = 0.0):
    """Worked training problems `start` to `start + n` of the seed's sequence as token ids, loss only
    on the completion (answer + end of turn); `direct_share` of those from `direct_from` on answered
    at a glance; `tool_share` of those from `tool_from` on the two-turn tool episode instead (loss on
    both assistant turns, none on the tool message and the next turn's header), `tool_hard[1]` of
    those whose numbers sum to at least `tool_hard[0]`, and `tool_wide` of them a tool episode on
    wide_numbers instead of the problem."""
    import torch

    from rlvr.tiny.tools import tool_episode_numbers, tool_row

    rows: list[tuple[list[int], list[int]]] = []  # (ids, labels) of each example
    for index, problem in enumerate(mp.training_problems(start + n, seed)[start:], start):
        prompt = tokenizer(render_prompt(tokenizer, problem), add_special_tokens=False)["input_ids"]
        numbers = mp.parse_numbers(problem.question)
        episode = tool_episode_numbers(seed, index, numbers, tool_share, tool_hard, tool_wide) \
            if index >= tool_from else None
        if episode is not None:
            rows.append(tool_row(tokenizer, episode))
            continue
        if index >= direct_from and is_glance(index - direct_from, direct_share):
            solution = glance_solution(numbers)
        elif shuffled_chain:
            solution = shuffled_solution(numbers, seed, index)
        else:
            solution = mp.worked_solution(numbers)
        answer_text = solution + IM_END
        answer = tokenizer(answer_text, add_special_tokens=False)["input_ids"]
        rows.append((prompt + answer, [-100] * len(prompt) + answer))
    width = max(len(ids) for ids, _ in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.full((n, width), pad, dtype=torch.long)
    labels = torch.full((n, width), -100, dtype=torch.long)
    for i, (ids, row_labels) in enumerate(rows):  # right padding: training needs no generation
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, : len(ids)] = torch.tensor(row_labels)
    return input_ids, labels


class _Trainer:
    """The warm-up's optimizer, kept across the scheduled steps and any steps toward the band."""

    def __init__(self, model, tokenizer, recipe: WarmupRecipe, seed: int, progress: Progress | None) -> None:
        import torch

        torch.manual_seed(seed)
        self.model, self.tokenizer, self.recipe, self.seed, self.progress = model, tokenizer, recipe, seed, progress
        # beta2 0.95: the usual choice for short runs, where 0.999 adapts too slowly
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=recipe.learning_rate, betas=(0.9, 0.95), weight_decay=0.0
        )
        self.steps_done = 0
        self.loss = float("nan")

    def run(self, steps: int, learning_rate: Callable[[int], float], total: int) -> float:
        """`steps` more steps on the next examples of the seed's sequence, at `learning_rate(step)`."""
        import torch

        batch = self.recipe.batch_size
        input_ids, labels = _examples(self.tokenizer, steps * batch, self.seed, start=self.steps_done * batch,
                                      direct_share=self.recipe.direct_share,
                                      shuffled_chain=self.recipe.shuffled_chain,
                                      direct_from=self.recipe.direct_after * batch,
                                      tool_share=self.recipe.tool_share,
                                      tool_from=self.recipe.tool_after * batch,
                                      tool_hard=self.recipe.tool_hard, tool_wide=self.recipe.tool_wide)
        attention = (input_ids != self.tokenizer.pad_token_id).long()
        self.model.train()
        for i in range(steps):
            step = self.steps_done
            for group in self.optimizer.param_groups:
                group["lr"] = learning_rate(step)
            rows = slice(i * batch, (i + 1) * batch)
            used = int(attention[rows].sum(dim=1).max())  # trim the batch to its longest row
            out = self.model(input_ids=input_ids[rows, :used], attention_mask=attention[rows, :used],
                             labels=labels[rows, :used])
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.loss = out.loss.item()
            self.steps_done += 1
            if self.progress and (step % 25 == 0 or self.steps_done == total):
                self.progress(f"warm-up step {self.steps_done}/{total} loss {self.loss:.3f}")
        self.model.eval()
        return self.loss


def warm_up(model, tokenizer, recipe: WarmupRecipe, seed: int, progress: Progress | None = None) -> float:
    """Supervised warm-up (the recipe's scheduled steps); returns the last step's loss."""
    return _scheduled(_Trainer(model, tokenizer, recipe, seed, progress))


def _scheduled(trainer: _Trainer) -> float:
    """The recipe's steps: a linear warm-up to the learning rate, then a linear decay to zero."""
    r = trainer.recipe

    def rate(step: int) -> float:  # as torch's LambdaLR computes it: base rate x (the factor)
        return r.learning_rate * (min(1.0, (step + 1) / r.warmup_steps)
                                  * max(0.0, (r.steps - step) / max(1, r.steps - r.warmup_steps)))

    return trainer.run(r.steps, rate, r.steps)


def warm_up_into_band(model, tokenizer, recipe: WarmupRecipe, seed: int, progress: Progress | None,
                      evaluate: Callable[[], tuple[float, int]]) -> tuple[float, float, int, int]:
    """The scheduled warm-up, then, while the held-out accuracy (`evaluate`) is below the recipe's
    band, more steps at its constant extra rate, `extra_chunk` at a time, up to `extra_steps`.
    Returns (loss, accuracy, n evaluated, steps run); BuildOutOfBand when it ends outside the band."""
    trainer = _Trainer(model, tokenizer, recipe, seed, progress)
    loss = _scheduled(trainer)
    accuracy, n = evaluate()
    if recipe.band is None:
        return loss, accuracy, n, trainer.steps_done
    low, high = recipe.band
    limit = recipe.steps + recipe.extra_steps
    while accuracy < low and trainer.steps_done < limit:
        if progress:
            progress(f"held-out accuracy {accuracy:.1%} after {trainer.steps_done} steps is below the band "
                     f"{low:.0%}-{high:.0%}: {recipe.extra_chunk} more steps")
        chunk = min(recipe.extra_chunk, limit - trainer.steps_done)
        loss = trainer.run(chunk, lambda _step: recipe.extra_learning_rate, limit)
        accuracy, n = evaluate()
    if not low <= accuracy <= high:
        raise BuildOutOfBand(
            f"the tiny model's warm-up ended at {accuracy:.1%} greedy held-out accuracy after "
            f"{trainer.steps_done} steps, outside its band {low:.0%}-{high:.0%} (recipe {recipe}); this "
            "machine's floating point took it elsewhere than the recipe was measured on: report it with "
            "`lscpu` and the torch version")
    return loss, accuracy, n, trainer.steps_done


def check_gate(model, tokenizer, gate: tuple[float, float], eval_n: int,  # noqa: ANN001
               progress: Progress | None) -> dict[str, object]:
    """The held-out diagnosis at the demo's temperature; BuildFailedGate below the recipe's gate."""
    from rlvr.tiny.diagnose import diagnose_model

    found = diagnose_model(model, tokenizer, "build", n=eval_n, k=GATE_K, group=GATE_GROUP,
                           temperature=GATE_TEMPERATURE).as_dict()
    line = gate_line(found)
    if progress:
        progress("gate: " + line + f"; groups with no reward spread {float(found['zero_spread_groups']):.1%}")  # type: ignore[arg-type]
    pass_gap = float(found["pass_at_k"]) - float(found["greedy"])  # type: ignore[arg-type]
    maj_gap = float(found["maj_at_k"]) - float(found["greedy"])  # type: ignore[arg-type]
    if pass_gap < gate[0] or maj_gap < gate[1]:
        raise BuildFailedGate(found, f"the tiny model failed its gate (pass@{GATE_K} - greedy at least "
                              f"{100 * gate[0]:.0f} points, maj@{GATE_K} - greedy at least {100 * gate[1]:.0f}): {line}")
    return found


def heldout_accuracy(
    model, tokenizer, n: int = 500, seed: int = 0, batch_size: int = 128
) -> tuple[float, int]:
    from rlvr.rewards.scoring import score

    problems = mp.heldout_problems(n, seed)
    prompts = [render_prompt(tokenizer, p) for p in problems]
    completions = generate_greedy(model, tokenizer, prompts, max_new_tokens=48, batch_size=batch_size)
    correct = sum(
        score("math_pairs", c, p.ground_truth).accuracy for c, p in zip(completions, problems, strict=True)
    )
    return correct / len(problems), len(problems)


def evaluate_tools_build(model, tokenizer, n: int, progress: Progress | None) -> dict[str, object]:  # noqa: ANN001
    """A tools model's two-turn protocol on `n` held-out problems: greedy, and GATE_GROUP episodes
    per problem at GATE_TEMPERATURE (the demo's group and temperature)."""
    from rlvr.tiny.tools import evaluate_tools

    found = {"greedy": evaluate_tools(model, tokenizer, "build", n),
             "sampled": evaluate_tools(model, tokenizer, "build", n, k=GATE_GROUP, temperature=GATE_TEMPERATURE)}
    if progress:
        for measured in found.values():
            progress("tools: " + measured.line())
    return {key: measured.as_dict() for key, measured in found.items()}


def check_tool_gate(found: dict[str, object], gate: tuple[float, float, float]) -> None:
    """BuildFailedGate unless greedy tool use is within gate[0]-gate[1] and greedy accuracy with the
    tool at least gate[2] (`found`: evaluate_tools_build's measures)."""
    greedy = found["greedy"]
    use, right = float(greedy["tool_use"]), float(greedy["accuracy_with_tool"])  # type: ignore[index]
    if not gate[0] <= use <= gate[1] or right < gate[2]:
        raise BuildFailedGate(found, f"the tools model failed its gate (greedy tool use {100 * gate[0]:.0f}-"
                              f"{100 * gate[1]:.0f}%, accuracy with the tool at least {100 * gate[2]:.0f}%): "
                              f"tool use {use:.1%}, accuracy with the tool {right:.1%}")


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
    sizes; ``<name>.rebuilt`` for a model rlvr ships built, whose name means the shipped copy:
    rlvr.tiny.shipped). An existing build of the same size, seed and recipe is reused unless ``force``.
    """
    if size not in RECIPES:
        raise ValueError(
            f"size {size!r} is not a tiny model size; choose one of {sorted(RECIPES)} "
            f"(bench-large is untrained: use build_untrained_model)"
        )
    out = (Path(out_dir) if out_dir is not None else default_build_dir(size)).absolute()
    existing = None if force else _existing_build(out, size, seed)
    if existing is not None:
        if progress:
            progress(f"reusing {out} (pass force=True to rebuild)")
        return existing
    if _can_pin_kernels() and not _kernels_pinned():
        return _build_with_pinned_kernels(out, size, seed, progress, eval_n)
    started = time.perf_counter()
    cpu_started = time.process_time()
    recipe = RECIPES[size]
    gate = None
    with torch_threads() as threads:
        if progress:
            pinned = " on pinned AVX2 kernels" if _kernels_pinned() else ""
            progress(f"building tiny model '{size}' (seed {seed}) with {threads} thread(s){pinned} into {out}")
        tools = recipe.tool_share > 0 or recipe.tool_hard is not None
        tokenizer = build_tokenizer(number_tokens=recipe.number_tokens, tool_tags=tools)
        model = init_model(size, seed, len(tokenizer))
        tool_measures: dict[str, object] | None = None

        def evaluate() -> tuple[float, int]:
            nonlocal tool_measures
            if not tools:
                return heldout_accuracy(model, tokenizer, eval_n)
            tool_measures = evaluate_tools_build(model, tokenizer, eval_n, progress)
            greedy = tool_measures["greedy"]
            return float(greedy["accuracy"]), int(greedy["n"])  # type: ignore[index]

        final_loss, accuracy, n, steps = warm_up_into_band(model, tokenizer, recipe, seed, progress, evaluate)
        if recipe.gate is not None or (recipe.tool_gate is not None and tool_measures is not None):
            try:
                if recipe.gate is not None:
                    gate = check_gate(model, tokenizer, recipe.gate, eval_n, progress)
                if recipe.tool_gate is not None and tool_measures is not None:
                    check_tool_gate(tool_measures, recipe.tool_gate)
            except BuildFailedGate as e:  # kept beside, for `rlvr models inspect`, never where a build is looked for
                failed = out.with_name(out.name + ".failed")
                shutil.rmtree(failed, ignore_errors=True)
                save_model(model, failed, number_tokens=recipe.number_tokens, tool_tags=tools)
                (failed / "rlvr_gate.json").write_text(json.dumps(e.diagnosis, indent=2) + "\n")
                raise BuildFailedGate(e.diagnosis, f"{e} (the model is kept at {failed})") from None
        # Save to a sibling and rename, so a crash never leaves a half model that looks built.
        staging = out.with_name(out.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        save_model(model, staging, number_tokens=recipe.number_tokens, tool_tags=tools)
        if tool_measures is not None:
            (staging / TOOLS_FILE).write_text(json.dumps(tool_measures, indent=2) + "\n")
    report = BuildReport(
        path=str(out),
        size=size,
        seed=seed,
        params=count_parameters(model),
        build_seconds=round(time.perf_counter() - started, 2),
        heldout_accuracy=accuracy,
        heldout_n=n,
        recipe=recipe_record(recipe),  # as it reads back from the report
        final_loss=round(final_loss, 4),
        steps=steps,
        gate=gate,
        cpu_seconds=round(time.process_time() - cpu_started, 2),
    )
    (staging / REPORT_FILE).write_text(json.dumps(asdict(report), indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(out)
    if progress:
        progress(report.summary())
    return report


# The CPU kernels a build runs on. MKL (matrix products) and torch's own kernels pick their code by
# the CPU's instruction set, and float results differ between those codes: the same recipe and seed
# built to 12.6% held-out accuracy on this project's AVX2 machines, 5.8% on another kind, and 8.2% here
# with MKL forced onto its oldest code (MKL_CBWR=COMPATIBLE). Pinned to the AVX2 code, a build is
# repeatable on one host and the same across AVX2 and AVX-512 hosts of one CPU vendor (here: bit for
# bit the unpinned build), but not across vendors: an Intel Xeon built other bits of the headroom
# model than AMD EPYC hosts, so the demo's model ships built (rlvr.tiny.shipped). Both are read when
# the libraries start, so a build runs in a child process.
PINNED_KERNELS = {"MKL_CBWR": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


def _can_pin_kernels() -> bool:
    """An x86-64 CPU with AVX2 (elsewhere there is no such code to pin: the recipe's band guards)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        return " avx2" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def _kernels_pinned() -> bool:
    return all(os.environ.get(name) == value for name, value in PINNED_KERNELS.items())


def _build_with_pinned_kernels(out: Path, size: str, seed: int, progress: Progress | None,
                               eval_n: int) -> BuildReport:
    """`python -m rlvr.tiny build` in a child process with PINNED_KERNELS set; its progress lines
    are passed on, its report returned. RuntimeError with its last lines when it fails."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "rlvr.tiny", "build", "--size", size, "--seed", str(seed), "--out", str(out),
           "--eval-n", str(eval_n), "--force", "--json"]
    child = subprocess.Popen(cmd, env={**os.environ, **PINNED_KERNELS}, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stderr is not None
    tail: list[str] = []
    for line in child.stderr:
        line = line.rstrip()
        tail = (tail + [line])[-20:]
        if progress and line:
            progress(line)
    report = child.stdout.read()
    if child.wait() != 0:
        raise RuntimeError(f"building the tiny model {size!r} failed: " + " | ".join(tail[-5:]))
    return BuildReport(**json.loads(report))


def _jsonable(value: dict[str, object]) -> dict[str, object]:
    """What a value reads back as from JSON (tuples become lists)."""
    return json.loads(json.dumps(value))


def _existing_build(out: Path, size: str, seed: int) -> BuildReport | None:
    """The saved report when ``out`` holds a complete build of this size, seed and recipe."""
    try:
        report = BuildReport(**json.loads((out / REPORT_FILE).read_text()))
    except (OSError, ValueError, TypeError):  # absent, corrupt or from another version: rebuild
        return None
    same = (report.size, report.seed, report.recipe) == (size, seed, recipe_record(RECIPES[size]))
    if not same or not (out / "model.safetensors").is_file():
        return None
    # Where it is now, absolute: the folder may have moved, or been recorded relative to another cwd.
    return replace(report, path=str(out.absolute()))
