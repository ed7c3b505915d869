"""The rollout server's core: one generation backend plus the adapter registry, behind five calls.

This is what the gRPC servicer (`server.py`) drives; it knows nothing about gRPC. Every generation request
resolves its adapter exactly once through a registry lease, generates with that version and stamps every
completion with it, so "which policy produced this rollout" is always answered by the data itself.

Errors the servicer maps to status codes:
- ValueError (bad prompt, sampling, or `AdapterRejected`) -> INVALID_ARGUMENT
- `StaleVersionError` (a push not newer than the live version), `BaseModelMismatch` -> FAILED_PRECONDITION
- `UnknownAdapterError`, `AdapterVersionMismatch` (a pinned version that is not the live one) -> NOT_FOUND
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rlvr.adapters import base_linear_shapes
from rlvr.common.errors import FailedPrecondition, shown
from rlvr.models import bare_to_folder
from rlvr.services.rollout.adapter_registry import DEFAULT_MAX_ADAPTER_BYTES, AdapterRegistry
from rlvr.services.rollout.backend import (
    AdapterVersion,
    BackendInfo,
    GenerationBackend,
    PromptGroupOut,
    PromptInput,
    SamplingSpec,
)

logger = logging.getLogger(__name__)


class BaseModelMismatch(FailedPrecondition):
    """A request named a base model other than the one loaded: switching base models is a restart."""


@dataclass(frozen=True)
class CoreConfig:
    model: str
    """Hub id or local path of the base model (resolved before this point: no download happens here)."""
    adapter_root: Path
    backend: Literal["vllm", "transformers"] = "vllm"
    max_lora_rank: int = 64
    max_loras: int = 4
    max_model_len: int = 2560
    memory_fraction: float = 0.3
    """vLLM's gpu_memory_utilization (the host-memory share on a CPU host)."""
    max_adapter_bytes: int = DEFAULT_MAX_ADAPTER_BYTES
    dtype: str = "float32"
    """float32 matches an fp32 trainer token for token; bfloat16 is the usual choice on GPU hosts."""
    seed: int = 0
    enforce_eager: bool = False
    """vLLM only: skip torch.compile/graph capture (faster start, first request ~4x sooner on CPU)."""
    trust_remote_code: bool = False
    tensor_parallel_size: int = 1
    """vLLM only: devices one engine shards the model over."""
    data_parallel_size: int = 1
    """vLLM only: engine copies in this server."""


def make_backend(config: CoreConfig) -> GenerationBackend:
    """The configured backend, not yet started (imports vLLM or transformers only here)."""
    if config.backend == "vllm":
        from rlvr.services.rollout.vllm_backend import VLLMBackend

        return VLLMBackend(
            config.model,
            max_lora_rank=config.max_lora_rank,
            max_loras=config.max_loras,
            max_model_len=config.max_model_len,
            gpu_memory_utilization=config.memory_fraction,
            dtype=config.dtype,
            seed=config.seed,
            enforce_eager=config.enforce_eager,
            trust_remote_code=config.trust_remote_code,
            tensor_parallel_size=config.tensor_parallel_size,
            data_parallel_size=config.data_parallel_size,
        )
    if config.backend == "transformers":
        from rlvr.services.rollout.hf_backend import TransformersBackend

        return TransformersBackend(
            config.model,
            max_lora_rank=config.max_lora_rank,
            max_loras=config.max_loras,
            max_model_len=config.max_model_len,
            dtype=config.dtype,
            trust_remote_code=config.trust_remote_code,
        )
    raise ValueError(f"backend must be 'vllm' or 'transformers', got {config.backend!r}")


class RolloutCore:
    """A started backend and its adapter registry. Build with `await RolloutCore.start(config)`."""

    def __init__(self, config: CoreConfig, backend: GenerationBackend, registry: AdapterRegistry) -> None:
        self.config = config
        self.backend = backend
        self.registry = registry
        self._request_ids = itertools.count()

    @classmethod
    async def start(cls, config: CoreConfig, backend: GenerationBackend | None = None) -> RolloutCore:
        """Start the backend (vLLM: ~20-30 s) and the registry, with the adapters a previous server
        process left live made live again. `backend` overrides `make_backend`."""
        backend = backend or make_backend(config)
        await backend.start()
        shapes = base_linear_shapes(config.model, config.trust_remote_code)
        registry = AdapterRegistry(
            config.adapter_root,
            backend,
            shapes,
            max_lora_rank=config.max_lora_rank,
            max_adapter_bytes=config.max_adapter_bytes,
        )
        await registry.restore()
        return cls(config, backend, registry)

    async def shutdown(self) -> None:
        await self.backend.shutdown()
        await self.registry.close()

    # ------------------------------------------------------------------------------------- generation
    async def generate(
        self,
        prompts: Sequence[PromptInput],
        sampling: SamplingSpec,
        adapter_name: str | None = None,
        adapter_version: int | None = None,
        request_id: str | None = None,
    ) -> AsyncGenerator[PromptGroupOut, None]:
        """Stream one `PromptGroupOut` per prompt (n completions each) as each group finishes.

        `adapter_name` None/"" is the base model; `adapter_version` None/0 takes the live version, any other
        value must be the live one (AdapterVersionMismatch otherwise). Close the iterator (or let the
        `async for` end) to release the adapter; breaking out early cancels the remaining prompts.
        """
        request_id = request_id or f"rollout-{next(self._request_ids)}"
        async with self.registry.lease(adapter_name, adapter_version) as adapter:
            groups = self.backend.generate(prompts, sampling, adapter, request_id)
            async with aclosing(groups):
                async for group in groups:
                    yield group

    def render_chat(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """Prompt token ids for chat messages (the model's template, with the generation prompt)."""
        return self.backend.render_chat(messages)

    def check_base_model(self, model: str | None, served_as: str = "") -> None:
        """Raise BaseModelMismatch when a request names a base model other than the loaded one.

        The message names the model as clients know it (`served_as`: the model setting, what
        GetInfo answers), never the folder it was loaded from; that goes to the log."""
        if not model or _same_model(model, self.config.model):
            return
        logger.info("request for base model %s refused: this server loaded %s", shown(model), self.config.model)
        name = served_as or Path(self.config.model).name or "its model"
        raise BaseModelMismatch(
            f"model: this rollout server serves base model {name!r}, not {shown(model)}; "
            "switching base models needs a restart with another model setting"
        )

    # --------------------------------------------------------------------------------------- adapters
    async def load_adapter(
        self, name: str, version: int, files: Mapping[str, bytes] | Path
    ) -> AdapterVersion:
        """Validate, store and hot-load one adapter version; it is live (and stamped) once this returns."""
        return await self.registry.load(name, version, files)

    async def unload_adapter(self, name: str) -> AdapterVersion:
        return await self.registry.unload(name)

    def list_adapters(self) -> list[AdapterVersion]:
        return self.registry.list()

    def live_version(self, name: str) -> int | None:
        return self.registry.live_version(name)

    def info(self) -> BackendInfo:
        return self.backend.info()


def _same_model(a: str, b: str) -> bool:
    if a == b:
        return True
    # A bare name (`smollm2-135m`) is the folder of that name under the model roots (rlvr.models).
    a, b = bare_to_folder(a), bare_to_folder(b)
    # The same local directory under two spellings (relative path, symlink) is the same model.
    try:
        return os.path.isdir(a) and os.path.isdir(b) and Path(a).resolve() == Path(b).resolve()
    except (OSError, ValueError):  # a name too long for a path, or with a NUL: not a folder
        return False
