"""The peer types: what the trainer, the benchmark and the SDK's users say to the rollout and reward
services, and what they get back, as plain values rather than messages.

- `AdapterTag`: which policy generates (or generated) a completion, an adapter version on the
  rollout service; `BASE_MODEL` is the bare model.
- `Sampling`: how to sample, and how many completions per prompt (the GRPO group).
- `ScoreInput`: one completion to score and what its reward may read (the question, the row's columns).
- `Score`: the reward service's components of one completion.
- The reward catalog (`catalog_of`, `reward_info_proto`): ListRewardFunctions as plain declarations.

With the request builders and readers that both callers share (`generate_request`, `score_request`,
`AdapterTag.of`, `Score.of`), so the two cannot drift in how they speak the contract.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from google.protobuf import json_format, struct_pb2

from rlvr.common.errors import InvalidArgument, Violations, out_of_range
from rlvr.jobspec import REPETITION_PENALTY, REWARD_FUNCTIONS, TOP_K, RewardName
from rlvr.rewards.registry import Catalog, RewardInfo
from rlvr.seeds import offset_seed
from rlvr.tasks.base import Message, Problem
from rlvr.v1 import common_pb2, reward_pb2, rollout_pb2


@dataclass(frozen=True)
class AdapterTag:
    """Which policy generated (or must generate) a completion: an adapter's name and version on the
    rollout service; ("", 0) is the bare base model."""

    name: str = ""
    version: int = 0

    def __str__(self) -> str:
        return f"{self.name} v{self.version}" if self.name else "the base model"

    def selector(self) -> common_pb2.AdapterSelector:
        """The explicit selector: the rollout service refuses (NOT_FOUND) a version that is not live
        rather than answer with another one."""
        return common_pb2.AdapterSelector(name=self.name, version=self.version)

    @classmethod
    def of(cls, completion: rollout_pb2.Completion) -> AdapterTag:
        """The stamp the engine put on a completion: the policy that really produced it."""
        return cls(completion.adapter_name, completion.adapter_version)


BASE_MODEL = AdapterTag("", 0)


@dataclass(frozen=True)
class Sampling:
    """How the rollout service samples (SamplingParams) and how many completions of each prompt it
    returns (GenerateRequest.n). The trainer sets group_size and the job's sampling controls (its
    loss evaluates the whole tempered distribution whatever they are: docs/jobs.md); the benchmark
    answers once per question, greedy by default."""

    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    max_tokens: int = 256
    seed: int | None = None  # None: unseeded
    group_size: int = 1  # completions per prompt
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    repetition_penalty: float = 1.0

    def from_prompt(self, first: int) -> Sampling:
        """This sampling for a part of a request that starts at its prompt `first` (a replica's
        part, a job process's share): the seed moved there (rlvr/seeds.py), so the part's prompts
        are seeded as they are in the whole request, and sample what one server would."""
        if self.seed is None or first == 0:
            return self
        return replace(self, seed=offset_seed(self.seed, first))

    def to_proto(self) -> common_pb2.SamplingParams:
        return common_pb2.SamplingParams(temperature=self.temperature, top_p=self.top_p, seed=self.seed,
                                         max_tokens=self.max_tokens, top_k=self.top_k, min_p=self.min_p,
                                         repetition_penalty=self.repetition_penalty)


def sampling_controls(sp: common_pb2.SamplingParams, v: Violations | None = None) -> tuple[int, float, float]:
    """SamplingParams' top_k, min_p and repetition_penalty (0 = 1.0), each checked against the range
    its proto comment states; every bad one is added to `v`, or without one the first raised. The
    rollout server and the benchmark read a request's controls through this."""
    own = Violations() if v is None else v
    if not 0 <= sp.top_k <= TOP_K.high:
        own.add(out_of_range("sampling.top_k", sp.top_k, f"0-{TOP_K.high} (0 = off)"))
    if not 0.0 <= sp.min_p <= 1.0:
        own.add(out_of_range("sampling.min_p", sp.min_p, "[0, 1] (0 = off)"))
    penalty = sp.repetition_penalty or 1.0
    if not 0.0 < penalty <= REPETITION_PENALTY.high:
        own.add(out_of_range("sampling.repetition_penalty", sp.repetition_penalty,
                             f"(0, {REPETITION_PENALTY.high:g}] (0 = 1.0, off)"))
    if v is None:
        own.raise_any()
    return sp.top_k, sp.min_p, penalty


class _Components(Protocol):
    @property
    def reward(self) -> float: ...
    @property
    def accuracy(self) -> float: ...
    @property
    def format(self) -> float: ...
    @property
    def strict(self) -> bool: ...
    @property
    def extracted_answer(self) -> str | None: ...


@dataclass(frozen=True)
class Score:
    """One completion's score, as the reward service computes it: reward = the job's rewards'
    weighted scores + format_bonus_weight * format (bonus on). The trainer's GRPO advantage uses
    `reward` and its metrics `accuracy`, `format` and `components`; the benchmark also stores
    `strict` (correct, and written exactly as the ground truth in its canonical place) and the
    answer it read. `error`: why it scored 0 although it was scored (a reward's fault)."""

    reward: float
    accuracy: float
    format: float
    strict: bool = False
    extracted_answer: str = ""
    components: Mapping[str, float] = field(default_factory=dict)
    error: str = ""
    note: str = ""

    @classmethod
    def of(cls, components: _Components) -> Score:
        """From a RewardComponents message or a `rlvr.rewards.scoring` result."""
        parts = getattr(components, "components", None) or {}
        return cls(components.reward, components.accuracy, components.format, components.strict,
                   components.extracted_answer or "", dict(parts), getattr(components, "error", "") or "",
                   getattr(components, "note", "") or "")


@dataclass(frozen=True)
class ScoreInput:
    """One completion to score: its ground truth, and what a reward may read besides (the question
    before chat templating, the conversation, the dataset row's other columns)."""

    completion: str
    ground_truth: str
    prompt: str = ""
    messages: tuple[tuple[str, str], ...] = ()
    columns: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, completion: str, problem: Problem) -> ScoreInput:
        return cls(completion, problem.ground_truth, problem.question,
                   tuple((m.role, m.content) for m in problem.messages or ()), problem.columns)

    def to_proto(self) -> reward_pb2.ScoreItem:
        return reward_pb2.ScoreItem(
            completion=self.completion, ground_truth=self.ground_truth, prompt=self.prompt,
            messages=[common_pb2.ChatMessage(role=r, content=c) for r, c in self.messages],
            columns=columns_proto(self.columns))


def _plain(value: Any) -> Any:
    """A decoded JSON value with whole numbers as ints (protobuf's Value holds every number as a
    double: a row's 3 arrives as 3.0)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def columns_proto(columns: Mapping[str, Any]) -> dict[str, struct_pb2.Value]:
    """A row's columns (JSON-like values) as the contract's map<string, Value>."""
    return {str(k): json_format.ParseDict(v, struct_pb2.Value()) for k, v in columns.items()}


def columns_of(columns: Mapping[str, struct_pb2.Value], field: str = "columns") -> dict[str, Any]:
    """The contract's map<string, Value> as plain values (the inverse of `columns_proto`).

    A value is JSON, which holds no NaN or infinity (a Value can carry one, a JSON row cannot):
    InvalidArgument naming `field`.<key> of every such column, with the number."""
    bad = [(key, _non_finite(value)) for key, value in sorted(columns.items())]
    errors = [out_of_range(f"{field}.{key}", number, "a finite number (a column is JSON, which has no NaN "
                           "or infinity)") for key, number in bad if number is not None]
    if errors:
        raise InvalidArgument("\n".join(str(e) for e in errors), [v for e in errors for v in e.violations])
    return {k: _plain(json_format.MessageToDict(v)) for k, v in columns.items()}


def _non_finite(value: struct_pb2.Value) -> float | None:
    """The first NaN or infinite number in `value` (a list's or a struct's too), or None."""
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        return None if math.isfinite(value.number_value) else value.number_value
    inner = (value.list_value.values if kind == "list_value"
             else value.struct_value.fields.values() if kind == "struct_value" else ())
    return next((n for n in map(_non_finite, inner) if n is not None), None)


def problem_of(message: reward_pb2.Problem, key: str) -> Problem:
    """A GetProblems problem of the reward `key` as the task type."""
    return Problem(id=message.id, task=key, question=message.question, ground_truth=message.ground_truth,
                   compact=message.compact or None,
                   messages=tuple(Message(m.role, m.content) for m in message.messages) or None,
                   columns=columns_of(message.columns))


def problem_proto(problem: Problem) -> reward_pb2.Problem:
    return reward_pb2.Problem(
        id=problem.id, question=problem.question, ground_truth=problem.ground_truth, compact=problem.compact or "",
        messages=[common_pb2.ChatMessage(role=m.role, content=m.content) for m in problem.messages or ()],
        columns=columns_proto(problem.columns))


def reward_info_proto(info: RewardInfo) -> reward_pb2.RewardFunctionInfo:
    return reward_pb2.RewardFunctionInfo(
        function=REWARD_FUNCTIONS.get(info.key, common_pb2.REWARD_FUNCTION_UNSPECIFIED), key=info.key,
        display_name=info.display_name, description=info.description, needs_dataset=info.needs_dataset,
        accepts_dataset=info.accepts_dataset, columns=info.columns, default_benchmark=info.benchmark,
        benchmark_display_name=info.benchmark_title, instruction=info.instruction, source=info.source,
        splits=info.splits, heldout_size=info.heldout_size, dataset_names=info.dataset_names)


def reward_info_of(message: reward_pb2.RewardFunctionInfo, order: int = 1000) -> RewardInfo:
    return RewardInfo(
        key=message.key, display_name=message.display_name, description=message.description,
        needs_dataset=message.needs_dataset, accepts_dataset=message.accepts_dataset, columns=tuple(message.columns),
        default_benchmark=message.default_benchmark, benchmark_display_name=message.benchmark_display_name,
        instruction=message.instruction, splits=tuple(message.splits), heldout_size=message.heldout_size,
        dataset_names=tuple(message.dataset_names), source=message.source, order=order)


def catalog_of(response: reward_pb2.ListRewardFunctionsResponse) -> Catalog:
    """ListRewardFunctions as a Catalog, in the order the service lists them."""
    return Catalog({f.key: reward_info_of(f, i) for i, f in enumerate(response.functions)},
                   {u.key: u.error for u in response.unavailable})


def catalog_proto(catalog: Catalog) -> reward_pb2.ListRewardFunctionsResponse:
    return reward_pb2.ListRewardFunctionsResponse(
        functions=[reward_info_proto(i) for i in catalog.infos()],
        unavailable=[reward_pb2.UnavailableReward(key=k, error=e) for k, e in sorted(catalog.failed.items())])


def token_prompt(ids: Sequence[int]) -> rollout_pb2.Prompt:
    """A prompt already tokenized (the trainer's: the engine must see the ids the loss sees)."""
    return rollout_pb2.Prompt(token_ids=rollout_pb2.TokenIds(ids=ids))


def chat_prompt(messages: Iterable[tuple[str, str]]) -> rollout_pb2.Prompt:
    """A prompt as (role, content) chat turns, rendered by the rollout service's chat template."""
    return rollout_pb2.Prompt(messages=rollout_pb2.ChatMessages(
        messages=[common_pb2.ChatMessage(role=role, content=content) for role, content in messages]))


def generate_request(
    prompts: Sequence[rollout_pb2.Prompt], sampling: Sampling, adapter: AdapterTag, request_id: str = ""
) -> rollout_pb2.GenerateRequest:
    """`sampling.group_size` completions of each prompt from exactly `adapter` (its explicit version)."""
    return rollout_pb2.GenerateRequest(prompts=prompts, n=sampling.group_size, sampling=sampling.to_proto(),
                                       adapter=adapter.selector(), request_id=request_id)


def score_request(
    function: RewardName,
    items: Iterable[tuple[str, str] | ScoreInput],
    *,
    format_bonus: bool | None = None,
    format_bonus_weight: float | None = None,
    terms: Sequence[tuple[str, float]] = (),
    accuracy_key: str = "",
) -> reward_pb2.ScoreRequest:
    """A Score call for (completion, ground truth) pairs or ScoreInputs with the reward `function`
    (a key: "math_pairs", a plugin's, ...), or several rewards combined (`terms`: (key, weight), the
    first is `function`); the format bonus and its weight are the service's defaults unless given."""
    return reward_pb2.ScoreRequest(
        function=REWARD_FUNCTIONS.get(function, common_pb2.REWARD_FUNCTION_UNSPECIFIED),
        key=function,
        items=[(i if isinstance(i, ScoreInput) else ScoreInput(*i)).to_proto() for i in items],
        format_bonus=format_bonus,
        format_bonus_weight=format_bonus_weight,
        terms=[common_pb2.RewardTerm(key=k, weight=w) for k, w in terms] if len(terms) > 1 else [],
        accuracy_key=accuracy_key,
    )
