"""Turning a RunEvaluationRequest into a checked plan, before anything is generated.

Every way a request can be wrong is found here, so a bad one costs no generation and leaves no
evaluation behind: the benchmark name, the ranges of limit and sampling, the dataset (the reward
service reads it and names the columns it found), the base model (it must be the rollout service's
own) and the adapter (it must be live on the rollout service, or a local PEFT folder to upload).
Errors are the contract's: InvalidArgument naming field, value and range; NotFound for an adapter
the rollout service does not hold; FailedPrecondition for a model it does not serve.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import tempfile
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from rlvr.adapters import ADAPTER_FILES, ADAPTER_NAME_RE
from rlvr.common import paths
from rlvr.common.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Violations,
    bounded,
    out_of_range,
    shown,
)
from rlvr.heads import head_key, read_head
from rlvr.jobspec import (
    EPISODE_TOKENS_PER_TURN,
    MAX_COMPLETION,
    MAX_DATASET_CHARS,
    MAX_ENVIRONMENT_SETTINGS,
    MAX_EPISODE_TOKENS,
    MAX_LABEL_CHARS,
    MAX_MODEL_CHARS,
    MAX_NAME_CHARS,
    MAX_PATH_CHARS,
    MAX_SETTING_CHARS,
    MAX_SPLIT_CHARS,
    MAX_TURNS,
    SEED_MAX,
    SETTING_KEY_RE,
)
from rlvr.models import bare_to_folder, is_tiny
from rlvr.peers.types import AdapterTag, Sampling, sampling_controls
from rlvr.rewards.registry import Catalog
from rlvr.services.benchmark.catalog import Benchmark, RewardName, benchmarks_of, get_benchmark
from rlvr.services.benchmark.episodes import EnvironmentPlan, TokenGenerator
from rlvr.services.benchmark.runner import Generator, Question, Scorer
from rlvr.tasks import (
    COMPACT_STYLE,
    FULL_STYLE,
    Problem,
    PromptStyle,
    model_dir_prompt_style,
    prompt_messages,
)
from rlvr.tiny import default_model_dir
from rlvr.v1 import benchmark_pb2, common_pb2

log = logging.getLogger("rlvr.benchmark")

# RunEvaluationRequest.environment: the ranges of a job's (JobSpec.environment)
ENVIRONMENT_MAX_TURNS = (MAX_TURNS.low, MAX_TURNS.high)
ENVIRONMENT_EPISODE_TOKENS = (MAX_EPISODE_TOKENS.low, MAX_EPISODE_TOKENS.high)
MAX_TOKENS = (MAX_COMPLETION.low, MAX_COMPLETION.high)  # the spec's Max Completion range, the rollout service's
DEFAULT_MAX_TOKENS = MAX_COMPLETION.default


@dataclass(frozen=True)
class RolloutModel:
    model: str  # as the rollout service names it (hub id, path or tiny name)
    max_model_len: int
    address: str


class Peers(Protocol):
    """What an evaluation needs from the rest of the stack (the rollout and reward services)."""

    generator: Generator
    scorer: Scorer
    token_generator: TokenGenerator  # an evaluation with an environment: one turn at a time, token ids in


    async def rollout_model(self) -> RolloutModel: ...

    async def live_adapters(self) -> dict[str, int]:
        """Adapter name -> live version on the rollout service."""
        ...

    async def upload_adapter(self, name: str, version: int, directory: Path) -> int:
        """Uploads a PEFT folder as `version` of `name`; returns the version now live."""
        ...

    async def problems(self, function: RewardName, limit: int, dataset: str, split: str) -> list[Problem]:
        """The benchmark's questions (the held-out split), the first `limit` (0 = all)."""
        ...

    async def fetch_adapter(self, path: str, directory: Path) -> str | None:
        """The adapter folder `path` on the trainer worker that holds it (no shared disk), written
        into `directory`; returns that worker's address, None when none of them has it."""
        ...

    async def rewards(self, names: Collection[str] = ()) -> Catalog:
        """The rewards the reward service has (each makes a benchmark, catalog.py), asked again when a
        cached list lacks one of `names` (reward keys or benchmark names)."""
        ...


@dataclass(frozen=True)
class Plan:
    benchmark: Benchmark
    model: str
    adapter: AdapterTag
    sampling: Sampling
    limit: int
    label: str
    questions: tuple[Question, ...]
    question_set: str = ""  # Evaluation.question_set: which questions, as an id (`question_set_id`)
    dataset: str = ""  # the boxed benchmark's dataset and split, as asked
    dataset_split: str = ""
    environment: EnvironmentPlan | None = None  # the questions run as episodes in it

    @property
    def environment_proto(self) -> common_pb2.EnvironmentConfig | None:
        """Evaluation.environment: as it ran (its version, the resolved limits); None without one."""
        e = self.environment
        if e is None:
            return None
        return common_pb2.EnvironmentConfig(key=e.key, settings=dict(e.settings), max_turns=e.max_turns,
                                            max_episode_tokens=e.max_episode_tokens, version=e.version)

    @property
    def sampling_proto(self) -> common_pb2.SamplingParams:
        return self.sampling.to_proto()


def check_sampling(request: benchmark_pb2.RunEvaluationRequest, v: Violations | None = None) -> Sampling:
    """The request's sampling; every bad field at once (added to `v`, else raised)."""
    own = v is None
    v = Violations() if v is None else v
    sp = request.sampling
    if not 0.0 <= sp.temperature <= 2.0:
        v.add(out_of_range("sampling.temperature", sp.temperature, "0.0-2.0 (0 = greedy, the default)"))
    top_p = sp.top_p or 1.0
    if not 0.0 < top_p <= 1.0:
        v.add(out_of_range("sampling.top_p", sp.top_p, "(0, 1] (0 = 1.0)"))
    top_k, min_p, repetition_penalty = sampling_controls(sp, v)
    max_tokens = sp.max_tokens or DEFAULT_MAX_TOKENS
    if not MAX_TOKENS[0] <= max_tokens <= MAX_TOKENS[1]:
        v.add(out_of_range("sampling.max_tokens", sp.max_tokens, f"{MAX_TOKENS[0]}-{MAX_TOKENS[1]} (0 = 256)"))
    # The request's own seed wins; sampling.seed is accepted for callers that fill SamplingParams only.
    seed = request.seed or (sp.seed if sp.HasField("seed") else 0)
    if seed > SEED_MAX:
        field = "seed" if request.seed else "sampling.seed"
        v.add(out_of_range(field, seed, f"0-{SEED_MAX} (a signed 64-bit integer, as the evaluation is stored)"))
    if own:
        v.raise_any()
    return Sampling(temperature=sp.temperature, top_p=top_p, max_tokens=max_tokens, seed=seed, top_k=top_k,
                    min_p=min_p, repetition_penalty=repetition_penalty)


def check_static(request: benchmark_pb2.RunEvaluationRequest, benchmarks: Mapping[str, Benchmark] | None = None
                 ) -> tuple[Benchmark, Sampling]:
    """The checks that need no other service (`benchmarks`: those the reward service's rewards make;
    default this process's)."""
    for field, value, limit in (("model", request.model, MAX_MODEL_CHARS), ("benchmark", request.benchmark, MAX_NAME_CHARS),
                                ("adapter.name", request.adapter.name, MAX_NAME_CHARS),
                                ("dataset", request.dataset, MAX_DATASET_CHARS),
                                ("dataset_split", request.dataset_split, MAX_SPLIT_CHARS),
                                ("label", request.label, MAX_LABEL_CHARS),
                                ("adapter_path", request.adapter_path, MAX_PATH_CHARS)):
        bounded(field, value, limit)
    v = Violations()  # every bad field, refused at once
    benchmark: Benchmark | None = None
    with v.check():
        benchmark = get_benchmark(request.benchmark, benchmarks)
    if request.limit < 0:
        v.add(out_of_range("limit", request.limit, ">= 0 (0 = the whole benchmark)"))
    elif benchmark is not None and benchmark.size and request.limit > benchmark.size:
        v.add(out_of_range("limit", request.limit, f"0-{benchmark.size} ({benchmark.name} has {benchmark.size} "
                                                   "questions)"))
    if benchmark is not None and benchmark.needs_dataset and not request.dataset.strip():
        v.add(InvalidArgument(f"dataset: required for the {benchmark.name} benchmark (a hub dataset or a local "
                              "JSONL/Parquet/CSV file with prompt and ground_truth columns)"))
    if benchmark is not None and not benchmark.takes_dataset and (request.dataset or request.dataset_split):
        given = "dataset" if request.dataset else "dataset_split"
        takers = ", ".join(b.name for b in (benchmarks or {}).values() if b.takes_dataset) or "boxed"
        v.add(InvalidArgument(f"{given}: {shown(getattr(request, given))} given, but only a benchmark that takes a "
                              f"dataset does ({takers}); {benchmark.name} has its own questions"))
    name = request.adapter.name
    if name and not ADAPTER_NAME_RE.match(name):
        v.add(InvalidArgument(f"adapter.name: {shown(name)} is not a valid name (^[A-Za-z0-9][A-Za-z0-9._-]{{0,127}}$)"))
    if request.adapter.version < 0:
        v.add(out_of_range("adapter.version", request.adapter.version, ">= 0 (0 = the live version)"))
    elif request.adapter.version and not name:
        v.add(InvalidArgument("adapter.version: set without adapter.name"))
    if request.adapter_path and not name:
        v.add(InvalidArgument("adapter.name: required with adapter_path (the name to upload the adapter under)"))
    sampling = check_sampling(request, v)
    check_environment_fields(request.environment, v)
    v.raise_any()
    assert benchmark is not None
    return benchmark, sampling


def check_environment_fields(e: common_pb2.EnvironmentConfig, v: Violations) -> None:
    """RunEvaluationRequest.environment's fields, by the rules of a job's (the key is looked up later)."""
    from rlvr.environments.base import KEY_RE, KEY_RULE

    if not e.key:
        for name in ("max_turns", "max_episode_tokens"):
            if getattr(e, name):
                v.add(InvalidArgument(f"environment.{name}: set without environment.key"))
        if e.settings:
            v.add(InvalidArgument("environment.settings: set without environment.key"))
        return
    if not KEY_RE.match(e.key):
        v.add(InvalidArgument(f"environment.key: {shown(e.key)} is not an environment key ({KEY_RULE})"))
    low, high = ENVIRONMENT_MAX_TURNS
    if e.max_turns and not low <= e.max_turns <= high:
        v.add(out_of_range("environment.max_turns", e.max_turns, f"{low}-{high} (0 = the environment's own)"))
    low, high = ENVIRONMENT_EPISODE_TOKENS
    if e.max_episode_tokens and not low <= e.max_episode_tokens <= high:
        v.add(out_of_range("environment.max_episode_tokens", e.max_episode_tokens,
                           f"{low}-{high} (0 = {EPISODE_TOKENS_PER_TURN} x sampling.max_tokens)"))
    if len(e.settings) > MAX_ENVIRONMENT_SETTINGS:
        v.add(out_of_range("environment.settings", f"{len(e.settings)} settings", f"at most {MAX_ENVIRONMENT_SETTINGS}"))
    for key, value in sorted(e.settings.items()):
        if not SETTING_KEY_RE.match(key):
            v.add(InvalidArgument(f"environment.settings: key {shown(key)} is not allowed (1-64 letters, digits "
                                  "and _, starting with a letter)"))
        elif len(value) > MAX_SETTING_CHARS:
            v.add(InvalidArgument(f"environment.settings[{key}]: {len(value)} characters, over the limit of "
                                  f"{MAX_SETTING_CHARS}"))


def environment_plan(e: common_pb2.EnvironmentConfig, sampling: Sampling) -> EnvironmentPlan | None:
    """The environment the request names, from this process's registry (its episodes run here), its
    limits resolved; None without one. InvalidArgument for an unknown key, FailedPrecondition for
    one that failed to load."""
    if not e.key:
        return None
    from rlvr.environments.registry import UnavailableEnvironment, UnknownEnvironment, get_environment

    try:
        definition = get_environment(e.key)
    except UnknownEnvironment as exc:
        raise InvalidArgument(f"environment.key: {exc}") from None
    except UnavailableEnvironment as exc:
        raise FailedPrecondition(f"environment.key: {exc}") from None
    max_episode_tokens = e.max_episode_tokens or EPISODE_TOKENS_PER_TURN * sampling.max_tokens
    return EnvironmentPlan(definition, dict(e.settings), e.max_turns or definition.max_turns,
                           min(max_episode_tokens, ENVIRONMENT_EPISODE_TOKENS[1]))


def same_model(requested: str, served: str) -> bool:
    """Whether two spellings name one model: equal, or the same local folder (a tiny name is its
    folder under $RLVR_HOME/models, a bare name the folder of that name under the model roots)."""
    if requested == served:
        return True
    a, b = (default_model_dir(m) if is_tiny(m) else Path(bare_to_folder(m)).expanduser() for m in (requested, served))
    return a.is_dir() and b.is_dir() and a.resolve() == b.resolve()


def prompt_style_for(model: str, setting: str) -> PromptStyle:
    """The prompt form the served model expects (see rlvr.tasks.render): the setting when it is not
    "auto", else what the model's folder declares; the tiny models are compact even when their
    folder is on another host."""
    if setting in (COMPACT_STYLE, FULL_STYLE):
        return setting  # narrowed by the membership test
    folder = default_model_dir(model) if is_tiny(model) else Path(bare_to_folder(model)).expanduser()
    if folder.is_dir():
        return model_dir_prompt_style(folder)
    return COMPACT_STYLE if is_tiny(model) else FULL_STYLE


def questions_for(problems: Sequence[Problem], style: PromptStyle, instruction: str | None = None
                  ) -> tuple[Question, ...]:
    return tuple(
        Question(index=i, messages=tuple((m["role"], m["content"]) for m in prompt_messages(p, style, instruction)),
                 ground_truth=p.ground_truth, question=p.question,
                 turns=tuple((m.role, m.content) for m in p.messages or ()), columns=p.columns)
        for i, p in enumerate(problems)
    )


def adapter_folder(path: str, roots: Sequence[Path]) -> Path:
    """The adapter folder named by `adapter_path`, which must lie under one of `roots`."""
    folder = paths.resolve(path)
    allowed = paths.resolve_all(roots)
    if not paths.is_under(folder, allowed):
        # The roots are this server's folders: logged for its operator, never sent to a client.
        log.info("adapter_path %s resolves to %s, outside the adapter roots %s", shown(path), folder,
                 ", ".join(map(str, allowed)) or "(none configured)")
        why = "the allowed adapter roots (the benchmark's adapter_roots setting)" if allowed else \
            "any adapter root: none is configured (the benchmark's adapter_roots setting)"
        raise InvalidArgument(f"adapter_path: {shown(path)} is outside {why}")
    missing = [f for f in ADAPTER_FILES if not (folder / f).is_file()]
    if missing:
        raise InvalidArgument(f"adapter_path: {path!r} is not a PEFT adapter folder (missing {', '.join(missing)})")
    return folder


def refuse_head(folder: Path, path: str) -> None:
    """InvalidArgument when `folder` holds a Head job's adapter: a head scores text, it does not
    generate, so it is no model to evaluate; it is a benchmark's reward instead (head_<job id>)."""
    try:
        head = read_head(folder)
    except ValueError:  # weights that do not read are no head: the upload says what is wrong with them
        return
    if head is not None:  # the job's id from the path asked for (a fetched folder is in a scratch folder here)
        asked = Path(path)
        key = head_key(asked.parent.name) if asked.parent.parent.name == "jobs" else "head_<job id>"
        raise InvalidArgument(
            f"adapter_path: {shown(path)} is a Head job's adapter (a {head.task} head on {head.base_model}): it "
            f"scores text and does not generate; evaluate a policy's adapter, or score with the head as the "
            f"benchmark {key} on a dataset")


async def prepare(
    request: benchmark_pb2.RunEvaluationRequest, peers: Peers, prompt_style: str, adapter_roots: Sequence[Path]
) -> Plan:
    """Every check, the questions, and (last, once nothing else can fail) the adapter upload."""
    catalog = await peers.rewards([request.benchmark] if request.benchmark else [])
    benchmark, sampling = check_static(request, benchmarks_of(catalog))
    with tempfile.TemporaryDirectory(prefix="rlvr-eval-adapter-") as scratch:
        folder = await _adapter_source(request.adapter_path, adapter_roots, peers, Path(scratch)) \
            if request.adapter_path else None
        if folder is not None:
            refuse_head(folder, request.adapter_path)  # this host's, or fetched from a trainer worker
        return await _prepare(request, peers, prompt_style, catalog, benchmark, sampling, folder)


async def _adapter_source(path: str, roots: Sequence[Path], peers: Peers, scratch: Path) -> Path:
    """The folder to upload for `adapter_path`: this host's (under `roots`), else fetched from the
    trainer worker that holds it into `scratch` (removed once the evaluation is prepared)."""
    try:
        return adapter_folder(path, roots)
    except InvalidArgument as e:
        holder = await peers.fetch_adapter(path, scratch / "adapter")
        if holder is None:
            raise InvalidArgument(f"{e}; nor does a trainer worker (the benchmark's trainer_addresses) hold it") \
                from None
        log.info("adapter_path %s fetched from trainer %s", shown(path), holder)
        return scratch / "adapter"


async def _prepare(request: benchmark_pb2.RunEvaluationRequest, peers: Peers, prompt_style: str, catalog: Catalog,
                   benchmark: Benchmark, sampling: Sampling, folder: Path | None) -> Plan:
    rollout = await peers.rollout_model()
    model = request.model or rollout.model
    if not same_model(model, rollout.model):
        raise FailedPrecondition(f"model: {model!r} is not the rollout service's model ({rollout.model!r} at "
                                 f"{rollout.address}); evaluate it on a rollout service started with it")
    if rollout.max_model_len and sampling.max_tokens >= rollout.max_model_len:
        raise out_of_range("sampling.max_tokens", sampling.max_tokens,
                           f"below the rollout service's max_model_len {rollout.max_model_len}")
    # In a thread: the registry waits for a remote environment's server that is down (its wait_seconds).
    environment = await asyncio.to_thread(environment_plan, request.environment, sampling)
    if environment is not None and rollout.max_model_len:
        environment = replace(environment, max_context_tokens=rollout.max_model_len)
    adapter, upload_version = await _check_adapter(request, peers, folder is not None)
    problems = await peers.problems(benchmark.reward_function, request.limit, request.dataset.strip(),
                                    request.dataset_split)
    if not problems:
        raise InvalidArgument(f"dataset: {request.dataset!r} has no questions")
    if folder is not None:
        version = await peers.upload_adapter(adapter.name, upload_version, folder)
        adapter = AdapterTag(adapter.name, version)
    # An environment's instruction (how to call its tools, say) replaces the reward's, as in training.
    instruction = (environment.definition.instruction if environment else "") or \
        catalog.get(benchmark.reward_function).instruction
    return Plan(benchmark=benchmark, model=rollout.model, adapter=adapter, sampling=sampling,
                limit=request.limit, label=request.label,
                questions=questions_for(problems, prompt_style_for(rollout.model, prompt_style), instruction),
                question_set=question_set_id(benchmark.name, problems), dataset=request.dataset.strip(),
                dataset_split=request.dataset_split.strip(), environment=environment)


def question_set_id(benchmark: str, problems: Sequence[Problem]) -> str:
    """"qs-" + 12 hex digits of a SHA-256 over the benchmark's name and each problem (its question
    or conversation, and its ground truth) in order: equal ids, the same questions, whatever
    prompt style asked them (the leaderboard ranks only those together)."""
    digest = hashlib.sha256(benchmark.encode())
    for problem in problems:
        asked = repr(problem.messages) if problem.messages else problem.question
        for part in (asked, problem.ground_truth):
            digest.update(b"\0" + part.encode("utf-8", "surrogatepass"))
    return "qs-" + digest.hexdigest()[:12]


async def _check_adapter(
    request: benchmark_pb2.RunEvaluationRequest, peers: Peers, uploading: bool
) -> tuple[AdapterTag, int]:
    """The adapter that will answer, and the version to upload when `uploading`."""
    name, version = request.adapter.name, request.adapter.version
    if not name:
        return AdapterTag(), 0
    live = await peers.live_adapters()
    if uploading:
        current = live.get(name, 0)
        upload = version or current + 1
        if upload <= current:
            raise FailedPrecondition(f"adapter.version: {upload} is not newer than the live version {current} of "
                                     f"{name!r}; leave it 0 to upload as the next version")
        return AdapterTag(name, upload), upload
    if name not in live:
        loaded = ", ".join(f"{n} v{v}" for n, v in sorted(live.items())) or "none"
        raise NotFound(f"adapter: {name!r} is not loaded on the rollout service (loaded: {loaded}); "
                       "pass adapter_path to upload it")
    if version and version != live[name]:
        raise NotFound(f"adapter.version: {name} v{version} is not live (the live version is {live[name]}; "
                       "older versions are not kept)")
    return AdapterTag(name, live[name]), 0
