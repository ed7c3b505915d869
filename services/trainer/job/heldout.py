"""Evaluation while training (advanced.eval_every, eval_size): every N steps, once the step's adapter is
pushed, the job's own generator answers the first `eval_size` problems of its reward's held-out split
greedily with that adapter, and the job's scorer scores them as it scores the rollouts. The accuracy
rides on the step's MetricEvent (`heldout_accuracy`), so the RL Metrics chart, the history export and
the trackers carry it with the step.

The problems are the benchmark's (the reward service's HELDOUT split, in the data's own order): a
held-out subset of the size the user picks, never trained on. The evaluation of record stays the
benchmark service's (`rlvr eval run`); this one is the line that shows learning while it happens.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass
from typing import Any

from rlvr.peers.types import AdapterTag, Sampling, ScoreInput
from rlvr.services.trainer.job.config import JobConfig
from rlvr.services.trainer.job.rollouts import PolicyGenerator
from rlvr.services.trainer.job.scorers import ProblemSource, Scorer
from rlvr.tasks.base import Problem

log = logging.getLogger("rlvr.trainer.heldout")

# The seed of the held-out answers: greedy needs none, but a generator asks for one.
EVAL_SEED = 0


@dataclass
class HeldoutEval:
    """The job's held-out problems, rendered for its model, and how often to answer them."""

    every: int
    problems: list[Problem]
    prompt_ids: list[list[int]]
    max_tokens: int

    @classmethod
    def for_job(cls, job: JobConfig, source: ProblemSource, tokenizer: Any, instruction: str | None
                ) -> HeldoutEval | None:
        """None when the job does not evaluate while training."""
        if not job.eval_every:
            return None
        from rlvr.tasks import render_prompt

        problems = source.heldout(job.reward_function, job.eval_size, job.dataset)
        if not problems:
            raise ValueError(f"advanced.eval_every: the reward {job.reward_function!r} has no held-out problems")
        if len(problems) < job.eval_size:
            log.warning("job %s: the held-out split has %d problems, fewer than advanced.eval_size %d: all of them "
                        "are evaluated", job.job_id, len(problems), job.eval_size)
        ids = [list(tokenizer(render_prompt(tokenizer, p, instruction=instruction),
                              add_special_tokens=False)["input_ids"]) for p in problems]
        return cls(job.eval_every, problems, ids, job.max_completion_tokens)

    def due(self, step: int, total: int) -> bool:
        return step % self.every == 0 or step == total

    def accuracy(self, generator: PolicyGenerator, tokenizer: Any, scorer: Scorer, live: AdapterTag,
                 chunk: int) -> float | None:
        """The greedy accuracy of `live` (the adapter just pushed) on the held-out problems, generated
        `chunk` prompts a call (the job's batch: what its generator is sized for); None, logged, when
        the reward failed every answer (a broken reward is not a 0% point on the chart)."""
        started = time.perf_counter()
        sampling = Sampling(temperature=0.0, max_tokens=self.max_tokens, seed=EVAL_SEED, group_size=1)
        texts: list[str] = []
        for first in range(0, len(self.prompt_ids), max(chunk, 1)):
            batch = generator.generate(self.prompt_ids[first:first + chunk], sampling, live)
            texts += tokenizer.batch_decode(batch.completion_ids, skip_special_tokens=True)
        scores = scorer.score([ScoreInput.of(text, problem) for text, problem in zip(texts, self.problems,
                                                                                   strict=True)])
        errors = [s.error for s in scores if s.error]
        if errors:
            log.warning("held-out evaluation of %s v%d: the reward failed %d of %d answers (first: %s)%s", live.name,
                        live.version, len(errors), len(scores), errors[0],
                        "; no held-out accuracy for this step" if len(errors) == len(scores) else "")
            if len(errors) == len(scores):
                return None
        accuracy = statistics.fmean(s.accuracy for s in scores)
        log.info("held-out accuracy of %s v%d: %.3f on %d problems (%.1f s)", live.name, live.version, accuracy,
                 len(self.problems), time.perf_counter() - started)
        return accuracy
