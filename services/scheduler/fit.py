"""Whether a trainer worker can run a job: `fit(spec, capabilities)` is None when it can, or the
reason it cannot, in one line naming the spec field and what the worker has. Pure (no I/O): the
capabilities are what the worker reported (trainer.proto WorkerCapabilities), the spec is the
stored, resolved one (an unset field reads as its default).

What counts, in order: the devices (gpu_selection's listed indices must exist there; "auto" on a
GPU worker needs a GPU per training process; on a CPU, a core per process), the precision on the
device the job would train on (fp16 needs CUDA; bf16 on CUDA needs every selected device to
support it), the quantization, in-process vLLM for the colocate backend, and the base model:

- a bundled tiny model, or a hub id or local folder the worker lists as cached: fits;
- a hub id it does not have: fits unless the worker is offline (it downloads it at start);
- a local folder under one of the worker's model roots that it does not list: does not fit (the
  worker would have listed it); a folder outside every root it reports: fits (the worker cannot
  say what it has there; the job fails at load if the folder is missing).

No capabilities (a trainer that does not report them) fits everything, as before they existed.
"""

from __future__ import annotations

import os

from rlvr.jobspec import DEFAULT_BASE_MODEL, NUM_PROCESSES, PRECISIONS, QUANT_KEYS, QUANT_NAMES
from rlvr.models import is_local_path, is_tiny
from rlvr.v1 import common_pb2, trainer_pb2


def _devices(spec: common_pb2.JobSpec, caps: trainer_pb2.WorkerCapabilities, worker: str
             ) -> tuple[str, list[trainer_pb2.GpuDevice]] | str:
    """("cuda" or "cpu", the GPUs the job would use), or the reason the worker lacks them."""
    a = spec.advanced
    selection = a.gpu_selection.strip() or "auto"
    procs = a.num_processes if a.HasField("num_processes") and a.num_processes > 0 else NUM_PROCESSES.default
    gpus = {g.index: g for g in caps.gpus}
    has = f"worker {worker} has {len(gpus)}" + (f" ({','.join(str(i) for i in sorted(gpus))})" if gpus else "")
    if selection == "cpu" or (selection == "auto" and not gpus):
        cores = caps.cpu_cores or 1
        if procs > cores:
            return (f"needs {procs} training processes on the CPU (num_processes {procs}), worker {worker} "
                    f"has {cores} core(s)")
        return "cpu", []
    if selection == "auto":
        if procs > len(gpus):
            return f"needs {procs} GPUs (gpu_selection auto, num_processes {procs}), {has}"
        return "cuda", [gpus[i] for i in sorted(gpus)[:procs]]
    wanted = [int(d) for d in selection.split(",") if d.strip()]
    if any(i not in gpus for i in wanted):
        return f"needs {len(wanted)} GPU(s) (gpu_selection {selection}), {has}"
    return "cuda", [gpus[i] for i in wanted]


def _precision(spec: common_pb2.JobSpec, device: str, gpus: list[trainer_pb2.GpuDevice], worker: str) -> str | None:
    precision = spec.advanced.precision.strip() or PRECISIONS[0]
    if precision == "fp16" and device != "cuda":
        selection = spec.advanced.gpu_selection.strip() or "auto"
        where = "it trains on the CPU (gpu_selection cpu)" if selection == "cpu" else f"worker {worker} has none"
        return f"precision fp16 needs a CUDA device; {where}"
    if precision == "bf16" and device == "cuda":
        old = [g for g in gpus if not g.bf16]
        if old:
            return (f"precision bf16 is not supported by GPU {old[0].index} ({old[0].name or 'unnamed'}) "
                    f"of worker {worker}")
    return None


def _base_model(spec: common_pb2.JobSpec, caps: trainer_pb2.WorkerCapabilities, worker: str) -> str | None:
    model = spec.base_model.strip() or DEFAULT_BASE_MODEL
    cached = set(caps.cached_models)
    if is_tiny(model):
        return None if model in cached else f"base model {model} (bundled) is not offered by worker {worker}"
    if not is_local_path(model):
        if model in cached or not caps.hub_offline:
            return None
        return f"base model {model} is not cached on worker {worker} and it cannot download it (offline)"
    path = os.path.normpath(os.path.expanduser(model))
    if path in {os.path.normpath(c) for c in cached}:
        return None
    for root in caps.model_roots:
        root = os.path.normpath(root)
        if os.path.dirname(path) == root or path.startswith(root + os.sep):
            return f"base model {model} is not on worker {worker} (not among its models under {root})"
    return None  # outside every root the worker reports: it cannot say; the load decides


def fit(spec: common_pb2.JobSpec, capabilities: trainer_pb2.WorkerCapabilities | None,
        worker: str = "the worker") -> str | None:
    """None when the worker whose `capabilities` these are (named `worker` in the reason) can run
    the job `spec`; otherwise why not (see the module's doc)."""
    if capabilities is None:
        return None
    devices = _devices(spec, capabilities, worker)
    if isinstance(devices, str):
        return devices
    device, gpus = devices
    reason = _precision(spec, device, gpus, worker)
    if reason:
        return reason
    quantization = QUANT_KEYS.get(spec.advanced.quantization, "full")
    if quantization not in capabilities.quantizations and quantization != "full":
        return (f"quantization {QUANT_NAMES[spec.advanced.quantization]} is not supported on worker {worker} "
                f"(it has: {', '.join(capabilities.quantizations) or 'full'}; bitsandbytes is not installed there)")
    if spec.advanced.generation_backend == common_pb2.GENERATION_BACKEND_VLLM_COLOCATE \
            and not capabilities.vllm_colocate:
        return f"generation backend vLLM (colocate) needs vLLM in the job's process; worker {worker} has no vllm"
    return _base_model(spec, capabilities, worker)


def queue_reason(reasons: dict[str, str | None], configured: int) -> str:
    """Why a queued job waits, in one line, from `fit`'s answer for each reachable worker (by
    address) when none of the idle ones fits: those that fit are busy, or none fits (each reason,
    once), or none answers. `configured`: how many workers the scheduler knows."""
    if not reasons:
        if not configured:
            return "no trainer worker is configured"
        return f"no trainer worker answers (0 of {configured} reachable)"
    fitting = sum(r is None for r in reasons.values())
    if fitting:
        return f"waiting for a free worker: {fitting} of {len(reasons)} reachable can run it, and all are busy"
    distinct = list(dict.fromkeys(r for r in reasons.values() if r))
    return "no trainer worker can run it: " + "; ".join(distinct)
