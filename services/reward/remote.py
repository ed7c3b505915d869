"""Remote rewards: a reward served by a service of the user's own, over the contract.

The reward service's settings map a key to an address (services/reward/settings.py, RemoteReward);
a job names the key like any reward's. Scoring sends that server a ScoreRequest with `key` set and
`format_bonus` false, and reads one RewardComponents per item: its score in `reward`, named parts in
`components`. Its answer is not trusted: a wrong number of results fails the call's items, and a
score that is not a number in [0, 1] (or an item's own `error`) fails that item, each scored 0 with
the reason. An unreachable server is waited for (``wait_seconds``, retrying with backoff), then the
call fails with UNAVAILABLE naming the key and the address, once: the status tells the caller's
channel not to retry (`NO_RETRY`), which would wait ``wait_seconds`` again per retry. The trainer's
own wait still rides over a restart of it as over one of the rollout server, and fails the job
naming it when it does not come back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import grpc

from rlvr.common.auth import ChannelAuth
from rlvr.common.errors import FailedPrecondition, Unavailable
from rlvr.common.settings import read_secret_file
from rlvr.peers.base import RlvrError
from rlvr.peers.clients import AsyncRewardClient
from rlvr.peers.types import ScoreInput
from rlvr.rewards.combine import TermError, TermResult, error_text, normalize
from rlvr.rewards.registry import RewardInfo, RewardOutput, Sample
from rlvr.services.reward.settings import RemoteReward
from rlvr.v1 import reward_pb2

log = logging.getLogger("rlvr.reward.remote")

_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)


class RemoteScorer:
    """One remote reward: its declaration (from the settings) and an asyncio client of its server."""

    def __init__(self, key: str, settings: RemoteReward) -> None:
        self.key = key
        self.settings = settings
        self.address = settings.address
        self.info = RewardInfo(
            key=key, display_name=settings.display_name or key, description=settings.description,
            needs_dataset=settings.needs_dataset, columns=tuple(settings.columns),
            default_benchmark=settings.default_benchmark, instruction=settings.instruction,
            source=f"remote {settings.address}")
        token = read_secret_file(settings.token_file, f"remote_rewards.{key}.token_file") \
            if settings.token_file is not None else None
        ca = settings.tls_ca_file.read_bytes() if settings.tls_ca_file is not None else None
        # No channel retries: `_call` waits `wait_seconds` for the server itself (under the channel's
        # five attempts each of its attempts took seconds, and a 0.5 s wait took 3-4 s).
        self._client = AsyncRewardClient(settings.address, auth=ChannelAuth(token=token, ca=ca), retries=False)

    def _where(self) -> str:
        return f"remote reward {self.key!r} at {self.address}"

    async def _call(self, request: reward_pb2.ScoreRequest) -> reward_pb2.ScoreResponse:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.wait_seconds
        for attempt in range(1_000_000):
            try:
                return await self._client.score(request, timeout=self.settings.timeout_seconds)
            except RlvrError as e:
                gone = e.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
                if gone and loop.time() < deadline:
                    if attempt == 0:
                        log.warning("%s is unreachable (%s); retrying for up to %g s", self._where(), e.code.name,
                                    self.settings.wait_seconds)
                    await asyncio.sleep(min(_BACKOFF_S[min(attempt, len(_BACKOFF_S) - 1)],
                                            max(0.0, deadline - loop.time())))
                    continue
                details = " ".join(e.details.split())
                if gone:  # waited for already: the caller's channel must not wait again per retry
                    raise Unavailable(f"{self._where()} is unreachable after {self.settings.wait_seconds:g} s: "
                                      f"{e.code.name}: {details}", retry=False) from None
                raise FailedPrecondition(f"{self._where()} refused the call: {e.code.name}: {details}") from None
        raise AssertionError("unreachable")

    async def check(self) -> None:
        """The server answers (an empty Score): Unavailable naming it when it does not."""
        await self._call(reward_pb2.ScoreRequest(key=self.key, format_bonus=False))

    async def score(self, samples: Sequence[Sample]) -> list[TermResult]:
        """Each sample's result, in order; Unavailable/FailedPrecondition when the call itself fails."""
        items = [ScoreInput(s.completion, s.ground_truth, s.prompt, s.messages, s.columns).to_proto() for s in samples]
        response = await self._call(reward_pb2.ScoreRequest(key=self.key, items=items, format_bonus=False))
        if len(response.results) != len(samples):
            failed = TermError(f"{self.key}: the remote reward at {self.address} answered {len(response.results)} "
                               f"scores for {len(samples)} completions")
            return [failed] * len(samples)
        return [self._one(r) for r in response.results]

    def _one(self, result) -> TermResult:  # a RewardComponents
        if result.error:
            return TermError(f"{self.key}: {result.error[:300]}")
        try:
            output = normalize(RewardOutput(result.reward, dict(result.components)))
        except (TypeError, ValueError) as exc:
            return TermError(f"{self.key}: the remote reward at {self.address} answered {error_text(exc)}")
        return RewardOutput(output.score, output.components, result.strict or output.score == 1.0,
                            result.extracted_answer or None, result.note[:300])

    async def close(self) -> None:
        await self._client.close()
