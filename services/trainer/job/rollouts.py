"""Where a step's completions come from: the `PolicyGenerator` interface and its backends.

- `ServiceGenerator` (generation backend "vllm"): the rollout service generates from the adapter
  version this trainer pushed after its last optimizer step. Every completion comes back stamped
  with the adapter that produced it, and `check_versions` fails the job on the first one that is
  not the expected version: a silent sync failure (training on rollouts of a stale policy) is the
  most reported bug in peer systems, so here it is a loud error instead.
- `LocalGenerator` (backend "transformers"): samples in-process from the very model being trained,
  so its "version" is by construction the current step.
- `ColocatedGenerator` (backend "vllm_colocate", in `colocate.py`): a vLLM engine inside the job's
  process, loading every adapter version as a LoRA and checking each completion's as above.

All return the same `RolloutBatch`: one row per completion, prompts repeated `group_size` times in
a row (the layout GRPO's group-relative advantage and TRL's RepeatSampler use). `AdapterTag` and
`Sampling` are the peer types every caller of the rollout service shares (`rlvr.peers.types`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from rlvr.common.auth import ChannelAuth
from rlvr.peers.base import RlvrError
from rlvr.peers.clients import RolloutClient
from rlvr.peers.types import AdapterTag, Sampling, generate_request, token_prompt
from rlvr.sampling import seen_tokens, shape_logits
from rlvr.seeds import prompt_seed
from rlvr.v1 import common_pb2, rollout_pb2

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger("rlvr.trainer.rollouts")
_T = TypeVar("_T")

__all__ = [
    "AdapterVersionMismatch",
    "CallTiming",
    "LocalGenerator",
    "PolicyGenerator",
    "RolloutBatch",
    "RolloutError",
    "RolloutGone",
    "ServiceGenerator",
    "check_versions",
]


@dataclass
class RolloutBatch:
    """One step's completions; row i belongs to prompt i // group_size."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]  # the stop token included when the model stopped
    logprobs: list[list[float]] | None  # sampling logprobs, when the backend reports them
    clipped: list[bool]  # cut at max_tokens rather than stopped
    adapter: AdapterTag  # the policy that generated every row (checked)
    seconds: float


@dataclass
class CallTiming:
    """When the last Generate call of a `ServiceGenerator` was sent, answered and reassembled, in
    `time.monotonic()` (one clock for the host's processes: the server logs its own side of the call
    under the same request id, see `rlvr.services.rollout.server.GenerateTiming`)."""

    request_id: str
    sent: float
    first_response: float = 0.0
    last_response: float = 0.0
    done: float = 0.0  # the RolloutBatch built and checked


class AdapterVersionMismatch(RuntimeError):
    """A completion came from another adapter version than the one the trainer pushed."""


class RolloutError(RuntimeError):
    """The rollout service failed a call; the message is one line naming the service, its address,
    the call and the status ("rollout service at H:P: Generate failed: NOT_FOUND: ...")."""

    def __init__(self, error: RlvrError) -> None:
        super().__init__(error.describe())
        self.code = error.code


class RolloutGone(RuntimeError):
    """A rollout server that went away did not come back within the wait (one line naming it)."""

    def __init__(self, message: str, address: str) -> None:
        super().__init__(message)
        self.address = address


class PolicyGenerator(Protocol):
    def generate(self, prompts: Sequence[list[int]], sampling: Sampling, expected: AdapterTag) -> RolloutBatch:
        """`group_size` completions of each prompt from the `expected` policy."""
        ...

    def publish_adapter(self, directory: Path, tag: AdapterTag) -> None:
        """Makes the PEFT adapter in `directory` the live version `tag` for the next generate."""
        ...

    def adopt_adapter(self, directory: Path, tag: AdapterTag) -> None:
        """Another process of this job made `directory` the live version `tag` (rank 0 of a job of
        several processes pushes for all: distributed.py): this generator's live version too."""
        ...

    def close(self) -> None: ...


def check_versions(stamps: Sequence[AdapterTag], expected: AdapterTag, step: int) -> None:
    """Raises AdapterVersionMismatch (one line) unless every completion carries `expected`."""
    for index, stamp in enumerate(stamps):
        if stamp != expected:
            stale = sum(1 for s in stamps if s != expected)
            raise AdapterVersionMismatch(
                f"adapter sync failed at step {step}: completion {index} (and {stale - 1} more of "
                f"{len(stamps)}) was generated by {stamp}, expected {expected}; refusing to train on "
                "rollouts of another policy"
            )


class SeededSampler:
    """A transformers logits processor that samples each row from softmax(shaped scores) with random
    numbers of its own prompt's: the Gumbel-max trick, argmax(s + G) with G standard Gumbel noise, is a
    draw from softmax(s). The scores are shaped by the job's temperature and sampling controls as vLLM
    shapes them (rlvr/sampling.py; tokens cut by top_k, top_p or min_p are -inf and never drawn).
    `generate` runs it with do_sample=False, so its greedy argmax makes that draw and no transformers
    warper touches the scores.

    Prompt i's `group_size` rows draw their noise from one torch.Generator seeded with `seeds[i]`,
    one (group_size, vocab) block per decoding step, whether or not a row has finished (transformers
    pads finished rows after the argmax): a row's t-th token depends only on its prompt's seed, its
    row in the group and its own logits, never on which other prompts share the batch."""

    def __init__(self, seeds: Sequence[int], sampling: Sampling, device: torch.device,
                 prompt_starts: torch.Tensor | None = None) -> None:
        import torch

        self.generators = [torch.Generator(device=device).manual_seed(seed) for seed in seeds]
        self.group_size = sampling.group_size
        self.sampling = sampling
        # Each row's first prompt position (left padding before it): the repetition penalty reads the
        # row's tokens from there on, never the padding.
        self.prompt_starts = prompt_starts

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        import torch

        s = self.sampling
        seen = None
        if s.repetition_penalty != 1.0:
            starts = self.prompt_starts if self.prompt_starts is not None else torch.zeros(len(input_ids))
            positions = torch.arange(input_ids.shape[1], device=input_ids.device)
            seen = seen_tokens(input_ids, positions[None, :] >= starts.to(input_ids.device)[:, None], scores.shape[-1])
        greedy = s.temperature <= 0
        shaped = shape_logits(scores, s.temperature, s.top_p, s.top_k, s.min_p, s.repetition_penalty, seen, greedy)
        if greedy:  # the argmax of the (penalized) scores themselves
            return shaped
        shape = (self.group_size, scores.shape[-1])
        uniform = torch.cat([torch.rand(shape, generator=g, device=scores.device, dtype=torch.float32)
                             for g in self.generators])
        tiny = torch.finfo(torch.float32).tiny  # rand is in [0, 1): keep the logs finite
        gumbel = -torch.log(-torch.log(uniform.clamp_(min=tiny)))
        return shaped + gumbel


def sharded(model: torch.nn.Module) -> bool:
    """Whether `model` is sharded by FSDP2 (torch's fully_shard, which accelerate applies in place)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule) or any(isinstance(m, FSDPModule) for m in model.modules())


class LocalGenerator:
    """In-process sampling from the policy being trained (transformers + peft).

    One batched `generate` call per step for all prompts. Each prompt's group is sampled with random
    numbers of its own (`SeededSampler`), seeded with `prompt_seed` of the step's seed and the
    prompt's index in the step's whole batch (`prompt_offset` is where this process's share of it
    starts), so a job split across processes (advanced.num_processes) gets the completions a single
    process would. Unseeded (`sampling.seed` None), the step's seed is drawn from torch's global
    generator (so `torch.manual_seed` still makes a run repeat)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, eos_token_ids: Sequence[int],
                 prompt_offset: int = 0) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = list(eos_token_ids)
        self.prompt_offset = prompt_offset
        self.model: torch.nn.Module | None = None  # bound by the engine once TRL has wrapped it

    def bind(self, model: torch.nn.Module) -> None:
        self.model = model

    def generate(self, prompts: Sequence[list[int]], sampling: Sampling, expected: AdapterTag) -> RolloutBatch:
        import torch

        started = time.perf_counter()
        seed = sampling.seed if sampling.seed is not None else int(torch.randint(0, 2**62, ()).item())
        seeds = [prompt_seed(seed, self.prompt_offset + i) for i in range(len(prompts))]
        completion_ids, clipped = self._sample(prompts, sampling, seeds)
        rows = [list(p) for p in prompts for _ in range(sampling.group_size)]
        return RolloutBatch(rows, completion_ids, None, clipped, expected, time.perf_counter() - started)

    def _sample(self, prompts: Sequence[list[int]], sampling: Sampling,
                seeds: Sequence[int]) -> tuple[list[list[int]], list[bool]]:
        import torch
        from transformers import GenerationConfig, LogitsProcessorList

        assert self.model is not None, "LocalGenerator.bind(model) first"
        pad = int(self.tokenizer.pad_token_id)
        rows = [list(p) for p in prompts for _ in range(sampling.group_size)]
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):  # left padding: every row's completion starts at `width`
            input_ids[i, width - len(row):] = torch.tensor(row)
            attention[i, width - len(row):] = 1
        device = next(self.model.parameters()).device
        # do_sample=False: no temperature, top-k or top-p warper; SeededSampler turns the greedy
        # argmax into a draw from the distribution the job's temperature and sampling controls shape,
        # as the vLLM backends do (with the defaults, the full tempered distribution TRL's loss evaluates).
        # Every logits processor a model's own generation_config could switch on (transformers fills in
        # the fields left None from it: a hub model's `repetition_penalty` 1.05, say) is pinned off, so
        # the completions stay draws from the distribution the loss scores, as on the rollout server.
        config = GenerationConfig(
            do_sample=False, max_new_tokens=sampling.max_tokens, pad_token_id=pad, eos_token_id=self.eos_token_ids,
            repetition_penalty=1.0, encoder_repetition_penalty=1.0, no_repeat_ngram_size=0,
            encoder_no_repeat_ngram_size=0, min_length=0, min_new_tokens=0, guidance_scale=1.0,
        )
        starts = width - torch.tensor([len(r) for r in rows])
        sampler = SeededSampler(seeds, sampling, device, starts)
        with torch.no_grad():
            out = self.model.generate(  # type: ignore[operator]  # a transformers model; nn.Module says Tensor | Module
                input_ids=input_ids.to(device), attention_mask=attention.to(device), generation_config=config,
                logits_processor=LogitsProcessorList([sampler]),
                # A policy sharded across processes (advanced.sharding fsdp) gathers its weights in each
                # forward, a collective: every process runs forwards until all its peers' rows are done.
                synced_gpus=sharded(self.model),
            )
        completion_ids, clipped = [], []
        for generated in out[:, width:].tolist():
            stop = next((j for j, t in enumerate(generated) if t in self.eos_token_ids), None)
            completion_ids.append(generated if stop is None else generated[: stop + 1])
            clipped.append(stop is None)
        return completion_ids, clipped

    def publish_adapter(self, directory: Path, tag: AdapterTag) -> None:
        pass  # the model generating is the model training: nothing to send

    def adopt_adapter(self, directory: Path, tag: AdapterTag) -> None:
        pass

    def close(self) -> None:
        self.model = None


# A rollout server that went away (killed, restarted): waited for, then the call is made again.
# NOT_FOUND is in the list for the adapter a restarted server could not bring back: it is pushed again.
_RECOVERABLE = frozenset({"UNAVAILABLE", "NOT_FOUND"})
_MAX_RECOVERIES = 3  # per call: a server that keeps dying under one request is not coming back


class ServiceGenerator:
    """Generation through RolloutService (vLLM, or its transformers fallback) with adapter sync,
    over the typed sync client (deadlines, retries); every failed call is a `RolloutError`.

    A rollout server that goes away mid-job is waited for, for at most `wait_s` seconds, each wait
    reported through `on_wait` (the job's status message); once it serves again, the adapter last
    pushed is pushed again (unless the server brought it back from its disk) and the call is made
    again, with the same seed, so the step is the one it would have been. Only a server that stays
    away past `wait_s` fails the job, with a message naming the rollout service.

    In a job of several processes only rank 0 pushes; the others `adopt_adapter` each version it
    pushed, and push it again themselves when they find the server without it (`_recover`): a rank
    that waited for rank 0 instead could wait in vain, as rank 0 may have generated its part of the
    step before the server went away. Two ranks pushing the same version is harmless: the server
    takes one, and answers the other FAILED_PRECONDITION ("not newer"), which `_recover` accepts."""

    def __init__(self, address: str, generate_timeout_s: float = 600.0, upload_timeout_s: float = 300.0,
                 wait_s: float = 300.0, on_wait: Callable[[str], None] | None = None,
                 auth: ChannelAuth | None = None) -> None:
        self.address = address
        self.auth = auth
        self.client = RolloutClient(address, auth=auth)
        self._old_clients: list[RolloutClient] = []  # replaced after an outage (`_recover`), closed at the end
        self.generate_timeout_s = generate_timeout_s
        self.upload_timeout_s = upload_timeout_s
        self.wait_s = wait_s
        self.on_wait = on_wait or (lambda _message: None)
        self.step = 0  # for error messages only
        # Where this process's share of a step starts (a job of several processes): its prompts are
        # seeded as in the whole step (`Sampling.from_prompt`), as LocalGenerator's are.
        self.prompt_offset = 0
        self._pushed: tuple[Path, AdapterTag] | None = None  # the live version this job made (its folder, tag)
        self.last_call: CallTiming | None = None  # the last Generate that returned a batch

    def info(self) -> rollout_pb2.RolloutInfo:
        try:
            return self.client.get_info()
        except RlvrError as e:
            raise RolloutError(e) from None

    def wait_ready(self, timeout_s: float = 600.0) -> None:
        """Waits until the rollout server's health is SERVING: a job queued while the stack starts
        (vLLM takes tens of seconds) must wait for the engine, not fail on "starting"."""
        status = self._until_serving(timeout_s)
        if status is not None:
            raise RuntimeError(f"the rollout service at {self.address} is not SERVING after "
                               f"{timeout_s:.0f} s (health: {status})")

    def _until_serving(self, timeout_s: float, on_wait: Callable[[float], None] | None = None) -> str | None:
        """Polls the server's health every second until SERVING (None), or until `timeout_s` have
        passed (its last health status); `on_wait(seconds waited)` before each sleep."""
        from rlvr.peers.base import check_health

        started = time.monotonic()
        while (status := check_health(self.address, auth=self.auth)) != "SERVING":
            waited = time.monotonic() - started
            if waited > timeout_s:
                return status
            if on_wait is not None:
                on_wait(waited)
            time.sleep(1.0)
        return None

    def forget(self, name: str) -> None:
        """Unloads `name` if the server holds it (a rerun of a job id starts again at version 1)."""
        try:
            self.client.unload_adapter(rollout_pb2.UnloadAdapterRequest(name=name))
        except RlvrError as e:
            if e.code.name != "NOT_FOUND":
                raise RolloutError(e) from None

    def _recovering(self, call: Callable[[], _T], what: str, repush: bool = True) -> _T:
        """`call()`, made again after the rollout server came back when it failed for its absence;
        `repush`: make this trainer's live version live there again first (not for a push, which
        brings a newer one itself, from a folder that may already hold the newer weights)."""
        for attempt in range(_MAX_RECOVERIES + 1):
            try:
                return call()
            except RolloutError as e:
                if e.code.name not in _RECOVERABLE or attempt == _MAX_RECOVERIES:
                    raise
                if e.code.name == "NOT_FOUND" and self._pushed is None:
                    raise  # nothing of ours to bring back (none pushed nor adopted): a real NOT_FOUND
                self._recover(e, what, repush)
        raise AssertionError("unreachable")

    def _recover(self, cause: RolloutError, what: str, repush: bool) -> None:
        """Waits (bounded) until the server serves again, then makes this trainer's live version
        live there again."""
        started = time.monotonic()
        log.warning("%s at step %d: %s", what, self.step, cause)
        reported = -math.inf

        def every_10_s(waited: float) -> None:
            nonlocal reported
            if waited - reported >= 10.0:
                reported = waited
                self._tell(f"step {self.step}: waiting for the rollout service at {self.address} "
                           f"({waited:.0f} s of at most {self.wait_s:.0f} s; {cause.code.name})")

        status = self._until_serving(self.wait_s, every_10_s)
        if status is not None:
            raise RolloutGone(f"the rollout service at {self.address} did not come back within "
                              f"{self.wait_s:.0f} s (health: {status}); {what} at step {self.step} "
                              f"failed with: {cause}", self.address) from None
        # A fresh channel with a connection of its own, as the health checks use: the one that saw
        # the server go may still be backing off its reconnects (gRPC's backoff grows with the
        # outage, up to 120 s) and fail every call at once with UNAVAILABLE, the server up. The
        # old one is closed at the end only: another thread's call may still be on it
        # (asynchronous steps, prefetch.py).
        self._old_clients.append(self.client)
        self.client = RolloutClient(self.address, auth=self.auth, own_connection=True)
        if repush and self._pushed is not None:
            directory, tag = self._pushed
            try:
                self._load(directory, tag)
            except RolloutError as e:
                if e.code.name != "FAILED_PRECONDITION":  # "not newer": the server restored it itself
                    raise
        message = (f"step {self.step}: the rollout service at {self.address} is back after "
                   f"{time.monotonic() - started:.0f} s; {what} again")
        self._tell(message)

    def _tell(self, message: str) -> None:
        log.warning(message)
        self.on_wait(message)

    def generate(self, prompts: Sequence[list[int]], sampling: Sampling, expected: AdapterTag) -> RolloutBatch:
        return self._recovering(lambda: self._generate(prompts, sampling, expected), "generating")

    def generate_newest(self, prompts: Sequence[list[int]], sampling: Sampling, since: AdapterTag) -> RolloutBatch:
        """As `generate`, from the version of `since.name` that is live when the server takes the
        request (`since` or a newer one pushed meanwhile): asynchronous steps (prefetch.py) generate
        while the trainer pushes, so a pinned version could be superseded before the request lands.
        The batch's `adapter` is the version every completion is stamped with (checked)."""
        return self._recovering(lambda: self._generate(prompts, sampling, since, pinned=False), "generating")

    def _generate(self, prompts: Sequence[list[int]], sampling: Sampling, expected: AdapterTag,
                  pinned: bool = True) -> RolloutBatch:
        started = time.perf_counter()
        n = sampling.group_size
        # An explicit version: the server itself refuses (NOT_FOUND) if it is not the live one.
        # Unpinned: version 0, the live one, which the server resolves once for the whole request.
        request = generate_request([token_prompt(p) for p in prompts], sampling.from_prompt(self.prompt_offset),
                                   expected if pinned else AdapterTag(expected.name, 0),
                                   request_id=f"trainer-step-{self.step}")
        by_index: dict[tuple[int, int], rollout_pb2.Completion] = {}
        call = CallTiming(request_id=request.request_id, sent=time.monotonic())
        try:
            for response in self.client.generate(request, timeout=self.generate_timeout_s):
                call.last_response = time.monotonic()
                call.first_response = call.first_response or call.last_response
                for c in response.completions:
                    by_index[(c.prompt_index, c.sample_index)] = c
        except RlvrError as e:
            raise RolloutError(e) from None
        missing = [(p, s) for p in range(len(prompts)) for s in range(n) if (p, s) not in by_index]
        if missing:
            raise RuntimeError(f"rollout service at {self.address} returned {len(by_index)} of "
                               f"{len(prompts) * n} completions (first missing: prompt {missing[0][0]})")
        ordered = [by_index[(p, s)] for p in range(len(prompts)) for s in range(n)]
        if not pinned:
            stamp = AdapterTag.of(ordered[0])
            if stamp.name != expected.name or stamp.version < expected.version:
                raise AdapterVersionMismatch(
                    f"adapter sync failed at step {self.step}: the rollout service generated with {stamp}, "
                    f"expected {expected} or a newer version of it; refusing to train on rollouts of another policy")
            expected = stamp
        check_versions([AdapterTag.of(c) for c in ordered], expected, self.step)
        for c in ordered:
            sent = list(prompts[c.prompt_index])
            if c.prompt_token_ids and list(c.prompt_token_ids) != sent:
                # Training on other prompt tokens than the engine saw would score the wrong sequence.
                raise RuntimeError(f"rollout service tokenized prompt {c.prompt_index} differently "
                                   f"({len(c.prompt_token_ids)} ids, sent {len(sent)})")
        batch = RolloutBatch(
            prompt_ids=[list(prompts[c.prompt_index]) for c in ordered],
            completion_ids=[list(c.token_ids) for c in ordered],
            logprobs=[list(c.logprobs) for c in ordered],
            clipped=[c.finish_reason == common_pb2.FINISH_REASON_LENGTH for c in ordered],
            adapter=expected,
            seconds=time.perf_counter() - started,
        )
        call.done = time.monotonic()
        self.last_call = call
        return batch

    def publish_adapter(self, directory: Path, tag: AdapterTag) -> None:
        self._recovering(lambda: self._load(directory, tag), f"pushing adapter {tag}", repush=False)
        self._pushed = (directory, tag)

    def adopt_adapter(self, directory: Path, tag: AdapterTag) -> None:
        """Rank 0 pushed `directory` as `tag`: it is brought back from here too, read again only when
        a later call finds the server without it. The folder then still holds `tag`'s weights: the
        ranks go in lock-step, and rank 0 saves the next version into it only after the optimizer
        step, which waits for every rank's rollout of the step (asynchronous steps, which generate
        beside the optimizer step, do not run across processes: rlvr/jobspec/)."""
        self._pushed = (directory, tag)

    def _load(self, directory: Path, tag: AdapterTag) -> None:
        try:
            info = self.client.load_adapter(tag.name, tag.version, directory, timeout=self.upload_timeout_s)
        except RlvrError as e:
            raise RolloutError(e) from None
        if (info.name, info.version) != (tag.name, tag.version):
            raise AdapterVersionMismatch(f"rollout service loaded {info.name} v{info.version} "
                                         f"when asked for {tag}")

    def close(self) -> None:
        for client in (*self._old_clients, self.client):
            client.close()
