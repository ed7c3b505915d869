"""The small interface every rollout generation backend implements, and the typed messages it speaks.

The rollout server's gRPC servicer and the adapter registry only ever see `GenerationBackend`; the vLLM
engine (`vllm_backend.py`) and the in-process transformers + peft fallback (`hf_backend.py`) sit behind it,
so the servicer never knows which one runs. Nothing here imports torch, vLLM or gRPC: the messages are
plain dataclasses, and the heavy imports stay inside the backends.

Semantics both backends keep identical (the trainer relies on them, whichever backend runs):
- prompts are token ids; text is tokenized with the base model's tokenizer without extra special tokens,
  chat messages are rendered by the caller through `render_chat` (template + generation prompt);
- a completion's `token_ids` include the stop token when it stopped on one (the policy must learn to stop),
  its `text` is decoded with special tokens skipped;
- the sampling controls shape the distribution in vLLM's order (rlvr/sampling.py): repetition penalty on the
  raw logits, then temperature, min_p, top_k, top_p;
- `logprobs[i]` is the log-probability of `token_ids[i]` under the distribution it was actually sampled from
  (after all of them); for greedy requests (temperature 0) it is the log-softmax of the (penalized) logits,
  as vLLM's `processed_logprobs` mode reports it;
- every completion carries the adapter name and version that produced it, taken from the one
  `AdapterVersion` the request was resolved to (never looked up again mid-request).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from rlvr.jobspec import GREEDY_EPS

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

FinishReason = Literal["stop", "length"]



@dataclass(frozen=True)
class SamplingSpec:
    """How to sample one request; the servicer validates the public ranges (max_tokens 32-2048, ...)."""

    n: int
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        # Only the invariants a backend cannot work without; the product ranges live in the servicer.
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS


@dataclass(frozen=True)
class PromptInput:
    """One prompt: token ids, or text the backend tokenizes (exactly one of the two)."""

    token_ids: list[int] | None = None
    text: str | None = None

    def __post_init__(self) -> None:
        if (self.token_ids is None) == (self.text is None):
            raise ValueError("a prompt needs exactly one of token_ids or text")


@dataclass(frozen=True)
class AdapterVersion:
    """One stored, validated version of a named LoRA adapter.

    `uid` is unique within the server process and never reused: vLLM caches a LoRA by its integer id, so a
    new version under an old id would silently keep serving the old weights.
    """

    name: str
    version: int
    path: Path
    uid: int
    rank: int

    @property
    def key(self) -> str:
        """A readable, unique label for logs and engine-side names (name and version may recur after unload)."""
        return f"{self.name}@v{self.version}#{self.uid}"


@dataclass(frozen=True)
class CompletionOut:
    """One generated completion; `adapter_name`/`adapter_version` are None when the base model produced it."""

    prompt_index: int
    sample_index: int
    token_ids: list[int]
    text: str
    logprobs: list[float]
    finish_reason: FinishReason
    adapter_name: str | None
    adapter_version: int | None


@dataclass(frozen=True)
class PromptGroupOut:
    """All `n` completions of one prompt, streamed as soon as the whole group is done."""

    prompt_index: int
    prompt_token_ids: list[int]
    completions: list[CompletionOut]
    decode_seconds: float = 0.0
    """Time spent turning the group's token ids into text (the server's "decode" in its timing line)."""


@dataclass(frozen=True)
class BackendInfo:
    backend: str
    model: str
    max_lora_rank: int
    max_loras: int
    max_model_len: int
    extra: Mapping[str, str] = field(default_factory=dict)


class GenerationBackend(abc.ABC):
    """A generation engine with hot-loadable LoRA adapters.

    Adapter bookkeeping (which version is live, when an old one may go) belongs to the `AdapterRegistry`;
    a backend only loads what it is told to and generates with the version it is handed.
    """

    name: str
    adapter_capacity: int | None = None
    """Adapter versions the engine holds at once without evicting one to load another (None: no
    limit). The registry never loads past it: an evicted version that a running request still uses
    would be read back from disk mid-step."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Load the base model; generation and adapter calls are valid only after this returns."""

    @abc.abstractmethod
    def generate(
        self,
        prompts: Sequence[PromptInput],
        sampling: SamplingSpec,
        adapter: AdapterVersion | None,
        request_id: str,
    ) -> AsyncGenerator[PromptGroupOut, None]:
        """Yield one `PromptGroupOut` per prompt, in completion order (not necessarily prompt order).

        Raises ValueError for a prompt the model cannot take (too long for `max_model_len`, unknown token
        ids). Closing the iterator early cancels the rest of the request.
        """

    @abc.abstractmethod
    async def add_adapter(self, adapter: AdapterVersion) -> None:
        """Load one adapter version; raise if the engine cannot use it (the registry then rejects it)."""

    @abc.abstractmethod
    async def remove_adapter(self, adapter: AdapterVersion) -> None:
        """Drop one adapter version; the registry calls this only once no request uses it."""

    @abc.abstractmethod
    def info(self) -> BackendInfo: ...

    @abc.abstractmethod
    def render_chat(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """Token ids of `messages` rendered by the model's chat template, ending with the generation prompt."""

    @abc.abstractmethod
    async def shutdown(self) -> None: ...


class PromptCodec:
    """The tokenizer-side rules both backends share, so their prompts and stop tokens are identical.

    `tokenizer` is a transformers tokenizer (typed loosely so this module stays free of heavy imports).
    """

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, stop_token_ids: frozenset[int], max_model_len: int
    ) -> None:
        self.tokenizer = tokenizer
        self.stop_token_ids = stop_token_ids
        self.max_model_len = max_model_len
        self.vocab_size = len(tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_token_id: int = pad if pad is not None else min(stop_token_ids, default=0)

    @classmethod
    def load(cls, model: str, max_model_len: int, trust_remote_code: bool = False) -> PromptCodec:
        from transformers import AutoTokenizer, GenerationConfig

        tokenizer = AutoTokenizer.from_pretrained(model, trust_remote_code=trust_remote_code)
        # vLLM stops on the tokenizer's EOS plus every eos_token_id of generation_config.json; so do we.
        stops = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        try:
            eos = GenerationConfig.from_pretrained(model).eos_token_id
        except OSError:  # no generation_config.json
            eos = None
        stops.update([eos] if isinstance(eos, int) else (eos or []))
        return cls(tokenizer, frozenset(stops), max_model_len)

    def render_chat(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        if not messages:
            raise ValueError("messages must not be empty")
        text = self.tokenizer.apply_chat_template(
            [dict(m) for m in messages], tokenize=False, add_generation_prompt=True
        )
        # The template already wrote every special token; adding BOS/EOS again would change the prompt.
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def encode_prompts(self, prompts: Sequence[PromptInput], max_tokens: int) -> list[list[int]]:
        """Token ids per prompt, checked against the vocabulary and `max_model_len` (ValueError names which)."""
        if not prompts:
            raise ValueError("a generation request needs at least one prompt")
        encoded: list[list[int]] = []
        for i, prompt in enumerate(prompts):
            if prompt.token_ids is not None:
                ids = list(prompt.token_ids)
            else:
                ids = list(self.tokenizer.encode(prompt.text, add_special_tokens=False))
            if not ids:
                raise ValueError(f"prompts[{i}] is empty")
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(
                    f"prompts[{i}].token_ids: {bad[:5]} outside the vocabulary [0, {self.vocab_size})"
                )
            if len(ids) + max_tokens > self.max_model_len:
                raise ValueError(
                    f"prompts[{i}]: {len(ids)} tokens; with max_tokens={max_tokens} that exceeds "
                    f"max_model_len={self.max_model_len}"
                )
            encoded.append(ids)
        return encoded
