"""What the CLI says when a call fails: one line, in words, never raw gRPC text.

A service that cannot be reached (UNAVAILABLE) is named with the address dialled and where that
address came from (an option, RLVR_<SERVICE>_ADDRESS, the running local stack's stack.json, or the
default when no stack runs), followed by what to do: start a stack with `rlvr up`, or point the
CLI elsewhere (docs/cli.md lists the options and variables). Any other failure is the server's
own message, which by the contract names the field, the value and what is allowed.
"""

from __future__ import annotations

import os

import grpc

from rlvr.peers.base import RlvrError

DOCS = "docs/cli.md"

_CAUSES = (  # what gRPC's connect error text means, in words
    ("connection refused", "nothing listens there"),
    ("dns resolution failed", "the host name does not resolve"),
    ("handshake", "the TLS handshake failed (a TLS port needs RLVR_CA_FILE, a plaintext one none)"),
    ("ssl", "the TLS handshake failed (a TLS port needs RLVR_CA_FILE, a plaintext one none)"),
    ("timeout", "it did not answer in time"),
    ("deadline", "it did not answer in time"),
    ("no route", "no route to that host"),
)


def _cause(details: str) -> str:
    lowered = details.lower()
    return next((words for marker, words in _CAUSES if marker in lowered), "it did not answer")


def origin_of(service: str, address: str) -> str:
    """Where a CLI's `address` for `service` came from, judged as ClientSettings chose it:
    "env", "stack", "default" or "given" (an option)."""
    from rlvr.clients.connection import read_stack_file, stack_addresses
    from rlvr.common.client import DEFAULT_ADDRESSES

    if os.environ.get(f"RLVR_{service.upper()}_ADDRESS", "").strip() == address:
        return "env"
    if stack_addresses(read_stack_file()).get(service) == address:
        return "stack"
    if DEFAULT_ADDRESSES.get(service) == address:
        return "default"
    return "given"


def unreachable(service: str, address: str, details: str = "", origin: str | None = None) -> str:
    """The message for a service that did not answer at `address`."""
    from rlvr.clients.connection import stack_home

    origin = origin or origin_of(service, address)
    variable = f"RLVR_{service.upper()}_ADDRESS"
    head = f"cannot reach the {service} service at {address}: {_cause(details)}"
    if origin == "stack":
        return (f"{head}. That address is the local stack's ({stack_home() / 'stack.json'}): is `rlvr up` still "
                "running? `rlvr status` shows each service's health")
    if origin == "default":
        return (f"{head}. No local stack runs (no {stack_home() / 'stack.json'}), so this is the default address. "
                f"Start one with `rlvr up`, or point the CLI at a running stack with --address HOST:PORT or "
                f"{variable} (see {DOCS})")
    where = f"from {variable}" if origin == "env" else "given with --address"
    return (f"{head}. That address was {where}: check that the {service} service runs there (and RLVR_CA_FILE "
            f"if it serves TLS), or unset it to use the local stack (see {DOCS})")


# gRPC's own words for a connection that did not come about (a server's UNAVAILABLE, "scheduler
# shutting down", is its message and is shown as it is).
_NOT_CONNECTED = ("failed to connect", "connection refused", "dns resolution failed", "handshake", "socket closed",
                  "connection reset", "no route to host", "connections to all backends failing")


def is_unreachable(error: RlvrError) -> bool:
    """The call never reached a server: nothing listens, the host does not resolve, TLS failed."""
    details = error.details.lower()
    return error.code == grpc.StatusCode.UNAVAILABLE and any(marker in details for marker in _NOT_CONNECTED)


def invalid_fields(error: RlvrError) -> str:
    """An INVALID_ARGUMENT's message: with several bad fields (the status's BadRequest details),
    "N invalid fields:" and one "field: reason" line each; else the server's message."""
    if len(error.violations) < 2:
        return error.details
    return f"{len(error.violations)} invalid fields:\n" + "\n".join(f"  {f}: {d}" for f, d in error.violations)


def explain(error: RlvrError) -> str:
    """What to print for a failed call (no "error: " prefix): one line, or one per bad field."""
    if is_unreachable(error) and error.address:
        return unreachable(error.service or "the", error.address, error.details)
    return f"{error.code.name}: {invalid_fields(error)}"
