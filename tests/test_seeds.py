"""How a request's seed becomes each prompt's (rlvr/seeds.py), the one derivation of the transformers
sampler and the vLLM rollout server, and how a part of a request is seeded (`Sampling.from_prompt`)."""

from __future__ import annotations

import pytest

from rlvr.peers.types import Sampling
from rlvr.seeds import offset_seed, prompt_seed


@pytest.mark.parametrize("seed", [0, 1, 21, 2**63 - 1])
def test_every_prompt_of_a_request_gets_its_own_seed(seed: int) -> None:
    seeds = [prompt_seed(seed, i) for i in range(4096)]
    assert len(set(seeds)) == len(seeds)
    assert all(0 <= s < 2**63 for s in seeds)
    assert seeds == [prompt_seed(seed, i) for i in range(4096)]  # the same request, the same seeds


@pytest.mark.parametrize("seed", [0, 7, 2**62 + 3, 2**63 - 1])
def test_a_part_seeded_from_where_it_starts_seeds_its_prompts_as_the_whole_does(seed: int) -> None:
    whole = [prompt_seed(seed, i) for i in range(12)]
    for first in (0, 1, 5, 11):
        moved = offset_seed(seed, first)
        assert 0 <= moved < 2**64  # SamplingParams.seed is a uint64
        assert [prompt_seed(moved, i) for i in range(12 - first)] == whole[first:]
    assert offset_seed(seed, 0) == seed


def test_sampling_from_a_prompt_moves_only_a_seed() -> None:
    seeded = Sampling(temperature=1.0, max_tokens=32, seed=11, group_size=4)
    part = seeded.from_prompt(3)
    assert part == Sampling(temperature=1.0, max_tokens=32, seed=offset_seed(11, 3), group_size=4)
    assert part.to_proto().seed == part.seed
    assert seeded.from_prompt(0) == seeded
    unseeded = Sampling(temperature=1.0, max_tokens=32, group_size=4)
    assert unseeded.from_prompt(3) == unseeded  # unseeded stays unseeded: the server draws
