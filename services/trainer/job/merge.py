"""Merging an adapter into its base model: a full Hugging Face checkpoint under artifact_root/merged.

`merge_adapter` is the core (peft `merge_and_unload`, then `save_pretrained` with safetensors and
the tokenizer). The servicer runs it in a child process (`python -m rlvr.services.trainer.job.merge`, one
JSON progress line per stage on stdout) so that the base model's memory is returned afterwards and
a merge never shares a process with a training job. The checkpoint is written to a staging folder
and renamed into place, so a half-written merge never looks finished. A Head job's adapter
(rlvr/heads.py) merges into the base's sequence-classification model: a checkpoint that
AutoModelForSequenceClassification loads with its classes as labels.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from rlvr.jobspec import MERGE_DTYPES

Progress = Callable[[str, float], None]


def folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def merge_adapter(base_model: str, adapter_path: Path, output: Path, progress: Progress, dtype: str = "auto") -> int:
    """Writes base + adapter merged to `output` (which must not exist), in `dtype` ("auto": the base
    model's; "fp32", "bf16", "fp16": the base loaded in it, merged and written in it); returns its size
    in bytes."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvr.heads import head_model, read_head
    from rlvr.services.trainer.job.policy import resolve_base_model
    from rlvr.services.trainer.job.quantization import torch_dtype

    progress("loading", 0.05)
    base_path = resolve_base_model(base_model)
    # The base's own dtype (its config's; float32 when it names none): the merged model is written as
    # the base was, a bf16 checkpoint as bf16 (peft merges the float32 LoRA product into it).
    # Asked for another: the base loaded in it, so the merge itself runs in the dtype written.
    asked = torch_dtype(dtype) if dtype != "auto" else "auto"
    head = read_head(adapter_path)  # a Head job's: the base as its sequence-classification model, labels and all
    if head is not None:
        model, tokenizer = head_model(base_path, head, asked)
    else:
        model = AutoModelForCausalLM.from_pretrained(base_path, dtype=asked)
        tokenizer = AutoTokenizer.from_pretrained(base_path)
    if model.dtype not in (torch.float32, torch.bfloat16, torch.float16):  # e.g. a dequantized GGUF's
        model = model.float()
    progress("loading", 0.3)
    model = PeftModel.from_pretrained(model, str(adapter_path))
    progress("merging", 0.5)
    merged = model.merge_and_unload()
    progress("saving", 0.7)
    staging = output.with_name(f".{output.name}.staging")
    if staging.exists():
        shutil.rmtree(staging)
    merged.save_pretrained(str(staging), safe_serialization=True)
    tokenizer.save_pretrained(str(staging))
    for marker in ("rlvr_model.json",):  # the tiny model's prompt-style marker travels along
        if (Path(base_path) / marker).is_file():
            shutil.copy2(Path(base_path) / marker, staging / marker)
    staging.rename(output)
    return folder_size(output)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlvr.services.trainer.job.merge", description=__doc__)
    parser.add_argument("--base-model", required=True)
    parser.add_argument("--adapter", type=Path, required=True)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--dtype", choices=MERGE_DTYPES, default="auto")
    args = parser.parse_args(argv)

    def progress(stage: str, fraction: float) -> None:
        print(json.dumps({"stage": stage, "fraction": fraction}), flush=True)

    try:
        size = merge_adapter(args.base_model, args.adapter, args.output, progress, args.dtype)
    except Exception as e:  # one line for the servicer; the trace to stderr (the worker's log)
        import traceback

        traceback.print_exc()
        print(json.dumps({"error": f"{type(e).__name__}: {' '.join(str(e).split())}"[:500]}), flush=True)
        return 1
    print(json.dumps({"stage": "done", "fraction": 1.0, "path": str(args.output), "size_bytes": size}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
