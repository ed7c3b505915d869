"""How a request's sampling seed becomes each prompt's: one derivation for every generation backend.

A step (or an evaluation's batch) carries one seed; each of its prompts samples from a random stream of
its own, seeded with `prompt_seed(seed, index)`. One seed for every prompt would give completion j of
each prompt the same random numbers, so a step's groups would be sampled alike. The transformers
sampler (services/trainer/job/rollouts.py, SeededSampler) and the vLLM rollout server
(services/rollout/vllm_backend.py) both use it, the former with the prompt's index in the step's whole
batch, the latter with its index in the Generate request.

A caller that sends a step's prompts in contiguous parts (rollout replicas, a job's processes) sends
the part starting at prompt k the seed `offset_seed(seed, k)`: its i-th prompt is then seeded as prompt
k + i of the whole batch (`prompt_seed(offset_seed(seed, k), i) == prompt_seed(seed, k + i)`), so the
completions do not depend on the split, and no two prompts of a step share their draws.
"""

from __future__ import annotations

_GOLDEN = 0x9E3779B97F4A7C15  # odd: invertible modulo 2**64
_STEP = 0xBF58476D1CE4E5B9
_WORD = 2**64
# offset_seed's shift: k * _SHIFT moves the seed's term seed * _GOLDEN by k * _STEP (mod 2**64).
_SHIFT = _STEP * pow(_GOLDEN, -1, _WORD) % _WORD


def prompt_seed(seed: int, index: int) -> int:
    """The sampling seed of the `index`-th prompt of a request or step, from its seed (0 to 2**63 - 1)."""
    mixed = (seed * _GOLDEN + (index + 1) * _STEP) % _WORD
    return (mixed ^ (mixed >> 31)) % 2**63


def offset_seed(seed: int, offset: int) -> int:
    """The seed of a part whose first prompt is prompt `offset` of the whole (0 to 2**64 - 1, the
    range of the wire's `SamplingParams.seed`); `offset_seed(seed, 0) == seed` for a seed in that range."""
    return (seed + offset * _SHIFT) % _WORD
