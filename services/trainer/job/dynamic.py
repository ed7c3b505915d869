"""DAPO's dynamic sampling (Yu et al. 2025, "DAPO", section 3.2), in the trainer's rollout.

GRPO's advantage is a completion's reward against its group's mean: a group whose completions all
earn the same reward (all wrong, the common case for a weak model, or all right) has zero
advantage everywhere and adds nothing to the gradient but noise in the token count. With dynamic
sampling a step keeps generating groups for further training prompts until it has as many groups
*with* a reward spread as the step has prompts, or it has drawn `MAX_DRAW_FACTOR` times the step's
prompts; groups without signal fill the batch when too few carry one, so a step never shrinks.

Pure selection logic here; `Step.rollout` (step.py) drives the generation and scoring rounds. Each
completion is scored once: the kept groups' scores are the rewards TRL trains with.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlvr.peers.types import Score
from rlvr.services.trainer.job.rollouts import RolloutBatch

MAX_DRAW_FACTOR = 4  # at most 4x the step's prompts are generated for one step
_SPREAD = 1e-9


@dataclass
class Group:
    """One prompt's `group_size` completions with their scores."""

    prompt: str
    truth: str
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    logprobs: list[list[float]] | None
    clipped: list[bool]
    scores: list[Score]
    version: int = 0  # the job's adapter version that generated it (0: the base or the init adapter)

    @property
    def has_signal(self) -> bool:
        rewards = [s.reward for s in self.scores]
        return max(rewards) - min(rewards) > _SPREAD


def split_groups(batch: RolloutBatch, prompts: Sequence[str], truths: Sequence[str], scores: Sequence[Score],
                 group_size: int, version: int = 0) -> list[Group]:
    """The batch's rows as groups: rows [i*g, (i+1)*g) belong to prompts[i]."""
    if len(batch.completion_ids) != len(prompts) * group_size or len(scores) != len(batch.completion_ids):
        raise RuntimeError(f"expected {len(prompts)} x {group_size} scored completions, "
                           f"got {len(batch.completion_ids)} with {len(scores)} scores")
    groups = []
    for i, (prompt, truth) in enumerate(zip(prompts, truths, strict=True)):
        rows = slice(i * group_size, (i + 1) * group_size)
        groups.append(Group(
            prompt=prompt, truth=truth, prompt_ids=batch.prompt_ids[rows], completion_ids=batch.completion_ids[rows],
            logprobs=batch.logprobs[rows] if batch.logprobs else None, clipped=list(batch.clipped[rows]),
            scores=list(scores[rows]), version=version,
        ))
    return groups


def select_groups(groups: Sequence[Group], need: int) -> list[Group]:
    """`need` groups: those with a reward spread first, in the order drawn, then groups without
    signal (the step's own prompts come first in `groups`) to keep the batch full."""
    with_signal = [g for g in groups if g.has_signal]
    without = [g for g in groups if not g.has_signal]
    chosen = (with_signal + without)[:need]
    if len(chosen) < need:
        raise RuntimeError(f"dynamic sampling: {len(groups)} groups for a batch of {need}")
    return chosen


class PromptDraw:
    """Further training prompts for dynamic sampling: a seeded shuffle of the training set, cycled,
    independent of TRL's own sampler (so turning dynamic sampling on leaves the step's own prompts
    as they were)."""

    def __init__(self, prompts: Sequence[tuple[str, str]], seed: int) -> None:
        self._prompts = list(prompts)
        self._rng = random.Random(seed * 7_919 + 17)
        self._order: list[int] = []
        self._lock = threading.Lock()  # asynchronous steps draw on the prefetch thread (prefetch.py)

    def take(self, n: int) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        with self._lock:
            while len(out) < n:
                if not self._order:
                    self._order = list(range(len(self._prompts)))
                    self._rng.shuffle(self._order)
                out.append(self._prompts[self._order.pop()])
        return out

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the draw (JSON): its generator and the rest of its round."""
        with self._lock:
            version, internal, gauss = self._rng.getstate()
            return {"rng": [version, list(internal), gauss], "order": list(self._order)}

    def restore(self, state: dict[str, Any]) -> None:
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))
        self._order = [int(i) for i in state["order"]]
