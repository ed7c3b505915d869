"""What this trainer worker can run, reported in GetWorkerStatus (`WorkerStatus.capabilities`) so
that the scheduler gives it only jobs it can run (services/scheduler/fit.py reads it).

Computed once when the service starts, and cheap: no model is loaded and nothing is probed.
Devices come from torch (imported only where a GPU driver is present: a host without
/dev/nvidiactl or /dev/kfd has no CUDA device torch could use), quantization support and in-process
vLLM from what is installed, and the cached base models from folder listings (the bundled tiny
models, which any worker builds on first use; the Hugging Face cache; the model roots). The worker
still checks a job at StartJob as before (a quantized LoRA is probed then, and refused with
FAILED_PRECONDITION if it cannot run): this report only spares the scheduler sending it there.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from rlvr.common.settings import rlvr_home
from rlvr.jobspec import NUM_PROCESSES
from rlvr.models import TINY_MODELS
from rlvr.v1 import trainer_pb2

log = logging.getLogger("rlvr.trainer.capabilities")

GPU_DRIVER_FILES = ("/dev/nvidiactl", "/dev/kfd")
"""Present where a CUDA (or ROCm) driver is loaded; without them torch sees no device."""


def cpu_cores() -> int:
    """The cores this process may run on (its affinity; os.cpu_count where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def host_memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return 0


def cuda_devices(driver_files: Sequence[str] = GPU_DRIVER_FILES) -> list[trainer_pb2.GpuDevice]:
    """The CUDA devices this process sees (CUDA_VISIBLE_DEVICES applies), by the index a job's
    gpu_selection names; none without a GPU driver or torch."""
    if not any(Path(f).exists() for f in driver_files) or importlib.util.find_spec("torch") is None:
        return []
    try:
        import torch

        if not torch.cuda.is_available():
            return []
        devices = []
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            devices.append(trainer_pb2.GpuDevice(index=i, name=props.name, memory_bytes=int(props.total_memory),
                                                 bf16=props.major >= 8))
        return devices
    except Exception as e:  # a broken driver: report no GPU rather than fail the service
        log.warning("could not read the CUDA devices (%s: %s); reporting none", type(e).__name__, e)
        return []


def hub_cache_models() -> list[str]:
    """Hub ids ("owner/name") with a downloaded snapshot in the Hugging Face cache."""
    try:
        from huggingface_hub import constants

        cache = Path(constants.HF_HUB_CACHE)
        entries = sorted(cache.glob("models--*"))
    except Exception:  # no huggingface_hub, or an unreadable cache
        return []
    found = []
    for entry in entries:
        if any((snapshot / "config.json").exists() for snapshot in (entry / "snapshots").glob("*")):
            found.append(entry.name.removeprefix("models--").replace("--", "/"))
    return found


def local_models(roots: Sequence[Path]) -> list[str]:
    """The model folders (each with a config.json) directly under `roots` (absolute), by the
    path a job spec would name them with (the root's own spelling, symbolic links not followed)."""
    found = []
    for root in roots:
        try:
            found += sorted(str(Path(root) / d.name) for d in Path(root).iterdir() if (d / "config.json").is_file())
        except OSError:
            continue  # a root that does not exist (yet)
    return found


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def worker_capabilities(model_roots: Sequence[Path] = (),
                        driver_files: Sequence[str] = GPU_DRIVER_FILES) -> trainer_pb2.WorkerCapabilities:
    """This host's capabilities (see the module's doc). `model_roots`: the trainer's
    model_roots setting; $RLVR_HOME/models (where the tiny models are built) is always one."""
    gpus = cuda_devices(driver_files)
    cores = cpu_cores()
    if gpus:
        kind, processes = "cuda", min(len(gpus), NUM_PROCESSES.high)
        precisions = ["fp32", "fp16"] + (["bf16"] if all(g.bf16 for g in gpus) else [])
    else:
        # One training process per core: more would only share the cores (gloo ranks on a CPU).
        kind, processes, precisions = "cpu", min(cores, NUM_PROCESSES.high), ["fp32", "bf16"]
    has_bnb = importlib.util.find_spec("bitsandbytes") is not None
    roots = [rlvr_home() / "models", *(Path(r).expanduser().absolute() for r in model_roots)]
    roots = list(dict.fromkeys(roots))
    cached = [*TINY_MODELS, *hub_cache_models(), *local_models(roots)]
    return trainer_pb2.WorkerCapabilities(
        device_kind=kind, gpus=gpus, cpu_cores=cores, memory_bytes=host_memory_bytes(),
        precisions=precisions, quantizations=["full", "4bit", "8bit"] if has_bnb else ["full"],
        vllm_colocate=importlib.util.find_spec("vllm") is not None, max_num_processes=processes,
        cached_models=list(dict.fromkeys(cached)), model_roots=[str(r) for r in roots], hub_offline=hub_offline(),
    )
