"""A job's training problems and their prompts, rendered with the job's tokenizer."""


from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rlvr.services.trainer.job.config import JobConfig
from rlvr.services.trainer.job.scorers import LocalProblems, ProblemSource
from rlvr.tasks.base import Problem

if TYPE_CHECKING:
    pass



def training_problems(job: JobConfig, source: ProblemSource | None = None) -> tuple[list[Problem], str | None]:
    """Every training problem of the job (a seeded order, whichever split it trains on) and the
    instruction to render them with (None: the registry's), from `source` (default: this process's
    registry, LocalProblems). A reward that generates its prompts makes `synthetic_prompts` of them."""
    source = source or LocalProblems(job.data_roots)
    split = job.dataset_split if (job.dataset or not job.synthetic_prompts) else "train"
    problems, instruction = source.training(job.reward_function, job.synthetic_prompts or None, job.seed,
                                            job.dataset, split)
    if not problems:
        raise ValueError(f"reward.dataset: {job.dataset!r} has no training problems")
    return problems, instruction


def training_prompts(job: JobConfig, tokenizer: Any, source: ProblemSource | None = None) -> list[tuple[str, str]]:
    """(rendered prompt, ground truth) of every training problem, rendered for this model."""
    return [(text, p.ground_truth) for text, p in rendered_problems(job, tokenizer, source)]


def rendered_problems(job: JobConfig, tokenizer: Any, source: ProblemSource | None = None
                      ) -> list[tuple[str, Problem]]:
    """(rendered prompt, the problem) of every training problem: the rewards read the problem's
    question and columns beside the completion."""
    return rendered_with(tokenizer, *training_problems(job, source))


def rendered_with(tokenizer: Any, problems: Sequence[Problem], instruction: str | None) -> list[tuple[str, Problem]]:
    """(rendered prompt, the problem) of each problem, with `instruction` (None: the registry's)."""
    from rlvr.tasks import render_prompt

    return [(render_prompt(tokenizer, p, instruction=instruction), p) for p in problems]
