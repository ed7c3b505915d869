"""Rewards: the registry every reward is declared in (built-in or plugin), the answer checkers of
the built-ins, and how a job's rewards combine into one score.

A plugin writes::

    from rlvr.rewards import Sample, reward

    @reward("exact_label", display_name="Exact label")
    def exact_label(sample: Sample) -> float:
        return float(sample.completion.strip() == sample.ground_truth)

and declares it as an entry point of the group ``rlvr.rewards`` (docs/rewards.md).
"""

from rlvr.rewards.registry import (
    ENTRY_POINT_GROUP,
    Catalog,
    RewardDefinition,
    RewardInfo,
    RewardOutput,
    Sample,
    get_reward,
    load_registry,
    reward,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "Catalog",
    "RewardDefinition",
    "RewardInfo",
    "RewardOutput",
    "Sample",
    "get_reward",
    "load_registry",
    "reward",
]
