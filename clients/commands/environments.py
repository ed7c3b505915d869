"""`rlvr environments`: the environments an agent job's episodes may run in, as the scheduler lists
them (ListEnvironments): key, name, version, where it comes from, its tools and turns, then those
that failed to load, with why."""

from __future__ import annotations

import argparse
import sys

from rlvr.clients.commands import jobs as jobs_cmd


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("environments", help="the environments an agent job may run its episodes in: "
                                   "the built-ins and the plugins the scheduler has")
    parser.add_argument("--address", default=None, help="scheduler HOST:PORT")
    parser.set_defaults(handler=cmd_environments)


def cmd_environments(args: argparse.Namespace) -> int:
    """One line per environment (key, name, version, source, tools, max turns), its description
    under it, then those that failed to load."""
    from rlvr.clients.errors import explain
    from rlvr.clients.sdk import RlvrError
    from rlvr.v1 import scheduler_pb2

    try:
        response = jobs_cmd.scheduler_client(args).list_environments(scheduler_pb2.ListEnvironmentsRequest())
    except RlvrError as e:
        print(f"error: {explain(e)}", file=sys.stderr)
        return 1
    width = max((len(e.key) for e in [*response.environments, *response.unavailable]), default=3)
    for e in response.environments:
        tools = ", ".join(e.tools) or "no tools"
        columns = f"; reads {', '.join(e.columns)}" if e.columns else ""
        print(f"{e.key:<{width}}  {e.display_name} v{e.version} ({e.source}; tools: {tools}; "
              f"max_turns {e.max_turns}{columns})")
        if e.description:
            print(f"{'':<{width}}  {e.description}")
    for u in response.unavailable:
        print(f"{u.key:<{width}}  not loaded: {u.error}")
    if not response.environments and not response.unavailable:
        print("no environments")
    return 0
