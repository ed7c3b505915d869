"""Writes a Head dataset of Math Pairs verdicts: a problem and a worked answer to it (`text`), and
whether that answer is right (`label`: correct or wrong), half of each.

    .venv/bin/python examples/head/make_math_verdicts.py       # examples/head/math-verdicts/{train,test}.jsonl

A wrong answer is the worked solution with its product (and the answer) replaced by a near miss:
a number 1-12 away, or the product of a sum off by one, the mistakes a small model makes. The text
is the problem, a newline and the answer, as a head used as a reward reads a completion
(`rlvr.heads.sample_text`), so a head trained here can score Math Pairs completions (docs/head.md).
The train split draws from Math Pairs' training problems (seed 0), the test split from its held-out ones.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from rlvr.heads import sample_text
from rlvr.tasks import math_pairs as mp


def verdict(numbers: mp.Numbers, wrong: bool, rng: random.Random) -> dict[str, str]:
    a, b, c, d = numbers
    first, second = a + b, c + d
    product = first * second
    if wrong:
        if rng.random() < 0.5:
            product += rng.choice([-1, 1]) * rng.randint(1, 12)
        else:
            second += rng.choice([-1, 1])
            product = first * second
        product = product if product != (a + b) * (c + d) else product + 1
    answer = f"<think>{a}+{b}={a + b} {c}+{d}={c + d} {a + b}*{c + d}={product}</think><answer>{product}</answer>"
    return {"text": sample_text(mp.question(numbers), answer), "label": "wrong" if wrong else "correct"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "math-verdicts")
    p.add_argument("--train", type=int, default=512)
    p.add_argument("--test", type=int, default=128)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    for split, problems in (("train", mp.training_problems(args.train, 0)), ("test", mp.heldout_problems(args.test))):
        with (args.out / f"{split}.jsonl").open("w", encoding="utf-8") as f:
            for i, problem in enumerate(problems):
                f.write(json.dumps(verdict(mp.parse_numbers(problem.question), i % 2 == 1, rng)) + "\n")
        print(f"{args.out / f'{split}.jsonl'}: {len(problems)} rows")


if __name__ == "__main__":
    main()
