"""The New Training form's ranges, defaults and choices.

The job spec's fields are declared once, in rlvr/jobspec/fields.py's table (`SPEC_FIELDS`), which the
console imports (it is the shared domain, not service code): each field's allowed values in the
words its INVALID_ARGUMENT uses ("4-64 (default 8)") become its hint, its numbers the inputs'
min/max, its choices the selects' options. The scheduler is asked only what the table cannot
know: the resolved spec of an empty dry run (CreateJob's, and CreateLoop's: each benchmark's
default column), the rewards the reward service has and the benchmarks. The loop's own ranges are
declared beside the table too (loopspec.py validates with them). Cached for a few minutes. The
server validates every submit anyway, and its errors are shown next to their fields.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from google.protobuf.message import Message

from rlvr.jobspec import (
    BATCH_SIZES,
    GIVE_UP_AFTER,
    MAX_ROUNDS,
    MAX_STEPS_HIGH,
    MIN_GAIN,
    MIN_GAIN_ALLOWED,
    SPEC_FIELDS,
    TARGET,
    TARGET_ALLOWED,
    SpecField,
)
from rlvr.peers.base import RlvrError
from rlvr.v1 import benchmark_pb2 as B
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import reward_pb2 as R
from rlvr.v1 import scheduler_pb2 as S

CACHE_SECONDS = 300.0
RETRY_SECONDS = 10.0  # an answer with problems (the benchmark service down) is asked again sooner


_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e[+-]?\d+)?", re.IGNORECASE)
_DEFAULT = re.compile(r"\s*\(default ([^)]*)\)")
_CHOICE = re.compile(r"(-?\d+) \((.+?)\)(?=, -?\d+ \(|$)")
_WORDS = re.compile(r'"[^"]*"(?:,? (?:or )?"[^"]*")*')  # '"default" or "gaussian"': a closed word list


@dataclass(frozen=True)
class Limit:
    """One field's allowed values, as the server words them and as numbers for the input."""

    path: str
    allowed: str                      # verbatim: "4-64 (default 8)"
    low: float | None = None          # min / max of the input (None: no client-side check)
    high: float | None = None
    default: str = ""
    choices: tuple[str, ...] = ()     # "one of 1, 2, 4, ..." -> ("1", "2", "4", ...)

    def check(self, value: float) -> bool:
        """True when `value` is allowed as far as the parsed numbers tell."""
        if self.choices:
            return f"{value:g}" in self.choices
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)


def parse_allowed(path: str, message: str) -> Limit | None:
    """The Limit of an INVALID_ARGUMENT message in the contract's format; None when it is not one."""
    head, sep, allowed = message.partition("; allowed: ")
    if not sep or not head.startswith(f"{path}:"):
        return None
    allowed = allowed.strip()
    default_match = _DEFAULT.search(allowed)
    default = default_match.group(1).strip().strip('"') if default_match else ""
    body = _DEFAULT.sub("", allowed)
    if body.startswith("one of "):
        choices = tuple(c.strip() for c in body.removeprefix("one of ").split(","))
        return Limit(path, allowed, default=default, choices=choices)
    if _WORDS.fullmatch(body):
        return Limit(path, allowed, default=default, choices=tuple(re.findall(r'"([^"]*)"', body)))
    numbers = [float(n) for n in _NUMBER.findall(re.sub(r'"[^"]*"', "", body))]  # not quoted examples ("0,1")
    if len(numbers) < 2:  # a pattern or a word list ("auto", "cpu", ...): the words only
        return Limit(path, allowed, default=default)
    return Limit(path, allowed, low=min(numbers), high=max(numbers), default=default)


def parse_choices(message: str) -> list[tuple[int, str]]:
    """`1 (grpo), 2 (dapo)` -> [(1, "grpo"), (2, "dapo")] from an enum field's error message."""
    _, _, allowed = message.partition("; allowed: ")
    return [(int(n), label) for n, label in _CHOICE.findall(allowed.strip())]


def set_path(message: Message, path: str, value: object) -> None:
    """Sets `a.b.c` on a message (sub-messages created on the way)."""
    *parents, name = path.split(".")
    for part in parents:
        message = getattr(message, part)
    setattr(message, name, value)


def get_path(message: Message, path: str) -> object:
    *parents, name = path.split(".")
    for part in parents:
        message = getattr(message, part)
    return getattr(message, name)


def has_path(message: Message, path: str) -> bool:
    *parents, name = path.split(".")
    for part in parents:
        message = getattr(message, part)
    field_desc = message.DESCRIPTOR.fields_by_name[name]
    return message.HasField(name) if field_desc.has_presence else bool(getattr(message, name))


@dataclass
class FormLimits:
    """What the New Training and loop forms show: defaults, ranges, choices, benchmarks."""

    job_defaults: C.JobSpec                       # a dry run's resolved spec of an empty JobSpec
    limits: dict[str, Limit] = field(default_factory=dict)
    choices: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    loop_defaults: S.LoopSpec | None = None       # None: the benchmark service did not answer
    benchmarks: list[B.BenchmarkInfo] = field(default_factory=list)
    rewards: list[R.RewardFunctionInfo] = field(default_factory=list)  # the Reward choices (ListRewardFunctions)
    models: list[S.ModelInfo] = field(default_factory=list)  # the Base model suggestions (ListModels)
    problems: list[str] = field(default_factory=list)  # what could not be asked, for the page

    def reward(self, key: str) -> R.RewardFunctionInfo | None:
        """The chosen reward's declaration ("" = the default, the first listed)."""
        key = key or self.job_defaults.reward.key
        return next((r for r in self.rewards if r.key == key), None)

    def default_text(self, path: str) -> str:
        """The form's initial value of a job field: the default the server names for the field
        ("(default 4)"), else its value in the dry run's resolved spec. The named one comes first:
        the resolved spec has the batch size already rounded (4 against group 8 resolves to 8)."""
        limit = self.limits.get(path)
        if limit is not None and limit.default:
            return limit.default
        value = get_path(self.job_defaults, path)
        if isinstance(value, Mapping):  # a map field (environment.settings): KEY=VALUE pairs
            return ", ".join(f"{k}={v}" for k, v in sorted(value.items()))
        if isinstance(value, bool):
            return "on" if value else ""
        if isinstance(value, float):
            return f"{value:.6g}"
        return str(value)


def limit_of(row: SpecField) -> Limit | None:
    """A job field's Limit, from its row in rlvr/jobspec/fields.py's table (None: nothing to check or say)."""
    allowed = row.allowed()
    if row.names or not allowed:
        return None
    if row.range is not None:
        return Limit(row.path, allowed, low=row.range.low, high=row.range.high, default=row.default_text())
    if row.choices:
        return Limit(row.path, allowed, default=row.default_text(), choices=row.choices)
    if row.path == "grpo.batch_size":
        return Limit(row.path, allowed, default=row.default_text(), choices=tuple(map(str, BATCH_SIZES)))
    if row.path == "grpo.max_steps":
        return Limit(row.path, allowed, low=-1, high=MAX_STEPS_HIGH, default=row.default_text())
    return Limit(row.path, allowed, default=row.default_text() if row.kind != "text" else "")


def ask(scheduler, benchmark) -> FormLimits:  # noqa: ANN001 (SDK clients, or test fakes)
    """Asks the scheduler (and the benchmark service, for the benchmarks) everything the forms show.
    Raises RlvrError when the scheduler cannot be reached."""
    resolved = scheduler.create_job(S.CreateJobRequest(spec=C.JobSpec(), dry_run=True)).resolved_spec
    out = FormLimits(job_defaults=resolved)

    for row in SPEC_FIELDS:
        limit = limit_of(row)
        if limit is not None:
            out.limits[row.path] = limit
        if row.names:
            out.choices[row.path] = list(row.names.items())  # type: ignore[arg-type]

    try:
        out.rewards = list(scheduler.list_reward_functions(R.ListRewardFunctionsRequest()).functions)
        out.choices["reward.key"] = [(r.key, r.display_name) for r in out.rewards]  # type: ignore[misc]
    except RlvrError as e:
        out.problems.append(f"the rewards could not be listed ({e.code.name}): {e.details}")
    try:
        out.models = list(scheduler.list_models(S.ListModelsRequest()).models)
    except RlvrError as e:
        out.problems.append(f"the models could not be listed ({e.code.name}): {e.details}")
    try:
        out.benchmarks = list(benchmark.list_benchmarks().benchmarks)
    except RlvrError as e:
        out.problems.append(f"the benchmark service did not answer ({e.code.name}): no loop or benchmark choices")
    try:
        base = S.LoopSpec(target=50.0)
        out.loop_defaults = scheduler.create_loop(S.CreateLoopRequest(spec=base, dry_run=True)).resolved_spec
        for name, rng in (("max_rounds", MAX_ROUNDS), ("give_up_after", GIVE_UP_AFTER)):
            out.limits[f"loop.{name}"] = Limit(f"loop.{name}", f"{rng.text()} (default {rng.default})", low=rng.low,
                                               high=rng.high, default=str(rng.default))
        out.limits["loop.min_gain"] = Limit("loop.min_gain", MIN_GAIN_ALLOWED, low=MIN_GAIN[0], high=MIN_GAIN[1])
        out.limits["loop.target"] = Limit("loop.target", TARGET_ALLOWED, low=TARGET[0], high=TARGET[1])
    except RlvrError as e:
        if e.code.name not in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
            raise
        out.problems.append(f"loops cannot be configured now: {e.details}")
    return out


class LimitsCache:
    """`ask` once per CACHE_SECONDS (thread-safe); a failed ask is not cached."""

    def __init__(self, scheduler, benchmark, ttl: float = CACHE_SECONDS) -> None:  # noqa: ANN001
        self._scheduler, self._benchmark, self._ttl = scheduler, benchmark, ttl
        self._lock = threading.Lock()
        self._value: FormLimits | None = None
        self._at = 0.0

    def get(self) -> FormLimits:
        with self._lock:
            ttl = RETRY_SECONDS if self._value is not None and self._value.problems else self._ttl
            if self._value is None or time.monotonic() - self._at >= ttl:
                self._value = ask(self._scheduler, self._benchmark)
                self._at = time.monotonic()
            assert self._value is not None
            return self._value
