"""What every service knows about a PEFT LoRA adapter on disk: its files, the base model's LoRA-able
layers, and the all-zero adapter that stands for the base model in a vLLM engine on CPU.

The rollout server (registry and vLLM backend), the trainer (artifacts, colocated engine), the
scheduler (downloads) and the benchmark (uploads) all read these; nothing here imports gRPC, and
torch/transformers only inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

# The two files of a PEFT adapter directory: what is uploaded, downloaded, checked and kept.
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
# An adapter name (and a merged model's): a folder name and a vLLM LoRA name, 1-128 characters.
ADAPTER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

# The LoRA id of the all-zero adapter that stands for the base model on CPU; the registry's ids count up
# from 1 and would need a billion pushes to reach it (vLLM keeps LoRA ids in int32 tensors).
ZERO_LORA_UID = 1_000_000_000


def base_linear_shapes(model_path: str | Path, trust_remote_code: bool = False) -> dict[str, tuple[int, int]]:
    """`{module name: (in_features, out_features)}` of the base model's LoRA-able linear layers.

    Built on the meta device from the config alone, so it costs no weights and no memory.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_path), trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    head = model.get_output_embeddings()
    return {
        name: (module.in_features, module.out_features)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and module is not head
    }


def write_zero_lora(model_path: str, trust_remote_code: bool) -> str:
    """A rank-1 LoRA of zeros on every `q_proj` (any one module would do): the base model, as a LoRA."""
    import torch
    from safetensors.torch import save_file

    shapes = base_linear_shapes(model_path, trust_remote_code)
    modules = [m for m in shapes if m.endswith(".q_proj")] or [next(iter(shapes))]
    tensors = {}
    for module in modules:
        in_features, out_features = shapes[module]
        tensors[f"base_model.model.{module}.lora_A.weight"] = torch.zeros(1, in_features)
        tensors[f"base_model.model.{module}.lora_B.weight"] = torch.zeros(out_features, 1)
    directory = tempfile.mkdtemp(prefix="rlvr-zero-lora-")
    save_file(tensors, f"{directory}/adapter_model.safetensors")
    config = {
        "peft_type": "LORA",
        "r": 1,
        "lora_alpha": 1,
        "target_modules": sorted({m.rsplit(".", 1)[-1] for m in modules}),
        "bias": "none",
    }
    with open(f"{directory}/adapter_config.json", "w") as fh:
        json.dump(config, fh)
    return directory


@dataclass(frozen=True)
class AdapterSummary:
    alpha: float
    target_modules: list[str]
    size_bytes: int


def read_adapter_summary(directory: Path) -> AdapterSummary:
    """LoRA alpha, target modules (sorted) and bytes on disk of the adapter in `directory`; a
    missing or unreadable adapter_config.json gives alpha 0 and no modules."""
    config: dict[str, object] = {}
    with contextlib.suppress(OSError, ValueError):
        config = json.loads((directory / ADAPTER_FILES[0]).read_text())
    modules = config.get("target_modules") or []
    size = sum(p.stat().st_size for p in directory.glob("*") if p.is_file())
    return AdapterSummary(
        alpha=float(config.get("lora_alpha", 0) or 0),  # type: ignore[arg-type]  # JSON: a number or absent
        target_modules=sorted(modules) if isinstance(modules, list) else [str(modules)],
        size_bytes=size,
    )
