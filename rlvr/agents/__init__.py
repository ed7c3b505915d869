"""Agent programs as the policy: ordinary code against an OpenAI-compatible client, trained unchanged.

An agent is a function ``(client, row) -> reward`` declared with `agent` and installed like an
environment (entry-point group ``rlvr.environments``); a job names it as its environment. Its model
calls reach the process's OpenAI-compatible endpoint (gateway.py), which samples from the job's
policy and records every token (recorder.py). See docs/agents.md.
"""

from rlvr.agents.base import AgentEnvironment, AgentResult, AgentRow, agent

__all__ = ["AgentEnvironment", "AgentResult", "AgentRow", "agent"]
