"""The base models a job can name, as ListModels answers it: the bundled tiny models and the model
folders under the scheduler's model roots, read from their files (rlvr/model_import.py, what
`rlvr models list` prints). The roots' paths stay on the server."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from rlvr.model_import import RECIPES, ModelSummary, list_models
from rlvr.models import TINY_MODELS
from rlvr.recipes import recipe_for, recipe_spec_of
from rlvr.v1 import scheduler_pb2


def model_info_proto(summary: ModelSummary, source: str) -> scheduler_pb2.ModelInfo:
    return with_recipe(scheduler_pb2.ModelInfo(
        name=summary.name, source=source, architecture=summary.architecture, parameters=summary.parameters,
        vocab_size=summary.vocab_size, context_length=summary.context_length, dtype=summary.dtype,
        chat_template=summary.chat_template))


def with_recipe(info: scheduler_pb2.ModelInfo) -> scheduler_pb2.ModelInfo:
    """The model's measured recipe (rlvr/recipes.py) on its ModelInfo, where it has one."""
    recipe = recipe_for(info.name)
    if recipe is not None:
        info.recipe.CopyFrom(recipe_spec_of(recipe))
        info.recipe_source = recipe.source
    return info


def models_proto(roots: Sequence[Path]) -> scheduler_pb2.ListModelsResponse:
    """The bundled models first (with their figures once built under the roots), then the imported ones."""
    found = {summary.name: summary for summary in list_models(roots)}
    bundled = [model_info_proto(found[name], "bundled") if name in found else
               with_recipe(scheduler_pb2.ModelInfo(name=name, source="bundled")) for name in TINY_MODELS]
    imported = [model_info_proto(s, f"imported: {s.source}" if s.source in RECIPES else "imported")
                for name, s in sorted(found.items()) if name not in TINY_MODELS]
    return scheduler_pb2.ListModelsResponse(models=bundled + imported)


async def list_models_rpc(roots: Sequence[Path]) -> scheduler_pb2.ListModelsResponse:
    """ListModels' answer (it reads config and safetensors headers: in a thread)."""
    return await asyncio.to_thread(models_proto, roots)
