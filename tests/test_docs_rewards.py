"""docs/rewards.md's code runs as written: every Python block executes (the reward it declares scores
as the page says), and the remote-reward settings block is settings the reward service accepts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parent.parent / "docs" / "rewards.md"
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", PAGE.read_text(), re.DOTALL)


@pytest.mark.parametrize("source", [code for lang, code in BLOCKS if lang == "python"])
def test_each_python_block_runs(source: str) -> None:
    namespace: dict[str, object] = {}
    exec(compile(source, str(PAGE), "exec"), namespace)  # noqa: S102 (the page's own code)
    from rlvr.rewards import RewardDefinition

    assert any(isinstance(v, RewardDefinition) for v in namespace.values())


def test_the_example_reward_scores_what_the_page_says() -> None:
    namespace: dict[str, object] = {}
    exec(compile(next(c for lang, c in BLOCKS if lang == "python"), str(PAGE), "exec"), namespace)  # noqa: S102
    from rlvr.rewards import Sample
    from rlvr.rewards.combine import score_samples

    reward = namespace["exact_label"]
    right, wrong = score_samples([(reward, 1.0)], [Sample("<answer>Even</answer>", "even", columns={"choices": ["even"]}),
                                                   Sample("<answer>maybe</answer>", "even",
                                                          columns={"choices": ["even"]})])
    assert (right.accuracy, right.components["exact_label.valid_choice"]) == (1.0, 1.0)
    assert (wrong.accuracy, wrong.components["exact_label.valid_choice"]) == (0.0, 0.0)


def test_the_remote_rewards_block_is_a_valid_setting() -> None:
    from rlvr.services.reward.settings import RewardSettings

    block = next(c for lang, c in BLOCKS if lang == "json")
    settings = RewardSettings(remote_rewards=json.loads(block))
    remote = settings.remote_rewards["my_checker"]
    assert (remote.address, remote.columns, remote.wait_seconds) == ("checker.internal:7000", ["tests"], 60)
