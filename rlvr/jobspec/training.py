"""The GRPO and advanced options checked, and the step count they give."""

from __future__ import annotations

import math

from rlvr.common.errors import InvalidArgument, Violations, out_of_range
from rlvr.jobspec.fields import (
    FIELDS_BY_PATH,
    SAMPLING_PATHS,
    _checked,
    _enum,
    _float,
    _int,
    reshaped_sampling,
)
from rlvr.jobspec.ranges import (
    BACKEND_NAMES,
    BATCH_SIZE_DEFAULT,
    BATCH_SIZES,
    CHECKPOINTING_CHOICES,
    CLIPPED_LOSSES,
    EPSILON_HIGH,
    EVAL_SIZE,
    GPU_MEMORY_FRACTION,
    GPU_SELECTION_RE,
    LORA_INITS,
    LOSS_NAMES,
    MAX_ASYNC_STEPS,
    MAX_STEPS_DEFAULT,
    MAX_STEPS_HIGH,
    MINI_BATCHES,
    NUM_NODES,
    NUM_PROCESSES,
    OWN_BOUNDS,
    PRECISIONS,
    QUANT_NAMES,
    SHARDINGS,
    C,
    one_update_per_step,
)
from rlvr.rewards.registry import Catalog, load_registry
from rlvr.v1 import common_pb2


def _validate_grpo(spec: common_pb2.JobSpec, warnings: list[str], v: Violations) -> None:
    g = spec.grpo
    _checked(spec, "grpo", v)
    if not g.HasField("max_steps"):
        g.max_steps = MAX_STEPS_DEFAULT
    elif g.max_steps != -1 and not 1 <= g.max_steps <= MAX_STEPS_HIGH:
        v.add(out_of_range("grpo.max_steps", g.max_steps,
                           f"-1 (Full) or 1-{MAX_STEPS_HIGH} (default {MAX_STEPS_DEFAULT})"))
    if not g.HasField("batch_size"):
        g.batch_size = BATCH_SIZE_DEFAULT
    elif g.batch_size not in BATCH_SIZES:
        v.add(out_of_range("grpo.batch_size", g.batch_size,
                           f"one of {', '.join(map(str, BATCH_SIZES))} (default {BATCH_SIZE_DEFAULT})"))
    if v.bad("grpo.group_size", "grpo.batch_size"):
        return
    group = g.group_size
    if g.batch_size % group != 0:
        rounded = math.ceil(g.batch_size / group) * group
        warnings.append(f"grpo.batch_size {g.batch_size} rounded up to {rounded}, a multiple of "
                        f"grpo.group_size {group}")
        g.batch_size = rounded


def _validate_advanced(spec: common_pb2.JobSpec, warnings: list[str], v: Violations) -> None:
    a = spec.advanced
    with v.check():
        _enum(a, "loss_type", "advanced.loss_type", LOSS_NAMES, C.LOSS_TYPE_GRPO)
    with v.check():
        _enum(a, "quantization", "advanced.quantization", QUANT_NAMES, C.QUANTIZATION_FULL)
    with v.check():
        _enum(a, "generation_backend", "advanced.generation_backend", BACKEND_NAMES, C.GENERATION_BACKEND_VLLM)
    backend = a.generation_backend
    with v.check():
        _validate_memory(a, backend)
    a.gpu_selection = a.gpu_selection.strip() or "auto"
    if not v.bad("advanced.gpu_selection") and not GPU_SELECTION_RE.match(a.gpu_selection):
        v.add(out_of_range("advanced.gpu_selection", a.gpu_selection,
                           '"auto", "cpu", or a comma list of device indices such as "0,1"'))
    _validate_processes(spec, backend, v)
    _checked(spec, "advanced", v)
    _validate_updates(spec, warnings, v)
    reshaped = reshaped_sampling(a)
    if reshaped and backend == C.GENERATION_BACKEND_TRANSFORMERS and not v.bad(*SAMPLING_PATHS):
        warnings.append(f"advanced.{', '.join(reshaped)}: the Transformers backend reports no sampling logprobs, so "
                        "the loss, which scores the whole tempered policy, is not importance-corrected for the "
                        "reshaped distribution (a vLLM backend corrects it)")
    if not a.HasField("seed"):
        a.seed = 0
    with v.check():
        _validate_async(a, backend)
    a.lora_init = a.lora_init.strip() or "default"
    if a.lora_init not in LORA_INITS and not v.bad("advanced.lora_init"):
        v.add(out_of_range("advanced.lora_init", a.lora_init, " or ".join(f'"{x}"' for x in LORA_INITS) +
                           ' (default "default")'))
    with v.check():
        _validate_sharding(a, v)
    a.precision = a.precision.strip() or PRECISIONS[0]
    if a.precision not in PRECISIONS and not v.bad("advanced.precision"):
        v.add(out_of_range("advanced.precision", a.precision, FIELDS_BY_PATH["advanced.precision"].allowed()))
    a.gradient_checkpointing = a.gradient_checkpointing.strip() or CHECKPOINTING_CHOICES[0]
    if a.gradient_checkpointing not in CHECKPOINTING_CHOICES and not v.bad("advanced.gradient_checkpointing"):
        v.add(out_of_range("advanced.gradient_checkpointing", a.gradient_checkpointing,
                           FIELDS_BY_PATH["advanced.gradient_checkpointing"].allowed()))


# What each loss does when a step makes one optimizer step over its batch (the ratio is exactly 1).
ON_POLICY_EQUIVALENT = {"gspo": "grpo", "cispo": "dapo", "sapo": "grpo"}


def _validate_updates(spec: common_pb2.JobSpec, warnings: list[str], v: Violations) -> None:
    """advanced.num_iterations, mini_batches and epsilon_high against the loss and the batch."""
    a, g = spec.advanced, spec.grpo
    loss = LOSS_NAMES.get(a.loss_type, "")
    changed = abs(a.epsilon_high - EPSILON_HIGH.default) > 1e-6
    if loss in OWN_BOUNDS and changed and not v.bad("advanced.epsilon_high"):
        v.add(InvalidArgument(f"advanced.epsilon_high: {a.epsilon_high:.7g} applies to the "
                              f"{', '.join(CLIPPED_LOSSES)} losses only; {OWN_BOUNDS[loss]}: leave it at "
                              f"{EPSILON_HIGH.default:g} or pick one of those losses"))
    world = max(a.num_processes, 1) * max(a.num_nodes, 1)
    if not v.bad("advanced.mini_batches", "grpo.batch_size", "grpo.group_size", "advanced.num_processes",
                 "advanced.num_nodes") and (g.batch_size // world) % a.mini_batches:
        share = g.batch_size // world
        fits = [m for m in range(MINI_BATCHES.low, MINI_BATCHES.high + 1) if share % m == 0]
        v.add(InvalidArgument(f"advanced.mini_batches: {a.mini_batches} does not divide the {share} completions "
                              f"each process trains per step (grpo.batch_size {g.batch_size}"
                              f"{f' over {world} processes' if world > 1 else ''}); allowed here: "
                              f"{', '.join(map(str, fits))}"))
    if a.eval_every and not v.bad("advanced.eval_every"):
        if spec.environment.key:
            v.add(InvalidArgument(f"advanced.eval_every: {a.eval_every} evaluates single answers; a job with an "
                                  f"environment ({spec.environment.key!r}) is evaluated by `rlvr eval run` with "
                                  "its adapter; set 0"))
        elif world > 1:
            v.add(InvalidArgument(f"advanced.eval_every: {a.eval_every} runs in a job of one process; this job "
                                  f"has {world} (advanced.num_processes x advanced.num_nodes); set 0 and evaluate "
                                  "its adapters with `rlvr eval run`"))
    if v.bad("advanced.num_iterations", "advanced.mini_batches", "advanced.loss_type"):
        return
    if one_update_per_step(a):
        if changed and loss not in OWN_BOUNDS and not v.bad("advanced.epsilon_high"):
            warnings.append(f"advanced.epsilon_high {a.epsilon_high:.7g} changes nothing here: with "
                            "advanced.num_iterations 1 and advanced.mini_batches 1 each step makes one optimizer "
                            "step, so the importance ratio is 1 and the clip never binds")
        if loss in ON_POLICY_EQUIVALENT:
            warnings.append(f"advanced.loss_type {loss} trains as {ON_POLICY_EQUIVALENT[loss]} with one optimizer "
                            "step per batch (its ratio is 1); it differs with advanced.num_iterations or "
                            "advanced.mini_batches above 1")


def _validate_eval_size(spec: common_pb2.JobSpec, catalog: Catalog | None, v: Violations) -> None:
    """advanced.eval_size against the held-out pool of a reward that makes its own problems (its
    RewardInfo.heldout_size); a dataset's held-out split is read at the job's start (all of it when
    it is smaller)."""
    a = spec.advanced
    if not a.eval_every or spec.reward.dataset or v.bad("advanced.eval_size", "advanced.eval_every", "reward"):
        return
    known = catalog.rewards if catalog is not None else load_registry().rewards
    info = known.get(spec.reward.key)
    pool = int(getattr(info, "heldout_size", 0) or 0)
    if pool and a.eval_size > pool:
        v.add(out_of_range("advanced.eval_size", a.eval_size,
                           f"{EVAL_SIZE.low}-{pool}: {getattr(info, 'display_name', spec.reward.key)}'s held-out "
                           f"split has {pool} problems"))


def _validate_memory(a: common_pb2.AdvancedOptions, backend: int) -> None:
    if backend == C.GENERATION_BACKEND_VLLM_COLOCATE:
        _float(a, "gpu_memory_fraction", "advanced.gpu_memory_fraction", GPU_MEMORY_FRACTION)
    elif a.HasField("gpu_memory_fraction") and backend in BACKEND_NAMES:
        why = ("the rollout server sizes its own engine (its --memory-fraction setting)"
               if backend == C.GENERATION_BACKEND_VLLM else "that backend runs no vLLM engine")
        raise InvalidArgument(f"advanced.gpu_memory_fraction: only the vLLM (colocate) backend takes a memory "
                              f"share; with {BACKEND_NAMES[backend]} {why}")


def _validate_async(a: common_pb2.AdvancedOptions, backend: int) -> None:
    if _int(a, "max_async_steps", "advanced.max_async_steps", MAX_ASYNC_STEPS) and \
            backend != C.GENERATION_BACKEND_VLLM and backend in BACKEND_NAMES:
        raise InvalidArgument(
            f"advanced.max_async_steps: {a.max_async_steps} needs the vLLM (rollout server) backend, which generates "
            f"in another process while the trainer trains; {BACKEND_NAMES[backend]} generates inside the training "
            f"process, so only 0 (synchronous) is allowed with it (range {MAX_ASYNC_STEPS.text()}, default "
            f"{MAX_ASYNC_STEPS.default})")


def _validate_sharding(a: common_pb2.AdvancedOptions, v: Violations) -> None:
    """advanced.sharding: one of SHARDINGS, and fsdp only where it can run (docs/jobs.md says why)."""
    a.sharding = a.sharding.strip() or SHARDINGS[0]
    if v.bad("advanced.sharding"):
        return
    if a.sharding not in SHARDINGS:
        raise out_of_range("advanced.sharding", a.sharding, FIELDS_BY_PATH["advanced.sharding"].allowed())
    if a.sharding != "fsdp" or v.bad("advanced.num_processes"):
        return
    if a.num_nodes > 1 and not v.bad("advanced.num_nodes"):
        raise InvalidArgument(f"advanced.sharding: fsdp runs on one node only (advanced.num_nodes is "
                              f"{a.num_nodes}): its checkpoints are sharded across the ranks, and a node that "
                              'resumes receives node 0\'s checkpoint alone; use advanced.num_nodes 1, or "ddp"')
    if a.num_processes < 2:
        raise InvalidArgument(f"advanced.sharding: fsdp shards the model across processes, and "
                              f"advanced.num_processes is {a.num_processes}; set it to 2 or more, or use "
                              f'"ddp"')
    if a.quantization == C.QUANTIZATION_8BIT:
        raise InvalidArgument("advanced.sharding: fsdp cannot shard an 8-bit base (FSDP2 re-creates the "
                              "parameters it shards, and bitsandbytes' int8 weights lose their quantization "
                              'state with it); use Full Precision or 4-bit QLoRA with fsdp, or "ddp"')


def _validate_processes(spec: common_pb2.JobSpec, backend: int, v: Violations) -> None:
    """advanced.num_processes against the fields it must agree with: one process per listed device,
    whole groups on every process, and the options that do not run across processes yet. Every
    field found bad goes to `v`."""
    a, g = spec.advanced, spec.grpo
    with v.check():
        _int(a, "num_processes", "advanced.num_processes", NUM_PROCESSES)
    with v.check():
        _int(a, "num_nodes", "advanced.num_nodes", NUM_NODES)
    if v.bad("advanced.num_processes", "advanced.num_nodes"):
        return
    procs, nodes = a.num_processes, a.num_nodes
    if a.gpu_selection not in ("auto", "cpu") and not v.bad("advanced.gpu_selection"):
        devices = a.gpu_selection.split(",")
        if len(set(devices)) != len(devices):
            v.add(InvalidArgument(f"advanced.gpu_selection: {a.gpu_selection!r} lists a device twice"))
        elif len(devices) != procs:
            v.add(InvalidArgument(
                f"advanced.gpu_selection: {a.gpu_selection!r} lists {len(devices)} device(s) but "
                f"advanced.num_processes is {procs}; a job trains with one process per device: set "
                f"advanced.num_processes to {len(devices)} or list {procs} device(s)"))
    if procs * nodes == 1 or spec.method in (C.TRAINING_METHOD_SFT, C.TRAINING_METHOD_HEAD):  # refused in sft.py
        return
    # A job of several nodes is advanced.num_nodes x num_processes ranks, each named as such.
    field, count = ("advanced.num_processes", procs) if nodes == 1 else ("advanced.num_nodes", nodes)
    what = f"advanced.num_processes {procs}" if nodes == 1 else \
        f"advanced.num_nodes {nodes} x advanced.num_processes {procs}"
    world = procs * nodes
    if not v.bad("grpo.group_size", "grpo.batch_size") and g.batch_size % (world * g.group_size):
        v.add(InvalidArgument(
            f"grpo.batch_size: {g.batch_size} does not split into whole groups of grpo.group_size {g.group_size} "
            f"on each of {what}; use a multiple of {world * g.group_size}"))
    one = "1 process" if nodes == 1 else "1 node"
    if backend == C.GENERATION_BACKEND_VLLM_COLOCATE:
        v.add(InvalidArgument(f"{field}: {count} {'processes' if nodes == 1 else 'nodes'} cannot each start a "
                              f"vLLM (colocate) engine yet; use the vLLM (rollout server) or Transformers backend, "
                              f"or {one}"))
    if a.dynamic_sampling:
        v.add(InvalidArgument(f"advanced.dynamic_sampling: not supported across processes yet "
                              f"({what}); use {one} or turn it off"))
    if a.max_async_steps:
        v.add(InvalidArgument(f"advanced.max_async_steps: asynchronous steps are not supported across processes "
                              f"yet ({what}); use {one} or 0"))


def prompt_count(spec: common_pb2.JobSpec) -> int | None:
    """Training prompts of a resolved spec, where known without loading data: a reward that
    generates its prompts has synthetic_prompts set (generates_prompts)."""
    return spec.reward.synthetic_prompts if spec.reward.HasField("synthetic_prompts") else None


def total_steps(spec: common_pb2.JobSpec, n_prompts: int | None = None) -> int:
    """max_steps, or for Full (-1): every prompt for the chosen epochs, group_size completions each."""
    if spec.grpo.max_steps != -1:
        return spec.grpo.max_steps
    n = n_prompts if n_prompts is not None else prompt_count(spec)
    if n is None:
        return -1  # known once the dataset is loaded
    prompts_per_step = spec.grpo.batch_size // spec.grpo.group_size
    return max(1, math.ceil(n * spec.advanced.epochs / prompts_per_step))
