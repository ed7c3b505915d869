"""The reward registry: every reward rlvr scores with, built-in or plugin, declared once.

A reward is a :class:`RewardDefinition`: its key, what it shows (display name, description), what a
job needs to use it (a dataset, the columns it reads), where its prompts come from, its default
benchmark and instruction, and the function that scores one completion (or a batch, or either as a
coroutine). Every reward is found the same way, through the entry-point group ``rlvr.rewards``: the
built-ins are entry points of rlvr's own distribution (``pyproject.toml``), a plugin is any installed
package that declares one::

    [project.entry-points."rlvr.rewards"]
    exact_label = "my_rewards:exact_label"      # a RewardDefinition, e.g. made by @reward

A plugin is code installed where the reward service runs; a client only ever names a key.

Scores: a reward returns its score of one completion, a number in [0, 1]; or named components in
[0, 1] (``{"accuracy": 1.0, "format": 0.0}``), whose score is the component ``"score"`` when there is
one and their mean otherwise; or a :class:`RewardOutput`. Anything else (NaN, 1.5, a string, an
exception) scores that completion 0 with a reason (rlvr/rewards/combine.py); it is never a crash.
"""

from __future__ import annotations

import inspect
import logging
import re
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any, TypeAlias

log = logging.getLogger("rlvr.rewards")

ENTRY_POINT_GROUP = "rlvr.rewards"
BUILTIN_DISTRIBUTION = "rlvr"
KEY_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
KEY_RULE = "lower-case letters, digits and _, starting with a letter, at most 64 characters"
DEFAULT_INSTRUCTION = (
    "Think step by step inside <think></think>, then give only the final answer inside <answer></answer>."
)


@dataclass(frozen=True)
class Sample:
    """What a reward sees of one completion.

    ``prompt`` is the question as the dataset states it (before chat templating; for a conversation,
    its last user turn), ``messages`` the whole conversation when the dataset's prompt is one, and
    ``columns`` the dataset row's other columns (a reward declares those it reads)."""

    completion: str
    ground_truth: str = ""
    prompt: str = ""
    messages: tuple[tuple[str, str], ...] = ()
    columns: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RewardOutput:
    """A reward's full answer for one completion. ``strict`` (None: ``score == 1``) is the
    benchmark's "accuracy strict"; ``extracted_answer`` what the reward read as the answer; ``note``
    why it scored so, in a few words (a score the completion earned, unlike an error of the reward)."""

    score: float
    components: Mapping[str, float] = field(default_factory=dict)
    strict: bool | None = None
    extracted_answer: str | None = None
    note: str = ""  # why it scored what it did, when the reward says ("cpu-time limit 2 s"); not an error


ScoreValue: TypeAlias = float | int | Mapping[str, float] | RewardOutput
ScoreOne: TypeAlias = Callable[[Sample], Any]  # -> ScoreValue, or an awaitable of one
ScoreMany: TypeAlias = Callable[[Sequence[Sample]], Any]  # -> Sequence[ScoreValue], or an awaitable
# (dataset, data roots) -> an rlvr.tasks.base.Task (rlvr/tasks sits above this module: Any here)
TaskFactory: TypeAlias = Callable[[str | None, Sequence[Path]], Any]


@dataclass(frozen=True)
class RewardInfo:
    """What a reward declares about itself: what ListRewardFunctions answers, and all the scheduler,
    the CLI and the console need to offer it and check a job that names it."""

    key: str
    display_name: str
    description: str = ""
    needs_dataset: bool = True  # a job must name reward.dataset
    accepts_dataset: bool = False  # has prompts of its own, and takes a dataset instead when given one
    columns: tuple[str, ...] = ()  # dataset columns it reads besides prompt and ground_truth
    default_benchmark: str = ""  # "" = the key
    benchmark_display_name: str = ""  # "" = "<display name> held-out"
    instruction: str = DEFAULT_INSTRUCTION
    splits: tuple[str, ...] = ()  # the fixed splits of its own data (GSM8K's); () = generated, or the user's
    data_name: str = ""  # its own data, as messages name it ("the built-in openai/gsm8k"); "" = generated
    heldout_size: int = 0  # questions of its held-out split, 0 = depends on the dataset
    # The names its Dataset field takes when they name its own tasks rather than data (reasoning-gym's
    # tasks; options may follow a "?"): a job naming another is refused at validation. () = data.
    dataset_names: tuple[str, ...] = ()
    source: str = "built-in"
    order: int = 1000  # where lists show it, lowest first (the spec's three: 0, 1, 2); then by key

    @property
    def benchmark(self) -> str:
        return self.default_benchmark or self.key

    @property
    def benchmark_title(self) -> str:
        return self.benchmark_display_name or f"{self.display_name} held-out"

    @property
    def takes_dataset(self) -> bool:
        return self.needs_dataset or self.accepts_dataset


@dataclass(frozen=True)
class RewardDefinition(RewardInfo):
    """A reward: its declaration plus the code that scores (``score`` for one completion, or
    ``score_batch`` for a batch; either may be ``async def``) and, for a reward with prompts of its
    own, ``problems`` (dataset, data roots) -> a :class:`rlvr.tasks.base.Task`. Without
    ``problems`` the job's dataset supplies them (``prompt``, ``ground_truth`` and the declared
    ``columns``). ``timeout_seconds`` is the per-completion time limit it needs when the caller's
    default is too short (a code reward's test run). ``warm_up``, when given, is run once per scoring
    process before its first completion, outside the per-completion limit: an import too slow to
    pay inside the first one's time (reasoning-gym's) and too slow to pay where the reward is only listed."""

    score: ScoreOne | None = None
    score_batch: ScoreMany | None = None
    problems: TaskFactory | None = None
    timeout_seconds: float | None = None
    warm_up: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        problems = []
        if not KEY_RE.match(self.key):
            problems.append(f"key {self.key!r} is not allowed ({KEY_RULE})")
        if (self.score is None) == (self.score_batch is None):
            problems.append("give exactly one of score (one completion) and score_batch (a batch)")
        if not self.display_name.strip():
            problems.append("display_name is empty")
        if self.needs_dataset and self.accepts_dataset:
            problems.append("needs_dataset and accepts_dataset exclude each other")
        if not self.needs_dataset and self.problems is None:
            problems.append("a reward that needs no dataset must say where its prompts come from (problems)")
        if self.dataset_names and (self.problems is None or not self.takes_dataset):
            problems.append("dataset_names name its own tasks: it needs problems and takes a dataset")
        if self.timeout_seconds is not None and not 0 < self.timeout_seconds <= 60:
            problems.append(f"timeout_seconds {self.timeout_seconds} is out of range (0-60]")
        if problems:
            raise ValueError(f"reward {self.key!r}: " + "; ".join(problems))

    @property
    def is_async(self) -> bool:
        fn = self.score if self.score is not None else self.score_batch
        return inspect.iscoroutinefunction(fn)

    def info(self) -> RewardInfo:
        """The declaration alone (no code): what crosses process and service boundaries."""
        return RewardInfo(**{f: getattr(self, f) for f in RewardInfo.__dataclass_fields__})


def reward(
    key: str,
    *,
    display_name: str | None = None,
    description: str = "",
    needs_dataset: bool = True,
    columns: Sequence[str] = (),
    default_benchmark: str = "",
    instruction: str = DEFAULT_INSTRUCTION,
    batch: bool = False,
    timeout_seconds: float | None = None,
) -> Callable[[Callable[..., Any]], RewardDefinition]:
    """Declares a function as a reward (the plugin form)::

        @reward("exact_label", display_name="Exact label", columns=("choices",))
        def exact_label(sample: Sample) -> float: ...

    With ``batch=True`` the function takes the list of a call's samples and returns their scores in
    order. The function may be ``async def``."""

    def make(fn: Callable[..., Any]) -> RewardDefinition:
        return RewardDefinition(
            key=key, display_name=display_name or key.replace("_", " ").capitalize(),
            description=description or (inspect.getdoc(fn) or "").split("\n\n")[0].replace("\n", " "),
            needs_dataset=needs_dataset, columns=tuple(columns), default_benchmark=default_benchmark,
            instruction=instruction, timeout_seconds=timeout_seconds,
            score=None if batch else fn, score_batch=fn if batch else None,
        )

    return make


class UnknownReward(LookupError):
    """No reward has this key; the message lists the known ones."""


class UnavailableReward(LookupError):
    """A reward of this key exists but could not be loaded; the message is its error."""


@dataclass(frozen=True)
class Catalog:
    """What is known of the rewards a reward service can score with: the declarations of those that
    loaded (by key), and why the others did not (key -> error). ListRewardFunctions answers one; a
    job's spec is checked against one (rlvr/jobspec/)."""

    rewards: Mapping[str, RewardInfo]
    failed: Mapping[str, str] = field(default_factory=dict)

    def get(self, key: str) -> RewardInfo:
        try:
            return self.rewards[key]
        except KeyError:
            if key in self.failed:
                raise UnavailableReward(f"reward {key!r} could not be loaded: {self.failed[key]}") from None
            raise UnknownReward(f"{key!r} is not a reward; known: {', '.join(sorted(self.rewards)) or 'none'}") \
                from None

    def infos(self) -> list[RewardInfo]:
        """The loaded rewards' declarations in the order lists show them (`order`, then key)."""
        return [_info(d) for d in sorted(self.rewards.values(), key=lambda d: (d.order, d.key))]


def _info(reward: RewardInfo) -> RewardInfo:
    return reward.info() if isinstance(reward, RewardDefinition) else reward


@dataclass(frozen=True)
class Registry(Catalog):
    """The rewards of this process, with their code."""

    rewards: Mapping[str, RewardDefinition]  # narrower: the definitions

    def get(self, key: str) -> RewardDefinition:
        return super().get(key)  # type: ignore[return-value]  # every entry is a RewardDefinition

    def catalog(self) -> Catalog:
        """The declarations alone (what another process is told)."""
        return Catalog({i.key: i for i in self.infos()}, dict(self.failed))


def _source(entry: metadata.EntryPoint) -> str:
    dist = entry.dist
    if dist is None or dist.metadata["Name"] == BUILTIN_DISTRIBUTION:
        return "built-in"
    return f"plugin {dist.metadata['Name']} {dist.version}"


def _entry_points() -> list[metadata.EntryPoint]:
    return list(metadata.entry_points(group=ENTRY_POINT_GROUP))


def discover(allowed: Collection[str] | None = None) -> Registry:
    """Loads every reward of the entry-point group, now (no cache: see :func:`load_registry`).

    ``allowed``: the plugin keys to load (None = every installed one); the built-ins always load.
    A plugin that fails to import, declares a bad reward or a key another reward has, is logged
    once and left out (``failed``); the others load."""
    rewards: dict[str, RewardDefinition] = {}
    failed: dict[str, str] = {}
    entries = sorted(_entry_points(), key=lambda e: (_source(e) != "built-in", e.name))
    if not any(_source(e) == "built-in" for e in entries):
        raise RuntimeError(f"rlvr's own rewards are not registered (entry-point group {ENTRY_POINT_GROUP!r}): "
                           "reinstall rlvr (pip install -e . or make install) so its entry points exist")
    for entry in entries:
        source = _source(entry)
        if source != "built-in" and allowed is not None and entry.name not in allowed:
            failed[entry.name] = (f"not allowed by the reward service's settings (plugins: "
                                  f"{', '.join(sorted(allowed)) or 'none'})")
            continue
        try:
            loaded = entry.load()
            if not isinstance(loaded, RewardDefinition):
                raise TypeError(f"{entry.value} is a {type(loaded).__name__}, not a RewardDefinition "
                                "(declare it with rlvr.rewards.reward or RewardDefinition)")
            if loaded.key != entry.name:
                raise ValueError(f"entry point {entry.name!r} declares the reward key {loaded.key!r}; they must match")
            if loaded.key in rewards:
                raise ValueError(f"the key {loaded.key!r} is taken by {rewards[loaded.key].source}")
        except Exception as exc:  # a broken plugin never takes the others down
            error = f"{source} ({entry.value}): {type(exc).__name__}: {exc}"
            log.error("reward %r not loaded: %s", entry.name, error)
            failed[entry.name] = error
            continue
        rewards[loaded.key] = replace(loaded, source=source)
    return Registry(rewards, failed)


_cache: dict[frozenset[str] | None, Registry] = {}
_cache_lock = threading.Lock()


def load_registry(allowed: Collection[str] | None = None) -> Registry:
    """The process's registry, loaded once per ``allowed`` set (entry points do not change while a
    process runs)."""
    cache_key = None if allowed is None else frozenset(allowed)
    with _cache_lock:
        if cache_key not in _cache:
            _cache[cache_key] = discover(allowed)
        return _cache[cache_key]


def clear_cache() -> None:
    """Forget the loaded registries (a process that installed a plugin while running; tests)."""
    with _cache_lock:
        _cache.clear()
    metadata_cache = getattr(metadata, "_cache_clear", None)  # no cache in CPython 3.11's metadata
    if callable(metadata_cache):
        metadata_cache()


def get_reward(key: str) -> RewardDefinition:
    """A reward of this process's registry by key (UnknownReward / UnavailableReward)."""
    return load_registry().get(key)
