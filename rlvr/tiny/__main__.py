"""``python -m rlvr.tiny``: build the tiny base model, or measure a model's held-out accuracy (and,
with ``eval --diagnose``, where its errors lie: ``rlvr models inspect``; with ``eval --tools``, the
two-turn calculator protocol of the tools model, ``build --size tools``); ``ship`` puts a build
into the package as the copy rlvr ships (rlvr.tiny.shipped).

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
    build.add_argument("--out", default=None, help="output directory (default: $RLVR_HOME/models/rlvr-tiny, "
                                                   "rlvr-tiny-<size>; rlvr-tiny-headroom.rebuilt for the model rlvr "
                                                   "ships built, which is then compared with the shipped bits)")
    build.add_argument("--force", action="store_true", help="rebuild even when a build exists")
    build.add_argument("--json", action="store_true", help="print the report as JSON")
    build.add_argument("--eval-n", type=int, default=500, help="held-out problems the report's accuracy is measured on")
    evaluate = commands.add_parser("eval", help="greedy accuracy of a model on held-out Math Pairs; with --diagnose "
                                                "also pass@k, maj@k, zero-spread groups and per-part accuracy")
    evaluate.add_argument("model", help="model directory (any saved causal LM with its tokenizer)")
    evaluate.add_argument("-n", type=int, default=500)
    evaluate.add_argument("--seed", type=int, default=0)
    evaluate.add_argument("--diagnose", action="store_true", help="sample k completions per problem and print "
                                                                  "where the errors lie (rlvr/tiny/diagnose.py)")
    evaluate.add_argument("-k", type=int, default=16, help="--diagnose, --tools: samples per problem (2-64, default 16)")
    evaluate.add_argument("--group", type=int, default=8, help="--diagnose: GRPO group size for the zero-spread "
                                                               "share (2-k, default 8)")
    evaluate.add_argument("--temperature", type=float, default=0.3, help="--diagnose, --tools: sampling temperature "
                                                                         "(default 0.3, the demo's)")
    evaluate.add_argument("--split", choices=("heldout", "train"), default="heldout",
                          help="--diagnose: the problems (train: the training distribution, to design on)")
    evaluate.add_argument("--tools", action="store_true", help="run the two-turn calculator protocol (rlvr/tiny/tools.py): "
                                                               "accuracy, tool use, accuracy with and without the "
                                                               "tool, greedy and k sampled episodes per problem")
    evaluate.add_argument("--json", action="store_true", help="--diagnose, --tools: print the measures as JSON")
    ship = commands.add_parser("ship", help="copy a build into the package as the model rlvr ships under its name "
                                            "and record every file's sha256 in rlvr/data/models/manifest.json")
    ship.add_argument("build", help="a build's folder (with its rlvr_build.json)")
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
        if not args.json:  # the JSON is the report alone (a pinned build's child hands it back)
            _compare_with_shipped(report.size, report.path)
    elif args.command == "ship":
        _ship(args.build)
    elif args.command == "eval" and args.tools:
        from rlvr.tiny.tools import evaluate_saved

        greedy, sampled = evaluate_saved(args.model, n=args.n, k=args.k, temperature=args.temperature, seed=args.seed)
        if args.json:
            print(json.dumps({"greedy": greedy.as_dict(), "sampled": sampled.as_dict()}, indent=2))
        else:
            print(f"{args.model}\n{greedy.line()}\n{sampled.line()}")
    elif args.command == "eval" and args.diagnose:
        from rlvr.tiny.diagnose import diagnose

        try:
            found = diagnose(args.model, n=args.n, k=args.k, group=args.group, temperature=args.temperature,
                             split=args.split, seed=args.seed)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(json.dumps(found.as_dict(), indent=2) if args.json else found.table())
    elif args.command == "eval":
        from rlvr.tiny.build import evaluate_heldout

        accuracy, n = evaluate_heldout(args.model, n=args.n, seed=args.seed)
        print(f"greedy held-out Math Pairs accuracy {accuracy:.1%} on {n} problems")
    else:
        from rlvr.tiny.model import build_untrained_model

        print(build_untrained_model(args.out, size=args.size, seed=args.seed))
    return 0


def _compare_with_shipped(size: str, folder: str) -> None:
    from pathlib import Path

    from rlvr.tiny.build import default_model_name
    from rlvr.tiny.shipped import compare_with_shipped, is_shipped

    name = default_model_name(size)
    if is_shipped(name):
        print(compare_with_shipped(name, Path(folder)))


def _ship(folder: str) -> None:
    import platform
    from pathlib import Path

    import torch
    import transformers

    from rlvr.tiny.build import REPORT_FILE, default_model_name
    from rlvr.tiny.shipped import SHIPPED_ROOT, ship

    report = json.loads((Path(folder) / REPORT_FILE).read_text())
    varies = ("path", "build_seconds", "cpu_seconds")  # where and how fast: not the model
    record = {k: v for k, v in report.items() if k not in varies}
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        cpuinfo = []
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")),
               platform.processor() or "an unnamed CPU")
    built_on = f"{cpu} ({platform.machine()}), torch {torch.__version__}, transformers {transformers.__version__}"
    name = default_model_name(str(report["size"]))
    files = ship(name, Path(folder), record, built_on, skip={REPORT_FILE})
    print(f"{name} ships from {SHIPPED_ROOT / name}, built on {built_on}:")
    for rel, sha in files.items():
        print(f"  {sha}  {rel}")


if __name__ == "__main__":
    sys.exit(main())
