"""The distribution a rollout token is drawn from, written once for the in-process samplers.

vLLM shapes it in its sampler (vllm/v1/sample/sampler.py, 0.32): the repetition penalty on the raw
logits (`apply_logits_processors` -> `apply_penalties`), greedy rows then take the argmax; sampled
rows divide by the temperature, drop tokens under min_p x the top token's probability
(`MinPLogitsProcessor`), then keep the top_k (ties kept) and of those the top_p nucleus
(`apply_top_k_top_p`). Its `processed_logprobs` are the log-softmax of the result. The rollout
server's transformers backend (services/rollout/hf_backend.py) and the trainer's in-process
generator (services/trainer/job/rollouts.py) call `shape_logits` so that every backend samples the same
way; the defaults (top_p 1, top_k 0, min_p 0, repetition_penalty 1) leave the tempered logits whole.

The loss does not see any of this: TRL scores a token under log_softmax(logits / temperature), the
whole tempered policy (docs/jobs.md, "Sampling controls").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def seen_tokens(rows: torch.Tensor, valid: torch.Tensor, vocab: int) -> torch.Tensor:
    """(rows, vocab) bool: which tokens each row of `rows` holds where `valid` (not padding)."""
    import torch

    counts = torch.zeros((rows.shape[0], vocab), dtype=torch.float32, device=rows.device)
    counts.scatter_add_(1, rows.clamp(0, vocab - 1), valid.to(torch.float32))
    return counts > 0


def penalize_repeats(logits: torch.Tensor, seen: torch.Tensor | None, penalty: float) -> torch.Tensor:
    """vLLM's (and transformers') repetition penalty: a seen token's positive logit divided by
    `penalty`, its negative one multiplied."""
    import torch

    if penalty == 1.0 or seen is None:
        return logits
    penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalized, logits)


def truncate(scaled: torch.Tensor, top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0) -> torch.Tensor:
    """Tempered logits with every token outside the min_p, top_k and top_p sets at -inf."""
    if min_p > 0.0:
        probs = scaled.softmax(dim=-1)
        scaled = scaled.masked_fill(probs < probs.amax(dim=-1, keepdim=True) * min_p, float("-inf"))
    if top_k > 0 and top_k < scaled.shape[-1]:
        kth = scaled.topk(top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p < 1.0:
        ascending, order = scaled.sort(dim=-1)
        drop = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
        drop[:, -1] = False  # at least the most likely token
        scaled = scaled.scatter(-1, order, ascending.masked_fill(drop, float("-inf")))
    return scaled


def shape_logits(logits: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0,
                 repetition_penalty: float = 1.0, seen: torch.Tensor | None = None,
                 greedy: bool = False) -> torch.Tensor:
    """The logits a token is drawn from (softmax) or, `greedy`, taken from (argmax): vLLM's order,
    above. `seen`: (rows, vocab) bool, the tokens of each row's prompt and completion so far (only
    read with a repetition penalty)."""
    logits = penalize_repeats(logits.float(), seen, repetition_penalty)
    if greedy:
        return logits
    return truncate(logits / temperature, top_p, top_k, min_p)
