"""Writes a Supervised (SFT) dataset of worked Math Pairs problems: chats in the `messages` format,
the problem as the reward renders it and the worked solution as the assistant's answer.

    .venv/bin/python examples/sft/make_math_pairs.py              # examples/sft/math-pairs/{train,test}.jsonl
    .venv/bin/python examples/sft/make_math_pairs.py --style full --train 2000 --out /data/mp

The train split draws from Math Pairs' training problems (seed 0), the test split from its
held-out ones, so an SFT job's held-out loss (advanced.eval_every) is measured on problems the RLVR
benchmark keeps for itself. `--style compact` (the default) is the prompt the bundled rlvr-tiny
models read; `--style full` adds the answer-format instruction, as a pretrained model gets it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rlvr.tasks import math_pairs as mp
from rlvr.tasks.render import COMPACT_STYLE, FULL_STYLE, prompt_messages


def chat(problem: mp.Problem, style: str) -> dict[str, object]:
    messages = prompt_messages(problem, style)  # type: ignore[arg-type]  # a PromptStyle
    answer = mp.worked_solution(mp.parse_numbers(problem.question))
    return {"messages": [*messages, {"role": "assistant", "content": answer}]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "math-pairs")
    p.add_argument("--train", type=int, default=512)
    p.add_argument("--test", type=int, default=64)
    p.add_argument("--style", choices=(COMPACT_STYLE, FULL_STYLE), default=COMPACT_STYLE)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for split, problems in (("train", mp.training_problems(args.train, 0)), ("test", mp.heldout_problems(args.test))):
        with (args.out / f"{split}.jsonl").open("w", encoding="utf-8") as f:
            for problem in problems:
                f.write(json.dumps(chat(problem, args.style)) + "\n")
        print(f"{args.out / f'{split}.jsonl'}: {len(problems)} chats")


if __name__ == "__main__":
    main()
