"""What an environment is: a stateful object per episode, its tools, and its declaration.

An episode (rlvr/episodes) is a conversation between the policy and an environment:

1. ``reset(row)``: the environment gets the dataset row (its question, ground truth and columns) and
   may return text that is added to the prompt's last user message (the rules of a game, say).
2. The policy answers. If its answer calls tools (in the chat template's tool-call format), each
   call runs (``run_tool`` in tools.py: a time limit, an error observation instead of a crash) and
   the results are appended as ``tool`` messages; the policy answers again.
3. An answer that calls no tool goes to ``step(text)``. Its `Reply` may add a user message (a
   game's feedback, a simulated user) and go on, or end the episode (``done``). The default ends
   the episode at the first answer without a tool call.
4. The episode also ends at ``max_turns`` assistant turns, at the job's cap on episode tokens, or
   when the policy is cut at its per-turn token limit (``truncated``).

The episode's reward: ``reward()`` when the environment scores it itself (not None), else the job's
reward scores the final answer, seeing the whole conversation and ``state()`` (`EpisodeRow`'s
columns under ``"environment"``). Per-turn rewards (`Reply.reward`) are recorded and added to the
episode's reward; the whole episode's advantage applies to every token the policy sampled in it
(one credit rule, the field's default: no per-turn discounting).

An environment is declared once, like a reward (`EnvironmentDefinition`), and found through the
entry-point group ``rlvr.environments`` (registry.py), so a plugin is any installed package.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

KEY_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
KEY_RULE = "lower-case letters, digits and _, starting with a letter, at most 64 characters"
MAX_TURNS_DEFAULT = 4
TOOL_TIMEOUT_DEFAULT = 10.0

__all__ = [
    "Environment", "EnvironmentDefinition", "EnvironmentFailure", "EnvironmentInfo", "EpisodeRow", "KEY_RE", "KEY_RULE", "Reply",
    "ToolCall", "check_tool", "environment", "tool",
]


class EnvironmentFailure(RuntimeError):
    """Raised (by a tool or any method) when the environment itself cannot go on, not the policy's
    call: the episode ends with this reason, scored 0, instead of the policy reading it as a tool's
    error (a remote environment's server gone is one)."""


@dataclass(frozen=True)
class EpisodeRow:
    """The dataset row an episode starts from: what ``reset`` gets."""

    prompt: str  # the question as the dataset states it (before chat templating)
    ground_truth: str = ""
    columns: Mapping[str, Any] = field(default_factory=dict)
    messages: tuple[tuple[str, str], ...] = ()  # the dataset's conversation, when its prompt is one
    seed: int = 0  # the episode's own seed (a game that draws something draws it from this)


@dataclass(frozen=True)
class ToolCall:
    """One tool call the policy made, parsed from its answer."""

    name: str
    arguments: Mapping[str, Any]
    id: str = ""


@dataclass(frozen=True)
class Reply:
    """The environment's answer to a policy turn that called no tool."""

    text: str | None = None  # a user message to append (None: nothing to say)
    done: bool = False  # the episode ends here
    reward: float | None = None  # a per-turn reward, added to the episode's


def tool(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Marks a method (or function) as a tool the policy may call. Its JSON schema comes from its
    type hints and its Google-style docstring (transformers' ``get_json_schema``), and reaches the
    model through the chat template's ``tools``. It may be ``async def``.

    Checked here, at declaration: a docstring, and a type hint and an ``Args:`` line for every
    parameter (what the schema is made from); ValueError naming what is missing."""
    check_tool(fn)
    fn.__rlvr_tool__ = True  # type: ignore[attr-defined]
    return fn


def check_tool(fn: Callable[..., Any]) -> None:
    """What a tool's JSON schema needs of its declaration (see `tool`); ValueError naming what is missing."""
    name = getattr(fn, "__qualname__", repr(fn))
    doc = inspect.getdoc(fn) or ""
    if not doc.strip():
        raise ValueError(f"tool {name}: no docstring; a tool needs one (Google style: a description, then an "
                         "'Args:' section with one line per parameter), which is what the model reads")
    problems = []
    for param in inspect.signature(fn).parameters.values():
        if param.name in ("self", "cls") or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.annotation is inspect.Parameter.empty:
            problems.append(f"parameter {param.name!r} has no type hint")
        if not re.search(rf"^\s*{re.escape(param.name)}\s*(\([^)]*\))?\s*:", doc, re.MULTILINE):
            problems.append(f"parameter {param.name!r} is not described in the docstring's 'Args:' section")
    if problems:
        raise ValueError(f"tool {name}: " + "; ".join(problems))


class Environment:
    """One episode's environment. rlvr makes a fresh one per episode (`EnvironmentDefinition.make`),
    so its attributes are the episode's state. Every method may be ``async def``."""

    def reset(self, row: EpisodeRow) -> str | None:
        """Starts the episode on ``row``; text returned is added to the prompt's last user message."""
        return None

    def tools(self) -> Sequence[Callable[..., Any]]:
        """The tools offered to the policy: by default this object's methods marked with `tool`."""
        return [getattr(self, name) for name, member in inspect.getmembers(type(self))
                if callable(member) and getattr(member, "__rlvr_tool__", False)]

    def step(self, text: str) -> Reply:
        """The policy's answer ``text`` called no tool: the environment's reply. Default: done."""
        return Reply(done=True)

    def reward(self) -> Any:
        """The episode's score when the environment gives it (a number in [0, 1], named components
        or an rlvr.rewards.RewardOutput, as a reward returns); None = the job's reward scores it."""
        return None

    def state(self) -> Mapping[str, Any]:
        """The environment's final state as JSON-able values: what the job's reward reads (the
        ``"environment"`` column) and what an evaluation's rows show."""
        return {}

    def close(self) -> None:
        """The episode is over (also after a failure): release what the episode holds."""


@dataclass(frozen=True)
class EnvironmentInfo:
    """What an environment declares: what ListEnvironments answers and a job is checked against."""

    key: str
    display_name: str
    description: str = ""
    version: str = "1"
    columns: tuple[str, ...] = ()  # dataset columns it reads besides prompt and ground_truth
    instruction: str = ""  # replaces the reward's instruction when set (how to call the tools, say)
    default_benchmark: str = ""  # "" = the key
    tools: tuple[str, ...] = ()  # the names of the tools it offers (for lists; an episode asks `tools()`)
    max_turns: int = MAX_TURNS_DEFAULT  # a job's default when it names this environment
    tool_timeout_seconds: float = TOOL_TIMEOUT_DEFAULT  # each tool call's time limit
    source: str = "built-in"
    # The settings it takes (its class's keyword arguments): a job naming another is refused. None:
    # not declared (a remote environment, a factory of its own), any is passed on.
    settings: tuple[str, ...] | None = None

    @property
    def benchmark(self) -> str:
        return self.default_benchmark or self.key


@dataclass(frozen=True)
class EnvironmentDefinition(EnvironmentInfo):
    """An environment: its declaration plus ``factory``, which makes one episode's `Environment`
    from the job's environment settings (a mapping of strings, possibly empty)."""

    factory: Callable[[Mapping[str, str]], Environment] | None = None
    environment_class: type[Environment] | None = None  # the class `environment` declared, if any

    def __post_init__(self) -> None:
        problems = []
        if not KEY_RE.match(self.key):
            problems.append(f"key {self.key!r} is not allowed ({KEY_RULE})")
        if not self.display_name.strip():
            problems.append("display_name is empty")
        if self.factory is None:
            problems.append("factory is missing (a callable: settings -> Environment)")
        if not 1 <= self.max_turns <= 64:
            problems.append(f"max_turns {self.max_turns} is out of range 1-64")
        if not 0 < self.tool_timeout_seconds <= 600:
            problems.append(f"tool_timeout_seconds {self.tool_timeout_seconds} is out of range (0-600]")
        if problems:
            raise ValueError(f"environment {self.key!r}: " + "; ".join(problems))

    def make(self, settings: Mapping[str, str] | None = None) -> Environment:
        assert self.factory is not None
        return self.factory(dict(settings or {}))

    def info(self) -> EnvironmentInfo:
        """The declaration alone (no code): what crosses process and service boundaries."""
        return EnvironmentInfo(**{f: getattr(self, f) for f in EnvironmentInfo.__dataclass_fields__})


def environment(
    key: str,
    *,
    display_name: str | None = None,
    description: str = "",
    version: str = "1",
    columns: Sequence[str] = (),
    instruction: str = "",
    default_benchmark: str = "",
    max_turns: int = MAX_TURNS_DEFAULT,
    tool_timeout_seconds: float = TOOL_TIMEOUT_DEFAULT,
) -> Callable[[type[Environment]], EnvironmentDefinition]:
    """Declares an `Environment` subclass (the plugin form)::

        @environment("calculator", display_name="Calculator", version="1")
        class Calculator(Environment):
            @tool
            def calculate(self, expression: str) -> str:
                \"\"\"Evaluates an arithmetic expression.

                Args:
                    expression: e.g. "12 * (3 + 4)"
                \"\"\"

    The class is made with its settings as keyword arguments when its ``__init__`` takes any, else
    with none."""

    def make(cls: type[Environment]) -> EnvironmentDefinition:
        params = inspect.signature(cls).parameters
        takes = bool(params)
        open_ended = any(p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) for p in params.values())
        settings = None if open_ended else tuple(params)

        def factory(settings: Mapping[str, str]) -> Environment:
            return cls(**settings) if takes else cls()

        tools = tuple(name for name, member in inspect.getmembers(cls)
                      if callable(member) and getattr(member, "__rlvr_tool__", False))
        return EnvironmentDefinition(
            key=key, display_name=display_name or key.replace("_", " ").capitalize(),
            description=description or (inspect.getdoc(cls) or "").split("\n\n")[0].replace("\n", " "),
            version=version, columns=tuple(columns), instruction=instruction,
            default_benchmark=default_benchmark, tools=tools, max_turns=max_turns,
            tool_timeout_seconds=tool_timeout_seconds, factory=factory, environment_class=cls, settings=settings,
        )

    return make
