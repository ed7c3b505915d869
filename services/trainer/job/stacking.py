"""Stacking LoRA adapters: two adapters on one base written as ONE PEFT LoRA adapter on that base.

LoRA updates add. An adapter with per-module rank r_i, A_i (r_i x in), B_i (out x r_i) and scaling
s_i adds s_i B_i A_i to a linear layer's weight, so for every targeted module

    W + s1 B1 A1 + s2 B2 A2  ==  W + 1 * [s1 B1, s2 B2] @ [A1; A2]

i.e. one adapter with A = [A1; A2] (rows concatenated), B = [s1 B1, s2 B2] (columns concatenated),
rank r1 + r2 and scaling 1 (lora_alpha = rank, no rsLoRA). s_i is each adapter's own scaling for
that module: lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora, with `rank_pattern` /
`alpha_pattern` applied per module exactly as peft matches them.

A module that only one adapter touches gets only that adapter's block (the other contributes
nothing, which is exact), and every module is zero-padded to the largest combined rank R (zero
rows of A, zero columns of B add nothing): the result has one rank r = lora_alpha = R and no
rank/alpha patterns, which is what the rollout server's vLLM engine serves as one LoRA module
(`services/rollout/adapter_registry.py::check_adapter_files`). Modules of different shapes, and anything
that is not a plain LoRA (DoRA, biases, modules_to_save, trainable tokens, weights relative to a
modified base such as PiSSA/LoftQ, ...), cannot be stacked and raise `StackingError` naming the
feature.

Everything here works on `Adapter` values (an adapter_config.json dict + the safetensors state
dict, keys `base_model.model.<module>.lora_A.weight` / `.lora_B.weight` as PEFT saves them), so it
needs no model; `from_peft_model` takes the adapter out of a live PeftModel in the same form.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model."
_KEY_RE = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<part>[AB])\.weight$")

# Config keys whose truthy value makes an adapter something other than W + s B A on the original
# weights (or adds weights that are not LoRA A/B): (key, what it is).
_UNSUPPORTED = (
    ("use_dora", "DoRA"),
    ("lora_bias", "a LoRA bias"),
    ("modules_to_save", "modules_to_save (full copies of modules)"),
    ("trainable_token_indices", "trainable tokens"),
    ("target_parameters", "target_parameters (LoRA on raw parameters)"),
    ("layer_replication", "layer_replication"),
    ("use_qalora", "QA-LoRA"),
    ("alora_invocation_tokens", "activated LoRA (alora_invocation_tokens)"),
    ("use_bdlora", "BD-LoRA"),
    ("velora_config", "VeLoRA"),
    ("monteclora_config", "MonteCLoRA"),
    ("arrow_config", "Arrow routing"),
    ("kasa_config", "KaSA"),
    ("megatron_config", "a Megatron-parallel LoRA"),
)
# Initialisations that rewrite the base weights: the adapter is then relative to a modified base
# unless it was converted on save (which records init_lora_weights = true).
_BASE_MODIFYING_INITS = ("pissa", "olora", "corda", "loftq", "lora_ga")


class StackingError(ValueError):
    """The adapters cannot be written as one adapter; the message names the reason."""


@dataclass(frozen=True)
class Adapter:
    config: dict[str, Any]  # adapter_config.json
    tensors: dict[str, torch.Tensor]  # adapter_model.safetensors

    @property
    def rank(self) -> int:
        return int(self.config["r"])


def read_adapter(path: str | Path) -> Adapter:
    """A PEFT adapter folder (only its config and safetensors are read; nothing is unpickled)."""
    from safetensors.torch import load_file

    folder = Path(path)
    missing = [f for f in (CONFIG_FILE, WEIGHTS_FILE) if not (folder / f).is_file()]
    if missing:
        raise StackingError(f"not a PEFT adapter folder: no {', '.join(missing)}")
    try:
        config = json.loads((folder / CONFIG_FILE).read_text())
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) else str(e)  # an OSError's text names the path
        raise StackingError(f"its {CONFIG_FILE} is not readable JSON: {why}") from e
    if not isinstance(config, dict):
        raise StackingError(f"its {CONFIG_FILE} is not a JSON object")
    try:
        tensors = load_file(str(folder / WEIGHTS_FILE))
    except Exception as e:  # safetensors raises its own error types on a corrupt file
        raise StackingError(f"its {WEIGHTS_FILE} cannot be read: {str(e).replace(str(folder), '<folder>')}") from e
    return Adapter(config, tensors)


def write_adapter(adapter: Adapter, folder: Path) -> None:
    """Writes the two PEFT files into `folder` (plain writes: the caller stages and renames)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_FILE).write_text(json.dumps(adapter.config, indent=2, sort_keys=True) + "\n")
    save_file({k: v.contiguous() for k, v in adapter.tensors.items()}, str(folder / WEIGHTS_FILE),
              metadata={"format": "pt"})


def from_peft_model(model: Any, adapter_name: str = "default", state_dict: dict[str, Any] | None = None) -> Adapter:
    """The adapter `adapter_name` of a live peft PeftModel, as `save_pretrained` would write it;
    from `state_dict` (the model's state-dict names) rather than the model's own tensors when given
    (a sharded policy's, gathered: distributed.gather_adapter)."""
    from peft import get_peft_model_state_dict

    config = model.peft_config[adapter_name].to_dict()
    config = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}
    config["inference_mode"] = True
    config = json.loads(json.dumps(config))  # enums to strings, as in the saved file
    state = get_peft_model_state_dict(model, state_dict=state_dict, adapter_name=adapter_name)
    return Adapter(config, {k: v.detach().to("cpu", copy=True) for k, v in state.items()})


def check_stackable(config: Mapping[str, Any], label: str = "adapter") -> None:
    """Raises StackingError unless `config` describes a plain LoRA (W + s B A on linear layers)."""
    if config.get("peft_type") != "LORA":
        raise StackingError(f"{label} is not a LoRA adapter (peft_type {config.get('peft_type')!r})")
    for key, what in _UNSUPPORTED:
        if config.get(key):
            raise StackingError(f"{label} uses {what} ({key}={config[key]!r}); only plain LoRA adapters stack")
    if config.get("bias", "none") not in (None, "none"):
        raise StackingError(f"{label} trains biases (bias={config['bias']!r}); only plain LoRA adapters stack")
    if config.get("fan_in_fan_out"):
        raise StackingError(f"{label} stores transposed weights (fan_in_fan_out=true); only nn.Linear LoRA stacks")
    init = config.get("init_lora_weights")
    if isinstance(init, str) and init.lower().startswith(_BASE_MODIFYING_INITS):
        raise StackingError(
            f"{label} was initialised with {init!r}, which rewrites the base weights: it is not an adapter on "
            "the original base (save it with path_initial_model_for_weight_conversion first)"
        )
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise StackingError(f"{label} has no valid rank (r={rank!r})")
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not math.isfinite(alpha):
        raise StackingError(f"{label} has no valid lora_alpha ({alpha!r})")


def _pattern_value(pattern: Mapping[str, Any], module: str, default: Any) -> Any:
    """`rank_pattern` / `alpha_pattern` lookup for one module, as peft 0.21 matches it
    (`peft.utils.other.get_pattern_key`: the first key that matches a dotted suffix of the name)."""
    for key in pattern:
        if re.match(rf"(.*\.)?({key})$", module):
            return pattern[key]
    return default


def module_scaling(config: Mapping[str, Any], module: str) -> tuple[int, float]:
    """(rank, scaling) that peft gives `module` (its name without the base_model.model. prefix)."""
    rank = int(_pattern_value(config.get("rank_pattern") or {}, module, config["r"]))
    alpha = float(_pattern_value(config.get("alpha_pattern") or {}, module, config["lora_alpha"]))
    return rank, (alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank)


def lora_modules(adapter: Adapter, label: str = "adapter") -> dict[str, tuple[torch.Tensor, torch.Tensor, float]]:
    """{module: (A, B, scaling)} of a plain LoRA adapter, checking every tensor and shape."""
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in adapter.tensors.items():
        match = _KEY_RE.match(key)
        if match is None:
            raise StackingError(f"{label} holds {key!r}, which is not a LoRA A/B weight of a linear layer")
        if tensor.dim() != 2 or not tensor.is_floating_point():
            raise StackingError(f"{label}: {key!r} is not a 2-D float tensor (shape {list(tensor.shape)})")
        parts.setdefault(match["module"], {})[match["part"]] = tensor
    if not parts:
        raise StackingError(f"{label} holds no LoRA weights")
    modules = {}
    for module, ab in sorted(parts.items()):
        if set(ab) != {"A", "B"}:
            raise StackingError(f"{label}: module {module!r} has lora_{''.join(ab)} but not both lora_A and lora_B")
        a, b = ab["A"], ab["B"]
        rank, scaling = module_scaling(adapter.config, module)
        if a.shape[0] != rank or b.shape[1] != rank:
            raise StackingError(f"{label}: module {module!r} has A {list(a.shape)} and B {list(b.shape)}, but its "
                                f"config gives it rank {rank}")
        modules[module] = (a, b, scaling)
    return modules


def _same(first: Mapping[str, Any], second: Mapping[str, Any], key: str) -> Any:
    a, b = first.get(key), second.get(key)
    if (a or None) != (b or None):
        raise StackingError(f"the adapters differ in {key} ({a!r} vs {b!r}); they cannot be written as one adapter")
    return a


def _targets(first: Mapping[str, Any], second: Mapping[str, Any]) -> str | list[str]:
    a, b = first.get("target_modules"), second.get("target_modules")
    if isinstance(a, str) or isinstance(b, str):
        if a != b:
            raise StackingError(f"the adapters' target_modules differ and one is a regex ({a!r} vs {b!r}); they "
                                "cannot be written as one adapter")
        assert isinstance(a, str)  # equal to b, and one of them is a str
        return a
    return sorted({*(a or []), *(b or [])})


def combine(first: Adapter, second: Adapter) -> Adapter:
    """ONE adapter equal to `first` and `second` both applied to the same base (see the module
    docstring): rank R = the largest per-module r1 + r2, lora_alpha = R (scaling 1). The config
    keeps `second`'s other fields (its base_model_name_or_path, task_type, ...)."""
    import torch

    check_stackable(first.config, "the first adapter")
    check_stackable(second.config, "the second adapter")
    for key in ("layers_to_transform", "layers_pattern", "exclude_modules"):
        _same(first.config, second.config, key)
    targets = _targets(first.config, second.config)
    one, two = lora_modules(first, "the first adapter"), lora_modules(second, "the second adapter")
    blocks: dict[str, list[tuple[torch.Tensor, torch.Tensor, float]]] = {}
    for modules in (one, two):
        for module, block in modules.items():
            blocks.setdefault(module, []).append(block)
    dtype = torch.float32
    for a, b, _ in (*one.values(), *two.values()):
        dtype = torch.promote_types(dtype, torch.promote_types(a.dtype, b.dtype))
    rank = max(sum(a.shape[0] for a, _, _ in stack) for stack in blocks.values())
    tensors: dict[str, torch.Tensor] = {}
    for module, stack in sorted(blocks.items()):
        ins, outs = {a.shape[1] for a, _, _ in stack}, {b.shape[0] for _, b, _ in stack}
        if len(ins) != 1 or len(outs) != 1:
            shapes = ", ".join(f"A {list(a.shape)} B {list(b.shape)}" for a, b, _ in stack)
            raise StackingError(f"module {module!r} has different shapes in the two adapters ({shapes}): adapters "
                                "of different base models")
        (in_features,), (out_features,) = ins, outs
        a_out = torch.zeros(rank, in_features, dtype=dtype)
        b_out = torch.zeros(out_features, rank, dtype=dtype)
        row = 0
        for a, b, scaling in stack:
            r = a.shape[0]
            a_out[row:row + r] = a.to(dtype)
            # The scaling is folded into B in float64, rounded once to the output dtype.
            b_out[:, row:row + r] = (b.to(torch.float64) * scaling).to(dtype)
            row += r
        tensors[f"{PREFIX}{module}.lora_A.weight"] = a_out
        tensors[f"{PREFIX}{module}.lora_B.weight"] = b_out
    config = dict(second.config)
    config.update(r=rank, lora_alpha=rank, use_rslora=False, rank_pattern={}, alpha_pattern={},
                  target_modules=targets, init_lora_weights=True, inference_mode=True)
    return Adapter(config, tensors)


def delta_weights(adapter: Adapter) -> dict[str, torch.Tensor]:
    """{module: scaling * B @ A} in float64: what the adapter adds to each weight (for checks)."""
    import torch

    return {m: (b.to(torch.float64) @ a.to(torch.float64)) * s for m, (a, b, s) in lora_modules(adapter).items()}
