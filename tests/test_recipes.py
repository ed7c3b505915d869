"""Measured recipes (rlvr/recipes.py): each is a valid job on its model, inside the spec's ranges, and
filling one in keeps what the user set."""

from __future__ import annotations

import pytest

from rlvr.jobspec import FIELDS_BY_PATH, resolve_spec, value_of
from rlvr.recipes import MEASURED_RECIPES, apply_recipe, recipe_for, recipe_spec_of
from rlvr.v1 import common_pb2 as C


@pytest.mark.parametrize("model", sorted(MEASURED_RECIPES))
def test_every_recipe_resolves_to_its_own_values(model: str) -> None:
    recipe = MEASURED_RECIPES[model]
    resolved = resolve_spec(recipe_spec_of(recipe))  # raises InvalidArgument naming any value out of range
    assert resolved.spec.base_model == model
    for path, value in recipe.fields.items():
        assert value_of(resolved.spec, FIELDS_BY_PATH[path]) == pytest.approx(value), path
    assert not [w for w in resolved.warnings if w.split(" ", 1)[0] in recipe.fields]  # nothing it sets is rounded


def test_a_recipe_fills_only_what_is_unset() -> None:
    recipe = recipe_for(" rlvr-tiny-headroom ")
    assert recipe is not None and recipe_for("rlvr-tiny") is None
    spec = C.JobSpec(base_model="rlvr-tiny-headroom")
    spec.grpo.learning_rate = 5e-6
    spec.advanced.loss_type = C.LOSS_TYPE_GRPO
    written = apply_recipe(spec, recipe)
    assert "grpo.learning_rate" not in written and "advanced.loss_type" not in written and "base_model" not in written
    assert spec.grpo.learning_rate == 5e-6 and spec.advanced.loss_type == C.LOSS_TYPE_GRPO
    assert spec.grpo.batch_size == recipe.fields["grpo.batch_size"] and spec.advanced.dynamic_sampling
    assert set(written) == set(recipe.fields) - {"grpo.learning_rate", "advanced.loss_type"}
    assert apply_recipe(spec, recipe) == []  # a second time: everything is set


def test_make_demo_trains_exactly_the_measured_recipe() -> None:
    """The recipe's figures are `make demo`'s: the demo's job is the recipe, field for field."""
    import argparse

    from rlvr.clients import demo

    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    spec = demo.demo_spec(parser.parse_args([]))
    recipe = recipe_for(spec.base_model)
    assert recipe is not None and recipe.model == demo.DEFAULT_MODEL
    for path, value in recipe.fields.items():
        assert value_of(spec, FIELDS_BY_PATH[path]) == pytest.approx(value), path


def test_a_recipe_leaves_a_spec_of_another_reward_its_reward() -> None:
    recipe = recipe_for("rlvr-tiny-headroom")
    assert recipe is not None
    spec = C.JobSpec(base_model="rlvr-tiny-headroom")
    spec.reward.terms.add(key="gsm8k", weight=1.0)  # `rlvr train --recipe --reward gsm8k:1`
    written = apply_recipe(spec, recipe)
    assert not [p for p in written if p.startswith("reward.")] and not spec.reward.key
    assert "grpo.batch_size" in written
    resolve_spec(spec)  # a valid job: the recipe set nothing that clashes with the terms
    by_function = C.JobSpec(reward=C.RewardConfig(function=C.REWARD_FUNCTION_GSM8K))
    apply_recipe(by_function, recipe)
    assert not by_function.reward.key and not by_function.reward.HasField("synthetic_prompts")
