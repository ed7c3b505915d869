"""Environments: what the policy talks to over an episode's turns (base.py), found through the
entry-point group ``rlvr.environments`` (registry.py), their tools run with time limits (tools.py)."""

from rlvr.environments.base import (
    Environment,
    EnvironmentDefinition,
    EnvironmentInfo,
    EpisodeRow,
    Reply,
    ToolCall,
    environment,
    tool,
)

__all__ = ["Environment", "EnvironmentDefinition", "EnvironmentInfo", "EpisodeRow", "Reply", "ToolCall",
           "environment", "tool"]
