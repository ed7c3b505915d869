"""``python -m rlvr.tiny``: build the tiny base model, or measure a model's held-out accuracy.

The ``rlvr models build-tiny`` CLI command calls :func:`main` with its arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from rlvr.tiny.model import SIZES


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rlvr.tiny", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="build (or reuse) the tiny base model and print its report")
    build.add_argument("--size", choices=sorted(SIZES), default="default")
    build.add_argument("--seed", type=int, default=0)
    build.add_argument("--out", default=None, help="output directory (default: $RLVR_HOME/models/rlvr-tiny)")
    build.add_argument("--force", action="store_true", help="rebuild even when a build exists")
    build.add_argument("--json", action="store_true", help="print the report as JSON")
    build.add_argument("--eval-n", type=int, default=500, help="held-out problems the report's accuracy is measured on")
    evaluate = commands.add_parser("eval", help="greedy accuracy of a model on held-out Math Pairs")
    evaluate.add_argument("model", help="model directory")
    evaluate.add_argument("-n", type=int, default=500)
    evaluate.add_argument("--seed", type=int, default=0)
    untrained = commands.add_parser("untrained", help="write a randomly initialised model (no warm-up)")
    untrained.add_argument("out")
    untrained.add_argument("--size", choices=sorted(SIZES), default="test")
    untrained.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # heavy imports only after parsing, so --help answers at once
    if args.command == "build":
        from dataclasses import asdict

        from rlvr.tiny.build import build_tiny_model

        def progress(message: str) -> None:
            print(message, file=sys.stderr, flush=True)

        report = build_tiny_model(
            args.out, size=args.size, seed=args.seed, progress=progress, force=args.force, eval_n=args.eval_n
        )
        print(json.dumps(asdict(report), indent=2) if args.json else report.summary())
    elif args.command == "eval":
        from rlvr.tiny.build import evaluate_heldout

        accuracy, n = evaluate_heldout(args.model, n=args.n, seed=args.seed)
        print(f"greedy held-out Math Pairs accuracy {accuracy:.1%} on {n} problems")
    else:
        from rlvr.tiny.model import build_untrained_model

        print(build_untrained_model(args.out, size=args.size, seed=args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
