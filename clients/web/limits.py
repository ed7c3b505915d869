"""The New Training form's ranges, defaults and choices, asked of the scheduler.

The spec's ranges live in one place, the scheduler's validation (rlvr/jobspec.py and
loopspec.py), and the console imports no service code. So it asks, through two things the
contract already promises:

- a `CreateJob` dry run of an empty spec answers the resolved spec: every default filled in
  (`CreateLoop` dry run: the loop's defaults, including each benchmark's default score column);
- a bad value is INVALID_ARGUMENT naming the field, the value and the allowed range, in one
  format (`rlvr/common/errors.py: out_of_range`): `grpo.lora_rank: 0 is out of range; allowed:
  4-64 (default 8)`. One dry run per field with a value no range admits answers that field's
  range in the server's own words; enum fields answer their choices with the display names
  (`1 (Math Pairs (synthetic)), 2 (GSM8K accuracy), ...`).

About twenty dry runs (milliseconds each, nothing created), cached for a few minutes. The words
come back verbatim as the field's hint ("allowed: 4-64 (default 8)"); the numbers parsed out of
them become the inputs' min/max. A field whose answer does not parse keeps its hint and loses only
the client-side range check: the server validates every submit anyway, and its error is shown next
to the field (tests/test_web_app.py checks the parse against jobspec.py's constants).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from google.protobuf.message import Message

from rlvr.peers.base import RlvrError
from rlvr.v1 import benchmark_pb2 as B
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import reward_pb2 as R
from rlvr.v1 import scheduler_pb2 as S

CACHE_SECONDS = 300.0
RETRY_SECONDS = 10.0  # an answer with problems (the benchmark service down) is asked again sooner

# A value no range of the field admits (`optional` fields: set explicitly, so validated).
JOB_PROBES: list[tuple[str, object]] = [
    ("reward.synthetic_prompts", 0), ("reward.format_bonus_weight", -1.0), ("grpo.group_size", 0),
    ("grpo.max_completion_tokens", 0), ("grpo.lora_rank", 0), ("grpo.lora_alpha", 0),
    ("grpo.learning_rate", -1.0), ("grpo.max_steps", 0), ("grpo.batch_size", 0), ("advanced.epochs", 0),
    ("advanced.kl_beta", -1.0), ("advanced.temperature", -1.0), ("advanced.checkpoint_every", -1),
    ("advanced.lora_init", "?"), ("advanced.gpu_selection", "?"), ("advanced.num_processes", 0),
    ("advanced.precision", "?"),
    ("advanced.lora_init", "?"), ("advanced.gpu_selection", "?"), ("advanced.max_async_steps", -1),
]
ENUM_PROBES = ["advanced.loss_type", "advanced.quantization", "advanced.generation_backend"]
LOOP_PROBES: list[tuple[str, object]] = [("max_rounds", 0), ("give_up_after", 0), ("min_gain", -1.0)]
COLOCATE_FIELDS = ("advanced.gpu_memory_fraction",)  # validated only with the vLLM (colocate) backend

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
        if path in COLOCATE_FIELDS:
            return ""
        value = get_path(self.job_defaults, path)
        if isinstance(value, bool):
            return "on" if value else ""
        if isinstance(value, float):
            return f"{value:.6g}"
        return str(value)


def _invalid(call: Callable[[], object]) -> str | None:
    """The INVALID_ARGUMENT message of a dry run, or None when the call succeeded."""
    try:
        call()
    except RlvrError as e:
        if e.code.name == "INVALID_ARGUMENT":
            return e.details
        raise
    return None


def ask(scheduler, benchmark) -> FormLimits:  # noqa: ANN001 (SDK clients, or test fakes)
    """Asks the scheduler (and the benchmark service, for the benchmarks) everything the forms show.
    Raises RlvrError when the scheduler cannot be reached."""
    resolved = scheduler.create_job(S.CreateJobRequest(spec=C.JobSpec(), dry_run=True)).resolved_spec
    out = FormLimits(job_defaults=resolved)

    def job_probe(path: str, value: object, backend: int = 0) -> str | None:
        spec = C.JobSpec()
        if backend:
            spec.advanced.generation_backend = backend
        set_path(spec, path, value)
        return _invalid(lambda: scheduler.create_job(S.CreateJobRequest(spec=spec, dry_run=True)))

    for path, value in JOB_PROBES:
        message = job_probe(path, value)
        limit = parse_allowed(path, message) if message else None
        if limit is not None:
            out.limits[path] = limit
    for path in COLOCATE_FIELDS:
        message = job_probe(path, -1.0, C.GENERATION_BACKEND_VLLM_COLOCATE)
        limit = parse_allowed(path, message) if message else None
        if limit is not None:
            out.limits[path] = limit
    for path in ENUM_PROBES:
        message = job_probe(path, 99)
        choices = parse_choices(message) if message else []
        if choices:
            out.choices[path] = choices

    try:
        out.rewards = list(scheduler.list_reward_functions(R.ListRewardFunctionsRequest()).functions)
        out.choices["reward.key"] = [(r.key, r.display_name) for r in out.rewards]  # type: ignore[misc]
    except RlvrError as e:
        out.problems.append(f"the rewards could not be listed ({e.code.name}): {e.details}")
    try:
        out.benchmarks = list(benchmark.list_benchmarks().benchmarks)
    except RlvrError as e:
        out.problems.append(f"the benchmark service did not answer ({e.code.name}): no loop or benchmark choices")
    try:
        base = S.LoopSpec(target=50.0)
        out.loop_defaults = scheduler.create_loop(S.CreateLoopRequest(spec=base, dry_run=True)).resolved_spec
        for path, value in LOOP_PROBES:
            spec = S.LoopSpec(target=50.0)
            set_path(spec, path, value)
            message = _invalid(lambda spec=spec: scheduler.create_loop(S.CreateLoopRequest(spec=spec, dry_run=True)))
            limit = parse_allowed(path, message) if message else None
            if limit is not None:
                out.limits[f"loop.{path}"] = limit
        message = _invalid(lambda: scheduler.create_loop(S.CreateLoopRequest(spec=S.LoopSpec(target=-1.0),
                                                                             dry_run=True)))
        if message and "; allowed: " in message:
            # "a percent in (0, 100], ...": the bounds for the input, the words for the hint
            allowed = message.partition("; allowed: ")[2]
            out.limits["loop.target"] = Limit("loop.target", allowed, low=0.0, high=100.0)
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
