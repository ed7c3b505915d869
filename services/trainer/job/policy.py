"""The model a job trains: its base model resolved and loaded (quantized if asked, never silently in
full precision), an init_adapter stacked on as a frozen update, and the fresh LoRA adapter on top."""


from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlvr.common.errors import FailedPrecondition
from rlvr.services.trainer.job import stacking
from rlvr.services.trainer.job.config import JobConfig, one_line
from rlvr.services.trainer.job.quantization import (
    bnb_config,
    effective_precision,
    torch_dtype,
)

if TYPE_CHECKING:
    pass


log = logging.getLogger("rlvr.trainer.runner")

def resolve_base_model(name: str) -> str:
    """A path or hub id the loaders accept: `rlvr.models.resolve_model`, the resolver every service
    shares (rlvr-tiny[-test] is built on first use), after checking that a path names a folder."""
    from rlvr.models import is_tiny, resolve_model

    if not is_tiny(name) and name.startswith(("/", "./", "../", "~")) and not Path(name).expanduser().is_dir():
        raise FailedPrecondition(f"base_model: {name!r} is not a model folder on this worker")
    return resolve_model(name)


def same_model(a: str, b: str) -> bool:
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
    init_weights = True if job.lora_init == "default" else job.lora_init
    if job.sft is None:
        lora = LoraConfig(r=job.lora_rank, lora_alpha=job.lora_alpha, lora_dropout=0.0,
                          target_modules="all-linear", task_type="CAUSAL_LM", init_lora_weights=init_weights)
        return get_peft_model(model, lora), tokenizer
    s = job.sft  # a Supervised (SFT) job's own LoRA card
    targets = s.target_modules if s.target_modules == "all-linear" else s.target_modules.split(",")
    lora = LoraConfig(r=s.lora_rank, lora_alpha=s.lora_alpha, lora_dropout=s.lora_dropout, target_modules=targets,
                      task_type="CAUSAL_LM", init_lora_weights=init_weights)
    try:
        return get_peft_model(model, lora), tokenizer
    except ValueError as e:  # peft: "Target modules {...} not found in the base model"
        raise FailedPrecondition(f"sft.target_modules: {s.target_modules!r} on {job.base_model!r}: {one_line(e)}") from e


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
