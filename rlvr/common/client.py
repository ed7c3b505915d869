"""gRPC channels for every rlvr client: the SDK, the CLI, and services calling each other.

One place decides how a client talks to the stack, so the contract's rules hold everywhere:

- every call carries a deadline: `deadline_for(method)` gives the default per method kind, and
  channels from `make_channel` add it to any call made without one (an interceptor), so a raw
  stub on one of these channels cannot hang forever either;
- idempotent calls retry with exponential backoff on UNAVAILABLE, through gRPC's own retry
  machinery (a service config on the channel). Only the methods in `IDEMPOTENT_METHODS` retry: a
  retried CreateJob could queue a job twice;
- keepalive pings while a call is open, so a long WatchJob notices a dead peer; messages up to
  64 MiB (adapters and checkpoints travel as chunk streams, never one message).

DEADLINE_EXCEEDED is never retried, and cannot be: the deadline covers the call with all its
attempts, so once it passes there is no time left to try again. A caller that wants more time
passes a longer timeout. Server streams retry only until their first message arrives; after that
gRPC has committed to the attempt and a failure reaches the caller.

This module imports only grpc and the generated messages (no torch), so `rlvr --help` stays fast.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable, Iterator
from typing import Any, Literal, overload

import grpc
import grpc.aio
from google.protobuf import descriptor_pool

from rlvr.common.auth import ChannelAuth

# Imported for their side effect: they add the v1 services to the default descriptor pool that
# `method_kind` reads.
from rlvr.common.settings import DEFAULT_PORTS
from rlvr.v1 import benchmark_pb2, reward_pb2, rollout_pb2, scheduler_pb2, trainer_pb2

CONTRACT_MODULES = (scheduler_pb2, trainer_pb2, reward_pb2, rollout_pb2, benchmark_pb2)
"""The generated modules of the v1 services, in the order the CLI lists them."""

SERVICE_NAMES: dict[str, str] = {
    "scheduler": "rlvr.v1.SchedulerService",
    "trainer": "rlvr.v1.TrainerService",
    "reward": "rlvr.v1.RewardService",
    "rollout": "rlvr.v1.RolloutService",
    "benchmark": "rlvr.v1.BenchmarkService",
}
"""Short name (CLI, settings) -> full gRPC service name."""

DEFAULT_ADDRESSES: dict[str, str] = {name: f"127.0.0.1:{port}" for name, port in DEFAULT_PORTS.items()}
"""Where the local stack (`rlvr up`) serves each service."""

MAX_MESSAGE_BYTES = 64 * 1024 * 1024

# Every method that may safely run twice: it reads state, or (Score) computes a pure function of
# its request. Kept as an explicit list rather than a name rule so that adding an RPC is a
# decision; tests/test_sdk.py checks that every Get*/List*/Watch* method of the contract is here
# and that every name here exists. Deliberately absent:
#   CreateJob, CreateLoop, RunEvaluation, StartJob: a retry could start the work twice;
#   CancelJob, StopLoop, UnloadAdapter: the second attempt fails (already ended / unknown);
#   CancelEvaluation: safe to repeat (a cancelled evaluation is answered as it is), yet kept with
#   the other state changes (Cancel*, Stop*, Delete*), which a caller repeats itself;
#   DeleteJob, DeleteEvaluation: a retry of a delete that went through answers NOT_FOUND, which
#   would hide the success;
#   LoadAdapter: a repeated version is FAILED_PRECONDITION, and the upload is large;
#   MergeModel, MergeAdapter: expensive and write artifacts;
#   RolloutService/Generate: even with a seed it costs a full generation, and without one the
#   answer differs; the trainer decides itself whether to ask again.
IDEMPOTENT_METHODS: frozenset[str] = frozenset(
    {
        "rlvr.v1.SchedulerService/GetJob",
        "rlvr.v1.SchedulerService/ListJobs",
        "rlvr.v1.SchedulerService/WatchJob",
        "rlvr.v1.SchedulerService/GetJobMetrics",
        "rlvr.v1.SchedulerService/GetJobSamples",
        "rlvr.v1.SchedulerService/DownloadAdapter",
        "rlvr.v1.SchedulerService/DownloadMergedModel",
        "rlvr.v1.SchedulerService/ExportHistory",
        "rlvr.v1.SchedulerService/GetLoop",
        "rlvr.v1.SchedulerService/ListLoops",
        "rlvr.v1.SchedulerService/WatchLoop",
        "rlvr.v1.SchedulerService/ListRewardFunctions",
        "rlvr.v1.SchedulerService/ListEnvironments",
        "rlvr.v1.SchedulerService/ListModels",
        "rlvr.v1.TrainerService/GetWorkerStatus",
        "rlvr.v1.TrainerService/FetchFolder",
        "rlvr.v1.RewardService/Score",
        "rlvr.v1.RewardService/GetProblems",
        "rlvr.v1.RewardService/ListRewardFunctions",
        "rlvr.v1.RolloutService/ListAdapters",
        "rlvr.v1.RolloutService/GetInfo",
        "rlvr.v1.BenchmarkService/ListBenchmarks",
        "rlvr.v1.BenchmarkService/GetEvaluation",
        "rlvr.v1.BenchmarkService/ListEvaluations",
        "rlvr.v1.BenchmarkService/GetEvaluationResults",
        "rlvr.v1.BenchmarkService/WatchEvaluation",
        "rlvr.v1.BenchmarkService/GetLeaderboard",
        "grpc.health.v1.Health/Check",
        "grpc.health.v1.Health/Watch",
    }
)

RETRY_POLICY: dict[str, Any] = {
    # 1 call + 4 retries; with jitter the waits average 0.1 + 0.2 + 0.4 + 0.8 s, enough to ride
    # over a service restart without hiding a service that is really down.
    "maxAttempts": 5,
    "initialBackoff": "0.2s",
    "maxBackoff": "5s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}

MethodKind = Literal["unary", "client_stream", "server_stream", "watch"]

DEFAULT_DEADLINES: dict[MethodKind, float] = {
    "unary": 30.0,
    # Adapter uploads: a rank-64 adapter of a 7B model is a few hundred MB.
    "client_stream": 300.0,
    # Generation, downloads, merge progress.
    "server_stream": 600.0,
    # Watch*: follows a job, loop or evaluation until it ends, and a long run takes days. Still
    # finite, so that no call is without a deadline; pass a shorter one to follow for a while.
    "watch": 7 * 24 * 3600.0,
}
"""Default deadline (seconds) per method kind; `METHOD_DEADLINES` overrides single methods."""

METHOD_DEADLINES: dict[str, float] = {
    # Up to 100000 completions per call, each capped at 10 s server-side, scored in parallel.
    "rlvr.v1.RewardService/Score": 300.0,
    # Datasets are read (and GSM8K parsed) on first use.
    "rlvr.v1.RewardService/GetProblems": 120.0,
    # May upload a local adapter to the rollout service before it returns.
    "rlvr.v1.BenchmarkService/RunEvaluation": 300.0,
    # Merging a large base model and writing it out takes a while.
    "rlvr.v1.SchedulerService/MergeModel": 3600.0,
    "rlvr.v1.SchedulerService/DownloadMergedModel": 3600.0,
    # The first job on a worker is answered once its fork server has imported torch, transformers
    # and TRL (about 31 s on a 2-core host): the scheduler's own StartJob timeout (workers.py) too.
    "rlvr.v1.TrainerService/StartJob": 60.0,
    "rlvr.v1.TrainerService/MergeAdapter": 3600.0,
    "rlvr.v1.TrainerService/FetchFolder": 3600.0,  # a merged model: gigabytes
    "grpc.health.v1.Health/Check": 5.0,
}


def normalize_method(name: str | bytes) -> str:
    """The "pkg.Service/Method" spelling of "/pkg.Service/Method", "pkg.Service.Method" or itself."""
    text = name.decode() if isinstance(name, bytes) else name
    text = text.lstrip("/")
    if "/" not in text:
        service, _, method = text.rpartition(".")
        text = f"{service}/{method}"
    return text


def method_kind(method_full_name: str | bytes) -> MethodKind:
    """The kind of a method, from the descriptors of the contract. A method the pool does not
    know (health, reflection) is a watch if its name starts with Watch, else unary."""
    service, _, method = normalize_method(method_full_name).partition("/")
    try:
        desc = descriptor_pool.Default().FindServiceByName(service).methods_by_name[method]
    except KeyError:
        return "watch" if method.startswith("Watch") else "unary"
    if desc.server_streaming:
        return "watch" if method.startswith("Watch") else "server_stream"
    return "client_stream" if desc.client_streaming else "unary"


def deadline_for(method_full_name: str | bytes) -> float:
    """The default deadline in seconds of a call to `method_full_name` (any spelling accepted by
    `normalize_method`)."""
    name = normalize_method(method_full_name)
    if name in METHOD_DEADLINES:
        return METHOD_DEADLINES[name]
    return DEFAULT_DEADLINES[method_kind(name)]


def service_config() -> dict[str, Any]:
    """The channel's service config: the retry policy on the idempotent methods only."""
    names = []
    for full in sorted(IDEMPOTENT_METHODS):
        service, _, method = full.partition("/")
        names.append({"service": service, "method": method})
    return {"methodConfig": [{"name": names, "retryPolicy": RETRY_POLICY, "waitForReady": False}]}


CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Ping every 30 s while a call is open (a WatchJob can be silent for minutes) and give up on
    # the connection after 10 s without an answer. The servers accept pings every 5 s
    # (rlvr.services.common.server.SERVER_OPTIONS); keep this above that or they answer GOAWAY.
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.enable_retries", 1),
    # gRPC keeps a retried call's request in memory and stops retrying once it outgrows the
    # buffer (default 256 KiB); a Score batch of 100000 items is bigger than that.
    ("grpc.per_rpc_retry_buffer_size", 16 * 1024 * 1024),
    ("grpc.retry_buffer_size", MAX_MESSAGE_BYTES),
    ("grpc.service_config", json.dumps(service_config())),
]


class _CallDetails(
    collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,
):
    """A concrete ClientCallDetails for the sync interceptor (grpc ships only the interface)."""


def _with_token(metadata: Any, token: str | None) -> Any:
    if token is None:
        return metadata
    entries = [(k, v) for k, v in (metadata or ()) if k.lower() != "authorization"]
    return (*entries, ("authorization", f"Bearer {token}"))


class _DefaultDeadline(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Gives a call without a timeout its `deadline_for` default, and the channel's token (sync
    channels)."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token

    def _with_deadline(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        if details.timeout is not None and self.token is None:
            return details
        return _CallDetails(
            details.method,
            deadline_for(details.method) if details.timeout is None else details.timeout,
            _with_token(details.metadata, self.token),
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        return continuation(self._with_deadline(details), request)

    def intercept_unary_stream(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        return continuation(self._with_deadline(details), request)

    def intercept_stream_unary(
        self, continuation: Callable[..., Any], details: Any, request_iterator: Iterator[Any]
    ) -> Any:
        return continuation(self._with_deadline(details), request_iterator)

    def intercept_stream_stream(
        self, continuation: Callable[..., Any], details: Any, request_iterator: Iterator[Any]
    ) -> Any:
        return continuation(self._with_deadline(details), request_iterator)


class _AioDefaults:
    """The aio interceptors' shared part: the default deadline and the channel's token."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        if details.timeout is None:
            details = details._replace(timeout=deadline_for(details.method))
        if self.token is not None:
            metadata = grpc.aio.Metadata(*_with_token(tuple(details.metadata or ()), self.token))
            details = details._replace(metadata=metadata)
        return details


class _AioDefaultUnaryUnary(_AioDefaults, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await continuation(self._details(client_call_details), request)


class _AioDefaultUnaryStream(_AioDefaults, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await continuation(self._details(client_call_details), request)


class _AioDefaultStreamUnary(_AioDefaults, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        return await continuation(self._details(client_call_details), request_iterator)


class _AioDefaultStreamStream(_AioDefaults, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        return await continuation(self._details(client_call_details), request_iterator)


def channel_credentials(auth: ChannelAuth) -> grpc.ChannelCredentials:
    """TLS credentials for `auth` (which has a CA): the server's certificate must chain to it; with
    a certificate and key, they are presented for mutual TLS."""
    return grpc.ssl_channel_credentials(root_certificates=auth.ca, private_key=auth.key, certificate_chain=auth.cert)


@overload
def make_channel(address: str, *, aio: Literal[False] = False, auth: ChannelAuth | None = None,
                 own_connection: bool = False, retries: bool = True) -> grpc.Channel: ...


@overload
def make_channel(address: str, *, aio: Literal[True], auth: ChannelAuth | None = None,
                 own_connection: bool = False, retries: bool = True) -> grpc.aio.Channel: ...


def make_channel(address: str, *, aio: bool = False, auth: ChannelAuth | None = None,
                 own_connection: bool = False, retries: bool = True) -> grpc.Channel | grpc.aio.Channel:
    """A channel to `address` ("HOST:PORT") with the options above: retries for the idempotent
    methods, keepalive, 64 MiB messages, and a default deadline on every call. `auth` adds the
    bearer token to every call and, with a CA, makes the channel TLS (rlvr.common.auth);
    without it the channel is plaintext and sends no token.

    `own_connection`: a connection of this channel's own. gRPC otherwise shares one among the
    process's channels to the same address with the same options, and with it its reconnect
    backoff: after a server restart a new channel fails at once with UNAVAILABLE, as the old one
    does, until the shared connection's backoff (which grows with the outage) lets it try again.

    `retries=False`: no retries by the channel, for a caller whose own loop waits for an
    unavailable service (the reward service's remote rewards: nested under the channel's five
    attempts, each of its waits took five times as long as it says).

    `aio=True` gives a grpc.aio channel for asyncio code (the services); the SDK and the CLI use
    the synchronous one. The caller closes it (`channel.close()`, awaited for aio)."""
    auth = auth or ChannelAuth()
    options = [*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)] if own_connection else CHANNEL_OPTIONS
    if not retries:
        options = [(k, 0 if k == "grpc.enable_retries" else v) for k, v in options]
    if aio:
        interceptors: list[grpc.aio.ClientInterceptor] = [
            _AioDefaultUnaryUnary(auth.token),
            _AioDefaultUnaryStream(auth.token),
            _AioDefaultStreamUnary(auth.token),
            _AioDefaultStreamStream(auth.token),
        ]
        if auth.tls:
            return grpc.aio.secure_channel(address, channel_credentials(auth), options=options,
                                           interceptors=interceptors)
        return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
    channel = (grpc.secure_channel(address, channel_credentials(auth), options=options) if auth.tls
               else grpc.insecure_channel(address, options=options))
    return grpc.intercept_channel(channel, _DefaultDeadline(auth.token))
