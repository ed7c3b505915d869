"""The environments an agent job may name: this process's registry (rlvr/environments/registry.py),
as ListEnvironments answers it. The scheduler checks jobs against the same registry it lists."""

from __future__ import annotations

import asyncio

from rlvr.environments.base import EnvironmentInfo
from rlvr.environments.registry import Catalog, load_registry
from rlvr.v1 import scheduler_pb2


def environment_info_proto(info: EnvironmentInfo) -> scheduler_pb2.EnvironmentInfo:
    return scheduler_pb2.EnvironmentInfo(
        key=info.key, display_name=info.display_name, description=info.description, version=info.version,
        source=info.source, tools=info.tools, columns=info.columns, max_turns=info.max_turns,
        default_benchmark=info.benchmark, instruction=info.instruction,
        tool_timeout_seconds=info.tool_timeout_seconds)


def environments_proto(catalog: Catalog) -> scheduler_pb2.ListEnvironmentsResponse:
    return scheduler_pb2.ListEnvironmentsResponse(
        environments=[environment_info_proto(i) for i in catalog.infos()],
        unavailable=[scheduler_pb2.UnavailableEnvironment(key=k, error=e) for k, e in sorted(catalog.failed.items())])


async def list_environments() -> scheduler_pb2.ListEnvironmentsResponse:
    """ListEnvironments' answer (the first call loads the registry, importing its modules: in a thread)."""
    registry = await asyncio.to_thread(load_registry)
    return environments_proto(registry.catalog())
