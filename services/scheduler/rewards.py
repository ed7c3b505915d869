"""Which rewards a job may name: the reward service's catalog (ListRewardFunctions), asked when a
job or a loop is created and kept a few seconds (CreateJob in a burst asks once).

The reward service is where rewards live (its built-ins, the plugins installed there, the remote
rewards of its settings), so it is what a job's reward is checked against: an unknown key is
INVALID_ARGUMENT listing the known ones, a plugin that failed to load FAILED_PRECONDITION with its
error, before anything is created. When the reward service cannot be reached, the built-in rewards
(the same in every reward service) are still accepted, and a job naming another reward is refused
with UNAVAILABLE naming the reward service's address.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

from rlvr.common.auth import ChannelAuth
from rlvr.common.errors import Unavailable
from rlvr.peers.base import RlvrError
from rlvr.peers.clients import AsyncRewardClient
from rlvr.peers.types import catalog_of
from rlvr.rewards.registry import Catalog, RewardInfo, load_registry
from rlvr.v1 import common_pb2, reward_pb2

log = logging.getLogger("rlvr.scheduler.rewards")


def reward_keys(spec: common_pb2.JobSpec) -> list[str]:
    """The reward keys a job spec names (its key and its terms'), as given."""
    return [k for k in (spec.reward.key.strip(), *(t.key.strip() for t in spec.reward.terms)) if k]


class RewardCatalogs(Protocol):
    async def catalog(self, keys: Collection[str] = ()) -> Catalog: ...


class LocalRewards:
    """This process's registry: a scheduler run without a reward service (and the unit tests)."""

    async def catalog(self, keys: Collection[str] = ()) -> Catalog:
        return load_registry().catalog()


@dataclass(frozen=True)
class Unreached(Catalog):
    """The built-ins alone, known without asking; any other key cannot be checked now."""

    address: str = ""
    why: str = ""

    def get(self, key: str) -> RewardInfo:
        if key in self.rewards:
            return self.rewards[key]
        raise Unavailable(f"reward {key!r} cannot be checked: the reward service at {self.address} is unreachable "
                          f"({self.why}); retry when it is up")


class GrpcRewards:
    """The reward service's catalog, cached for `ttl_s` seconds, and asked again at once for a spec
    naming a key the cached one lacks (a Head job's head_<id>, a reward completed since)."""

    def __init__(self, address: str, auth: ChannelAuth | None = None, ttl_s: float = 10.0) -> None:
        self.address = address
        self._client = AsyncRewardClient(address, auth=auth)
        self._ttl_s = ttl_s
        self._cached: tuple[float, Catalog] | None = None
        self._lock = asyncio.Lock()

    async def catalog(self, keys: Collection[str] = ()) -> Catalog:
        async with self._lock:
            if self._cached is not None and time.monotonic() - self._cached[0] < self._ttl_s and (
                    isinstance(self._cached[1], Unreached) or all(k in self._cached[1].rewards for k in keys)):
                return self._cached[1]
            catalog: Catalog
            try:
                response = await self._client.list_reward_functions(reward_pb2.ListRewardFunctionsRequest(),
                                                                    timeout=10.0)
            except RlvrError as e:
                log.warning("the reward service at %s did not list its rewards: %s", self.address, e.describe())
                own = load_registry().catalog()
                builtins = {k: i for k, i in own.rewards.items() if i.source == "built-in"}
                catalog = Unreached(builtins, {}, self.address, f"{e.code.name}: {' '.join(e.details.split())}")
            else:
                catalog = catalog_of(response)
            # kept for the ttl either way: a burst of CreateJobs with the reward service down waits once
            self._cached = (time.monotonic(), catalog)
            return catalog

    async def close(self) -> None:
        await self._client.close()
