"""Generation helpers shared by the build and the diagnosis: torch's thread count, greedy decoding."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def torch_threads(threads: int | None = None) -> Iterator[int]:
    """Run with ``threads`` torch threads (default ``$RLVR_TINY_THREADS`` or 1), then restore.

    One thread by default, for two reasons: float reductions then run in one order on any machine,
    so a build is reproducible whatever the core count; and on this project's shared 2-core machines
    one thread measured 5-30x faster than two while other processes ran (OpenMP spin-waiting).
    """
    import torch

    count = max(1, threads or int(os.environ.get("RLVR_TINY_THREADS", "1")))
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield count
    finally:
        torch.set_num_threads(previous)


def generate_greedy(model, tokenizer, prompts: list[str], max_new_tokens: int, batch_size: int) -> list[str]:
    """Greedy completions (special tokens dropped; the answer tags are ordinary tokens and stay)."""
    import torch

    tokenizer.padding_side = "left"
    completions: list[str] = []
    with torch.inference_mode():
        for start in range(0, len(prompts), batch_size):
            batch = tokenizer(
                prompts[start : start + batch_size],
                return_tensors="pt",
                padding=True,
                add_special_tokens=False,
            )
            out = model.generate(
                **batch, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
            completions += tokenizer.batch_decode(
                out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True
            )
    return completions
