"""Measured recipes: for a model, the job settings whose learning was measured, with where the
figures are. The spec's defaults are the product page's and stay the defaults; a recipe is what the
New Training page ("Use the measured recipe"), `rlvr train --recipe` and the SDK
(`rlvr.recipes.apply_recipe`, `ListModels`' ModelInfo.recipe) fill in, in one action, so that a
newcomer's first run on the model learns as the measurement did.

A recipe names each value by its JobSpec path (rlvr/jobspec/fields.py's rows), inside the spec's ranges
(tests/test_recipes.py resolves every recipe). `clients/demo.py` and the benches run the same values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from google.protobuf.message import Message

from rlvr.jobspec import FIELDS_BY_PATH, proto_field
from rlvr.v1 import common_pb2

__all__ = ["MEASURED_RECIPES", "MeasuredRecipe", "apply_recipe", "recipe_for", "recipe_spec_of"]


@dataclass(frozen=True)
class MeasuredRecipe:
    model: str
    fields: Mapping[str, object]  # JobSpec path -> value (an enum by its number)
    source: str  # what was measured, by which command, where it is written

    def text(self, path: str) -> str:
        """A value as a form or a flag shows it."""
        value = self.fields[path]
        if isinstance(value, bool):
            return "on" if value else ""
        return f"{value:g}" if isinstance(value, float) else str(value)


# The bundled headroom model (docs/tiny-model.md) on Math Pairs: `make demo`'s job, 60 steps.
TINY_HEADROOM = MeasuredRecipe(
    model="rlvr-tiny-headroom",
    fields={
        "reward.key": "math_pairs", "reward.synthetic_prompts": 4096,
        "grpo.group_size": 8, "grpo.batch_size": 32, "grpo.max_completion_tokens": 64, "grpo.lora_rank": 4,
        "grpo.lora_alpha": 128, "grpo.learning_rate": 1e-5, "grpo.max_steps": 60,
        "advanced.loss_type": common_pb2.LOSS_TYPE_DAPO, "advanced.temperature": 0.3,
        "advanced.dynamic_sampling": True, "advanced.lora_init": "gaussian",
    },
    source="make demo (60 steps on the rollout server): held-out Math Pairs 17.0% -> 61.4% (+44.4 points, SE 2.4), "
           "2-core AMD EPYC, 2026-12-07; 300 steps in bench/learning.py (docs/measurements/demo.md, learning.md)",
)
# SmolLM2-135M-Instruct as `rlvr models import smollm2-135m` writes it, on reasoning-gym's sums of two
# one-digit terms (the task it has headroom on: docs/measurements/reasoning-gym-headroom.md).
SMOLLM2 = MeasuredRecipe(
    model="smollm2-135m",
    fields={
        "reward.key": "reasoning_gym", "reward.dataset": "chain_sum?min_terms=2&max_terms=2&min_digits=1&max_digits=1",
        "reward.synthetic_prompts": 256,
        "grpo.group_size": 8, "grpo.batch_size": 16, "grpo.max_completion_tokens": 64, "grpo.lora_rank": 8,
        "grpo.lora_alpha": 128, "grpo.learning_rate": 1e-5, "grpo.max_steps": 60,
        "advanced.loss_type": common_pb2.LOSS_TYPE_DAPO, "advanced.temperature": 0.7,
    },
    source="bench/learning.py --model smollm2-135m (60 steps on the rollout server, about 26 minutes of training "
           "on 2 CPU cores): held-out reasoning-gym sums 25.2% -> 66.9% and 68.6% on two seeds (+41.7 and +43.4 "
           "points, SE 4.7 and 4.5), 2-core AMD EPYC, 2026-12-08 (docs/measurements/learning.md)",
)
MEASURED_RECIPES: dict[str, MeasuredRecipe] = {r.model: r for r in (TINY_HEADROOM, SMOLLM2)}


def recipe_for(model: str) -> MeasuredRecipe | None:
    """The model's measured recipe, by the name a JobSpec gives it; None when none is measured."""
    return MEASURED_RECIPES.get(model.strip())


def _message(spec: Message, path: str) -> tuple[Message, str]:
    group, _, name = path.rpartition(".")
    message = spec
    for part in group.split(".") if group else ():
        message = getattr(message, part)
    return message, name


def _is_set(message: Message, name: str) -> bool:
    field = message.DESCRIPTOR.fields_by_name[name]
    return message.HasField(name) if field.has_presence else bool(getattr(message, name))


def _own_reward(spec: common_pb2.JobSpec, recipe: MeasuredRecipe) -> bool:
    """Whether `spec` names its reward itself (reward.terms or reward.function, which reward.key must
    then agree with, or a reward.key other than the recipe's): then none of the recipe's reward.* fields
    applies."""
    r = spec.reward
    return bool(r.terms or r.function or (r.key and r.key != recipe.fields.get("reward.key")))


def apply_recipe(spec: common_pb2.JobSpec, recipe: MeasuredRecipe) -> list[str]:
    """Sets the recipe's model and every recipe field that `spec` leaves unset (what a user set stays:
    a field with presence that is set, any other field off its zero value); the paths it set. A spec
    that names another reward (reward.key, function or terms) keeps it, and none of the recipe's
    reward.* fields is set."""
    written = []
    if not spec.base_model.strip():
        spec.base_model = recipe.model
        written.append("base_model")
    own_reward = _own_reward(spec, recipe)
    for path, value in recipe.fields.items():
        if own_reward and path.startswith("reward."):
            continue
        message, name = _message(spec, path)
        if not _is_set(message, name):
            setattr(message, name, value)
            written.append(path)
    return written


def recipe_spec_of(recipe: MeasuredRecipe) -> common_pb2.JobSpec:
    """The recipe as a JobSpec holding only its fields (ModelInfo.recipe)."""
    spec = common_pb2.JobSpec()
    apply_recipe(spec, recipe)
    return spec


# Every recipe path is a row of the spec table with a field of the contract (checked on import, so a
# renamed field fails every process at once rather than a user's click).
for _recipe in MEASURED_RECIPES.values():
    for _path in _recipe.fields:
        proto_field(FIELDS_BY_PATH[_path])
