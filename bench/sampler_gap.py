"""Sampler/trainer logprob gap: how far a job's trained policy is from the engine that samples for it.

    python bench/sampler_gap.py                               # rlvr-tiny: fp32 sampler vs fp32, bf16, 4bit, 8bit trainers
    python bench/sampler_gap.py --sampler-dtype bfloat16 --trainers fp32,bf16
    python bench/sampler_gap.py --device cuda --model /path/to/model   # on a GPU host (bench/gpu_check.py does)

The sampler is the base model in `--sampler-dtype` (what the rollout server or the colocated vLLM engine
loads: the full-precision weights, the job's adapter at B = 0 adding nothing); it samples `--prompts`
training prompts (temperature 1, the whole distribution) and scores its own tokens (the log-softmax of
logits / temperature: vLLM's processed_logprobs). Each trainer configuration is the policy a job
trains (`runner.load_policy`: the base in advanced.precision's dtype, quantized by bitsandbytes for
4bit/8bit, under a fresh LoRA), scoring the same tokens in one forward as TRL's training forward does
(bf16/fp16 under autocast). Per configuration: the mean and the largest |log p_trainer - log p_sampler|
over the completion tokens (MetricEvent.logprob_gap: TRL's and verl's sampling_logp_difference), and
the share of tokens whose importance ratio exp(log p_trainer - log p_sampler) exceeds TRL's
truncation at 3 (LAG_CORRECTION), i.e. where the correction is cut.

Each configuration is measured `--repeats` times (at least 3; each repeat its own seed: other prompts,
other samples); the table prints the median and the range. A configuration this host cannot run
(bitsandbytes without a usable backend, fp16 on a CPU) is a row saying why. Writes JSON (`--out`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from repeats import Spread, check_repeats  # noqa: E402  (bench/repeats.py)

TRAINERS = {  # row name -> (advanced.precision, advanced.quantization)
    "fp32": ("fp32", "full"), "bf16": ("bf16", "full"), "fp16": ("fp16", "full"),
    "4bit": ("fp32", "4bit"), "8bit": ("fp32", "8bit"),
}
TRUNCATION = 3.0  # grpo_trainer.LAG_CORRECTION's vllm_importance_sampling_clip_max


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="rlvr-tiny", help="base model: rlvr-tiny[-test|-small], hub id or folder")
    p.add_argument("--sampler-dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--trainers", default="fp32,bf16,4bit,8bit", help=f"comma list of {', '.join(TRAINERS)}")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--repeats", type=check_repeats, default=3, help="runs per configuration (>= 3)")
    p.add_argument("--device", default="auto", help="auto (cuda when there is one), cpu or cuda")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--out", type=Path, default=Path(".rlvr/bench/sampler_gap.json"))
    args = p.parse_args(argv)
    args.trainers = [t.strip() for t in args.trainers.split(",") if t.strip()]
    if bad := [t for t in args.trainers if t not in TRAINERS]:
        p.error(f"--trainers: unknown {', '.join(bad)}; choose from {', '.join(TRAINERS)}")
    return args


@dataclass
class Gap:
    mean: float
    max: float
    truncated: float  # share of tokens whose ratio exceeds TRUNCATION
    tokens: int


def token_logprobs(model: Any, sequences: Any, prompt_len: int, temperature: float, autocast: Any = None) -> Any:
    """(B, T) log-probabilities of each completion token (positions from prompt_len on) under `model`,
    of logits / temperature, in float32."""
    import contextlib

    import torch

    with torch.no_grad(), (autocast or contextlib.nullcontext()):
        logits = model(input_ids=sequences).logits[:, prompt_len - 1:-1].float() / max(temperature, 1e-6)
    return torch.log_softmax(logits, dim=-1).gather(-1, sequences[:, prompt_len:, None]).squeeze(-1)


def sample(base: str, tokenizer: Any, prompts: list[str], args: argparse.Namespace, seed: int, device: str
           ) -> tuple[Any, Any, int]:
    """(sequences (B, P + T), the sampler's logprobs of their completion tokens (B, T), P): each prompt
    sampled once by the full-precision base in --sampler-dtype, prompts left-padded to one length."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=getattr(torch, args.sampler_dtype)).to(device).eval()
    tokenizer.padding_side = "left"
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(**batch, do_sample=True, temperature=args.temperature, top_k=0, top_p=1.0,
                             max_new_tokens=args.max_tokens, min_new_tokens=args.max_tokens,
                             pad_token_id=tokenizer.pad_token_id)
    prompt_len = batch["input_ids"].shape[1]
    logps = token_logprobs(model, out, prompt_len, args.temperature)
    del model
    return out, logps, prompt_len


def trainer_gap(base: str, name: str, sequences: Any, sampler_logps: Any, prompt_len: int,
                args: argparse.Namespace, device: str, work: Path) -> Gap:
    """The gap of trainer configuration `name` (TRAINERS) on the sampler's tokens."""
    import torch

    from rlvr.services.trainer.job.config import job_config
    from rlvr.services.trainer.job.quantization import check_precision, check_quantization, quiet_bitsandbytes
    from rlvr.services.trainer.job.runner import load_policy

    precision, quantization = TRAINERS[name]
    gpu = "cpu" if device == "cpu" else "auto"
    check_precision(precision, gpu)  # FailedPrecondition: the row says why
    check_quantization(quantization, gpu)
    quiet_bitsandbytes()
    job = job_config(f"gap-{name}", base, work, precision=precision, quantization=quantization, lora_rank=8)
    model, _ = load_policy(job, base, device)
    model.train()  # TRL's training forward (lora_dropout 0: the same numbers as eval)
    autocast = (torch.autocast(device_type=device.split(":")[0], dtype=getattr(torch, {"bf16": "bfloat16",
                "fp16": "float16"}[precision])) if precision != "fp32" else None)
    logps = token_logprobs(model, sequences, prompt_len, args.temperature, autocast)
    delta = (logps - sampler_logps).abs().flatten()
    ratio = torch.exp(logps - sampler_logps).flatten()
    del model
    return Gap(float(delta.mean()), float(delta.max()), float((ratio > TRUNCATION).float().mean()), delta.numel())


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every trainer configuration's gaps over the repeats: {name: {"mean": Spread, ...} | {"error": str}}."""
    import random

    import torch
    from transformers import AutoTokenizer

    from rlvr.services.trainer.job.config import job_config
    from rlvr.services.trainer.job.runner import one_line, resolve_base_model, training_prompts

    if args.threads:
        torch.set_num_threads(args.threads)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    base = resolve_base_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(base)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    gaps: dict[str, list[Gap]] = {t: [] for t in args.trainers}
    errors: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="rlvr-gap-") as tmp:
        every = [p for p, _ in training_prompts(job_config("gap", base, Path(tmp)), tokenizer)]
        for repeat in range(args.repeats):
            prompts = random.Random(repeat).sample(every, min(args.prompts, len(every)))
            sequences, sampler_logps, prompt_len = sample(base, tokenizer, prompts, args, repeat, device)
            for name in args.trainers:
                if name in errors:
                    continue
                try:
                    gaps[name].append(trainer_gap(base, name, sequences, sampler_logps, prompt_len, args, device,
                                                  Path(tmp)))
                except Exception as e:  # noqa: BLE001 (a configuration this host cannot run is its row)
                    errors[name] = one_line(e)
    result: dict[str, Any] = {"device": device}
    for name in args.trainers:
        if name in errors:
            result[name] = {"error": errors[name]}
            continue
        result[name] = {key: Spread.of([getattr(g, key) for g in gaps[name]]) for key in ("mean", "max", "truncated")}
        result[name]["tokens"] = sum(g.tokens for g in gaps[name])
    return result


def print_table(result: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"sampler: {args.model} in {args.sampler_dtype} on {result['device']}, {args.prompts} prompts x "
          f"{args.max_tokens} tokens at temperature {args.temperature:g}; median [range] of {args.repeats} repeats")
    print(f"{'trainer':<10}{'mean |dlogp|':>26}{'max |dlogp|':>26}{'ratio > 3':>26}")
    for name in args.trainers:
        row = result[name]
        if "error" in row:
            print(f"{name:<10}  cannot run here: {row['error']}")
            continue
        print(f"{name:<10}{row['mean'].cell(4):>26}{row['max'].cell(3):>26}{row['truncated'].cell(4):>26}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started, load = time.perf_counter(), os.getloadavg()
    result = run(args)
    print_table(result, args)
    print(f"{time.perf_counter() - started:.0f} s; load average {load[0]:.1f} before, {os.getloadavg()[0]:.1f} after")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "args": {k: str(v) for k, v in vars(args).items()},
        "rows": {k: ({kk: vv.to_json() if isinstance(vv, Spread) else vv for kk, vv in v.items()}
                     if isinstance(v, dict) else v) for k, v in result.items()},
    }, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
