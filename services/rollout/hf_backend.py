"""The in-process transformers + peft generation backend (the spec's "Transformers (in-process)" option).

For hosts where vLLM does not fit. The base model is loaded once; every adapter version becomes one named
peft adapter on it (`set_adapter` picks it per request, `disable_adapter` gives the base model), so the
weights that generate are exactly the ones `peft.PeftModel` would load from the same files.

Sampling is a hand-written decode loop rather than `model.generate`, because the trainer needs what
`generate` does not give cleanly: the log-probability of each sampled token under the distribution it was
actually drawn from (shaped as vLLM shapes it, rlvr/sampling.py; vLLM's `processed_logprobs`), and reproducibility
from a per-request seed (a private `torch.Generator`, never the global RNG that other code may touch).
One request runs at a time, in one worker thread, so the asyncio event loop stays free for gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import threading
import time
import warnings
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from rlvr.sampling import seen_tokens, shape_logits
from rlvr.services.rollout.backend import (
    AdapterVersion,
    BackendInfo,
    CompletionOut,
    FinishReason,
    GenerationBackend,
    PromptCodec,
    PromptGroupOut,
    PromptInput,
    SamplingSpec,
)

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

logger = logging.getLogger(__name__)


class TransformersBackend(GenerationBackend):
    name = "transformers"

    def __init__(
        self,
        model: str,
        *,
        max_lora_rank: int = 64,
        max_loras: int = 8,
        max_model_len: int = 4096,
        dtype: str = "float32",
        trust_remote_code: bool = False,
    ) -> None:
        self.model_path = model
        self.max_lora_rank = max_lora_rank
        # Informational here: peft keeps every loaded version in memory; the registry bounds how many.
        self.max_loras = max_loras
        self.max_model_len = max_model_len
        self.dtype = dtype
        self.trust_remote_code = trust_remote_code
        self._model: PreTrainedModel | None = None
        self._codec: PromptCodec | None = None
        self._adapters: set[str] = set()  # peft adapter names (see _peft_name) on the model
        # One thread owns the model: generations and adapter changes run one at a time, in arrival order.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-generate")

    # ---------------------------------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self._load)

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self._codec = PromptCodec.load(self.model_path, self.max_model_len, self.trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            self.model_path,
            dtype=getattr(torch, self.dtype),
            use_safetensors=True,  # never unpickle a checkpoint
            trust_remote_code=self.trust_remote_code,
        )
        self._model = model.eval()
        logger.info("transformers backend loaded %s (%s)", self.model_path, self.dtype)

    async def shutdown(self) -> None:
        await asyncio.to_thread(self._executor.shutdown, wait=True)
        self._model = None

    def info(self) -> BackendInfo:
        return BackendInfo(
            backend=self.name,
            model=self.model_path,
            max_lora_rank=self.max_lora_rank,
            max_loras=self.max_loras,
            max_model_len=self.max_model_len,
            extra={"dtype": self.dtype},
        )

    @property
    def codec(self) -> PromptCodec:
        if self._codec is None:
            raise RuntimeError("the transformers backend is not started")
        return self._codec

    def render_chat(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        return self.codec.render_chat(messages)

    # ----------------------------------------------------------------------------------------- adapters
    async def add_adapter(self, adapter: AdapterVersion) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self._add_adapter, adapter)

    def _add_adapter(self, adapter: AdapterVersion) -> None:
        from peft import PeftModel

        if self._model is None:
            raise RuntimeError("the transformers backend is not started")
        if not isinstance(self._model, PeftModel):
            # Wraps the base model in place: LoRA layers are injected into its modules.
            self._model = PeftModel.from_pretrained(
                self._model, str(adapter.path), adapter_name=_peft_name(adapter), is_trainable=False
            ).eval()
        else:
            self._model.load_adapter(str(adapter.path), adapter_name=_peft_name(adapter), is_trainable=False)
        self._adapters.add(_peft_name(adapter))

    async def remove_adapter(self, adapter: AdapterVersion) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self._remove_adapter, adapter)

    def _remove_adapter(self, adapter: AdapterVersion) -> None:
        if _peft_name(adapter) in self._adapters and self._model is not None:
            with warnings.catch_warnings():
                # "adapter X was active ... setting active adapter to Y": harmless, every request sets its own
                warnings.simplefilter("ignore", UserWarning)
                self._model.delete_adapter(_peft_name(adapter))
            self._adapters.discard(_peft_name(adapter))
            if not self._adapters:
                # A PeftModel whose last adapter is deleted still names it as active, and even
                # disable_adapter() then fails (KeyError): unwrap back to the plain base model.
                self._model = self._model.unload()

    @contextlib.contextmanager
    def _policy(self, adapter: AdapterVersion | None) -> Iterator[PreTrainedModel]:
        """The model with exactly `adapter` active (or none)."""
        model = self._model
        if model is None:
            raise RuntimeError("the transformers backend is not started")
        if adapter is not None:
            if _peft_name(adapter) not in self._adapters:
                raise RuntimeError(f"adapter {adapter.key} is not loaded in the transformers backend")
            model.set_adapter(_peft_name(adapter))
            yield model
        elif self._adapters:
            with model.disable_adapter():
                yield model
        else:
            yield model

    # --------------------------------------------------------------------------------------- generation
    async def generate(
        self,
        prompts: Sequence[PromptInput],
        sampling: SamplingSpec,
        adapter: AdapterVersion | None,
        request_id: str,
    ) -> AsyncGenerator[PromptGroupOut, None]:
        prompt_ids = self.codec.encode_prompts(prompts, sampling.max_tokens)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[PromptGroupOut | BaseException] = asyncio.Queue()
        cancelled = threading.Event()

        def emit(item: PromptGroupOut | BaseException) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        # The single model thread serializes requests (and adapter changes) in arrival order. It is freed as
        # soon as the decode loop ends, not when the caller has read every group: a slow reader must not
        # hold up the next request or an adapter push.
        loop.run_in_executor(
            self._executor, self._generate_sync, prompt_ids, sampling, adapter, emit, cancelled
        )
        try:
            for _ in prompt_ids:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            cancelled.set()  # the caller went away (or is done): stop decoding for nobody
        logger.debug("request %s done (%d prompts)", request_id, len(prompt_ids))

    def _generate_sync(
        self,
        prompt_ids: list[list[int]],
        sampling: SamplingSpec,
        adapter: AdapterVersion | None,
        emit: Callable[[PromptGroupOut | BaseException], None],
        cancelled: threading.Event,
    ) -> None:
        import torch

        if cancelled.is_set():  # the caller left while this request waited for the model thread
            return
        try:
            with torch.inference_mode(), self._policy(adapter) as model:
                self._decode(model, prompt_ids, sampling, adapter, emit, cancelled)
        except BaseException as e:  # surfaces in the awaiting coroutine instead of dying in the thread
            emit(e)

    def _decode(
        self,
        model: PreTrainedModel,
        prompt_ids: list[list[int]],
        sampling: SamplingSpec,
        adapter: AdapterVersion | None,
        emit: Callable[[PromptGroupOut | BaseException], None],
        cancelled: threading.Event,
    ) -> None:
        """Batched decode of all prompts x n samples, left-padded, dropping rows as they finish."""
        import torch

        codec = self.codec
        n = sampling.n
        width = max(len(ids) for ids in prompt_ids)
        input_ids = torch.full((len(prompt_ids), width), codec.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(prompt_ids), width), dtype=torch.long)
        for p, ids in enumerate(prompt_ids):
            input_ids[p, width - len(ids) :] = torch.tensor(ids)
            attention[p, width - len(ids) :] = 1
        # Explicit positions: with left padding, each row's first real token must sit at position 0.
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        seed = sampling.seed if sampling.seed is not None else secrets.randbits(63)
        generator = torch.Generator().manual_seed(seed)
        stop_ids = torch.tensor(sorted(codec.stop_token_ids), dtype=torch.long)

        num_rows = len(prompt_ids) * n  # row r is prompt r // n, sample r % n
        tokens: list[list[int]] = [[] for _ in range(num_rows)]
        logprobs: list[list[float]] = [[] for _ in range(num_rows)]
        finish: list[FinishReason | None] = [None] * num_rows
        active = torch.arange(num_rows)  # original row index of each batch row
        groups_left = set(range(len(prompt_ids)))

        # Prefill each prompt once, then give each of its n samples a copy of the KV cache; only the last
        # position's logits are needed (a real vocabulary makes the full logits tensor the largest one).
        out = model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
        )
        cache = out.past_key_values
        cache.batch_repeat_interleave(n)
        logits = out.logits[:, -1, :].repeat_interleave(n, dim=0)
        # The repetition penalty reads every token of a row's prompt and completion so far (vLLM's).
        seen = None
        if sampling.repetition_penalty != 1.0:
            seen = seen_tokens(input_ids, attention.bool(), logits.shape[-1]).repeat_interleave(n, dim=0)
        attention = attention.repeat_interleave(n, dim=0)
        next_position = positions[:, -1].repeat_interleave(n) + 1
        for step in range(sampling.max_tokens):
            if cancelled.is_set():
                return
            next_ids, next_logprobs = sample_next(logits.float(), sampling, generator, seen)
            if seen is not None:
                seen[torch.arange(len(next_ids)), next_ids] = True
            stopped = torch.isin(next_ids, stop_ids)
            for b, r in enumerate(active.tolist()):
                tokens[r].append(int(next_ids[b]))
                logprobs[r].append(float(next_logprobs[b]))
                if bool(stopped[b]):
                    finish[r] = "stop"
                elif step + 1 == sampling.max_tokens:
                    finish[r] = "length"
            for g in sorted(groups_left):
                if all(finish[r] is not None for r in range(g * n, g * n + n)):
                    groups_left.discard(g)
                    emit(self._group(g, prompt_ids[g], tokens, logprobs, finish, n, adapter))
            keep = ~stopped
            if not groups_left or not bool(keep.any()):
                break
            if not bool(keep.all()):
                # Finished rows leave the batch (and the KV cache): the rest decode at a smaller size.
                index = keep.nonzero().squeeze(1)
                cache.batch_select_indices(index)
                active, attention = active[index], attention[index]
                seen = None if seen is None else seen[index]
                next_ids, next_position = next_ids[index], next_position[index]
            attention = torch.cat([attention, attention.new_ones((attention.shape[0], 1))], dim=1)
            out = model(
                input_ids=next_ids[:, None],
                attention_mask=attention,
                position_ids=next_position[:, None],
                past_key_values=cache,
                use_cache=True,
            )
            logits = out.logits[:, -1, :]
            next_position = next_position + 1

    def _group(
        self,
        g: int,
        prompt: list[int],
        tokens: list[list[int]],
        logprobs: list[list[float]],
        finish: list[FinishReason | None],
        n: int,
        adapter: AdapterVersion | None,
    ) -> PromptGroupOut:
        started = time.perf_counter()
        texts = [self.codec.decode(tokens[g * n + s]) for s in range(n)]
        decode_seconds = time.perf_counter() - started
        completions = [
            CompletionOut(
                prompt_index=g,
                sample_index=s,
                token_ids=tokens[g * n + s],
                text=texts[s],
                logprobs=logprobs[g * n + s],
                finish_reason=finish[g * n + s] or "length",
                adapter_name=adapter.name if adapter else None,
                adapter_version=adapter.version if adapter else None,
            )
            for s in range(n)
        ]
        return PromptGroupOut(prompt_index=g, prompt_token_ids=prompt, completions=completions,
                              decode_seconds=decode_seconds)


def _peft_name(adapter: AdapterVersion) -> str:
    # peft keys adapters in torch ModuleDicts, which refuse "." (valid in adapter names); the uid is unique.
    return f"adapter_{adapter.uid}"


def sample_next(
    logits: torch.Tensor, sampling: SamplingSpec, generator: torch.Generator, seen: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next token per row and its log-probability under the distribution it was drawn from.

    Mirrors vLLM's sampler (rlvr/sampling.py): greedy rows take the argmax of the (penalized) logits and
    report their log-softmax; sampled rows draw from the shaped distribution and report its log-softmax.
    `seen`: (rows, vocab) bool, the tokens of each row so far, for the repetition penalty.
    """
    import torch

    shaped = shape_logits(logits, sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p,
                          sampling.repetition_penalty, seen, greedy=sampling.greedy)
    processed = shaped.log_softmax(dim=-1)
    if sampling.greedy:
        chosen = shaped.argmax(dim=-1)
    else:
        chosen = torch.multinomial(processed.exp(), 1, generator=generator).squeeze(1)
    return chosen, processed.gather(-1, chosen[:, None]).squeeze(1)
