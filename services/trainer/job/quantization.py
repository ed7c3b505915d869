"""Devices and quantization: what this host can run, decided up front and never silently downgraded.

The spec's Quantization option (Full Precision, 4-bit QLoRA, 8-bit) loads the frozen base through
bitsandbytes. docs/design.md records that bitsandbytes 0.50.2 trains LoRA over nf4 and int8 on CPU, but
that is a property of the installed build and the host, so `check_quantization` probes it the way
a job will use it (a micro Qwen2 loaded quantized, one LoRA forward and backward) and caches the
answer. A job whose quantization cannot run fails at once with FailedPrecondition; it never falls
back to full precision.
"""

from __future__ import annotations

import functools
import tempfile
import warnings
from collections.abc import Iterable
from typing import Any

from rlvr.common.errors import FailedPrecondition
from rlvr.jobspec import Precision


def pick_device(gpu_selection: str) -> str:
    """"cpu" or "cuda" for a job's GPU Selection ("auto", "cpu", or device indices such as "0,1",
    which the job process has already put in CUDA_VISIBLE_DEVICES: process/launch.py visible_devices). A job asking for GPUs on a
    host without CUDA fails rather than running on the CPU."""
    import torch

    if gpu_selection == "cpu":
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    if gpu_selection == "auto":
        return "cpu"
    raise FailedPrecondition(
        f"advanced.gpu_selection: {gpu_selection!r} asks for GPU devices, but this trainer worker has no CUDA "
        "device; use \"auto\" or \"cpu\""
    )


def effective_precision(precision: Precision, device: str) -> Precision:
    """advanced.precision as the job trains on `device` ("cpu", "cuda", "cuda:N"): "auto" is bf16 on a
    CUDA device that supports it (what vLLM serves a bf16 checkpoint in, so a default GPU job is not
    importance-corrected for a precision it did not ask for), fp32 elsewhere; the others as given."""
    if precision != "auto":
        return precision
    if not device.startswith("cuda"):
        return "fp32"
    import torch

    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp32"


def check_precision(precision: str, gpu_selection: str = "auto") -> None:
    """Raises FailedPrecondition (one line, naming advanced.precision) if the job's device cannot
    train in `precision`: fp16 needs CUDA (torch's CPU autocast has no fp16 training, and the
    GradScaler fp16 needs is CUDA's), bf16 a device that supports it (any CPU; a CUDA device
    from Ampere on)."""
    if precision in ("fp32", "auto"):  # auto falls back to fp32 where bf16 cannot run
        return
    if precision not in ("bf16", "fp16"):
        raise ValueError(f"advanced.precision: {precision!r} is not one of auto, fp32, bf16, fp16")
    import torch

    device = pick_device(gpu_selection)
    if device == "cpu":
        if precision == "fp16":
            raise FailedPrecondition("advanced.precision: fp16 needs a CUDA device, and this job trains on the CPU "
                                     f"(advanced.gpu_selection {gpu_selection!r}); use bf16 or fp32")
        return
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        raise FailedPrecondition(f"advanced.precision: bf16 is not supported by this worker's CUDA device "
                                 f"{torch.cuda.get_device_name()!r}; use fp16 or fp32")


def torch_dtype(precision: str) -> Any:  # -> torch.dtype
    """The dtype the base model is loaded in for `precision` (the LoRA weights stay float32)."""
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


# advanced.precision -> the dtype name engines use (the rollout server's GetInfo dtype, vLLM's dtype).
PRECISION_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def sampler_corrections(max_async_steps: int, precision: str, quantization: str, generation_backend: str,
                        sampler_dtypes: Iterable[str] = (), reshaped: bool = False) -> tuple[str, ...]:
    """Why a job's rollouts come from another policy than the one it trains, each a reason for TRL's
    truncated importance-sampling correction (MetricEvent.sampler_correction; docs/gpu.md):
    - "policy_lag": asynchronous steps sample with an older adapter (advanced.max_async_steps > 0);
    - "precision": a rollout server whose engine dtype (GetInfo.dtype; "" = an older server, which
      always ran float32) is not advanced.precision's;
    - "quantization": a 4-bit/8-bit base trained while the vLLM engine (the rollout server's or the
      colocated one) samples the full-precision base plus the adapter;
    - "sampling": `reshaped`, the job's top_p, top_k, min_p or repetition_penalty (jobspec.reshaped_sampling)
      draw from another distribution than the whole tempered policy TRL's loss scores; vLLM's logprobs
      are of the distribution drawn from (processed_logprobs), so TRL's ratio weighs each token by
      p_policy / p_sampler, as TRL does by default (vllm_importance_sampling_correction).
    The transformers backend samples from the very policy it trains, or reshaped by the controls: it
    reports no logprobs, so no correction applies (resolve_spec warns), and it has no asynchronous
    steps. A colocated engine runs in the job's precision (runner.start_colocated)."""
    reasons = ["policy_lag"] if max_async_steps > 0 else []
    if generation_backend == "transformers":
        return tuple(reasons)
    own = PRECISION_DTYPES[precision]
    if any((dtype or "float32") != own for dtype in sampler_dtypes):
        reasons.append("precision")
    if quantization != "full":
        reasons.append("quantization")
    if reshaped:
        reasons.append("sampling")
    return tuple(reasons)


def bnb_config(quantization: str, sharded: bool = False) -> Any:  # -> transformers.BitsAndBytesConfig | None
    """The bitsandbytes config of a quantized base. `sharded` (advanced.sharding fsdp): the 4-bit
    weights packed into float32 storage, which FSDP2 can shard (accelerate leaves a base packed in
    uint8, bitsandbytes' default, whole on every process: "non-floating frozen Params4bit")."""
    if quantization == "full":
        return None
    import torch
    from transformers import BitsAndBytesConfig

    if quantization == "4bit":
        return BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32,
            bnb_4bit_use_double_quant=False, **({"bnb_4bit_quant_storage": torch.float32} if sharded else {}),
        )
    if quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    raise ValueError(f"advanced.quantization: {quantization!r} is not one of full, 4bit, 8bit")


def _probe(quantization: str, device: str) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, max_position_embeddings=64)
    with tempfile.TemporaryDirectory(prefix="rlvr-quant-probe-") as tmp:
        Qwen2ForCausalLM(config).save_pretrained(tmp)
        model = AutoModelForCausalLM.from_pretrained(
            tmp, quantization_config=bnb_config(quantization), dtype=torch.float32, device_map=device
        )
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
        ids = torch.randint(0, 64, (2, 8), device=device)
        model(input_ids=ids, labels=ids).loss.backward()
        if not any(p.grad is not None for p in model.parameters() if p.requires_grad):
            raise RuntimeError("no gradient reached the LoRA weights")


@functools.lru_cache(maxsize=8)
def _quantization_problem(quantization: str, device: str) -> str | None:
    try:
        import bitsandbytes  # noqa: F401
    except Exception as e:  # ImportError, or a build that fails to load its native library
        return f"bitsandbytes is not usable here ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _probe(quantization, device)
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else ""
        return f"a LoRA over a {quantization} base failed on {device} ({type(e).__name__}: {first})"
    return None


def check_quantization(quantization: str, gpu_selection: str = "auto") -> None:
    """Raises FailedPrecondition (one line) if `quantization` cannot train on this host."""
    if quantization == "full":
        return
    if quantization not in ("4bit", "8bit"):
        raise ValueError(f"advanced.quantization: {quantization!r} is not one of full, 4bit, 8bit")
    device = pick_device(gpu_selection)
    problem = _quantization_problem(quantization, device)
    if problem is not None:
        label = {"4bit": "4-bit QLoRA", "8bit": "8-bit"}[quantization]
        raise FailedPrecondition(f"advanced.quantization: {label} cannot run on this worker: {problem}")


def quiet_bitsandbytes() -> None:
    """bitsandbytes warns on every int8 matmul on CPU ("inputs will be cast ... to float16")."""
    warnings.filterwarnings("ignore", message=".*inputs will be cast from.*")
