"""Where the SDK connects: the local stack's state file (`rlvr up`), the services' addresses and
tokens, and `ClientSettings`, the settings every client is built from (rlvr.clients.sdk re-exports it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Self, TypeVar

from pydantic import Field, PrivateAttr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from rlvr.common.auth import ChannelAuth
from rlvr.common.client import DEFAULT_ADDRESSES
from rlvr.peers.base import AsyncServiceClient, ServiceClient

ClientT = TypeVar("ClientT", bound=ServiceClient | AsyncServiceClient)


def stack_home() -> Path:
    """Where `rlvr up` keeps a stack's state by default: $RLVR_HOME/stack."""
    from rlvr.common.settings import rlvr_home

    return rlvr_home() / "stack"


def read_stack_file(home: Path | None = None) -> dict[str, object] | None:
    """The state a running `rlvr up` keeps in `<home>/stack.json` (default $RLVR_HOME/stack): its
    addresses, its tokens file and its NATS file; None when no stack runs there (no file, or one
    left by a stack whose process is gone)."""
    import json

    path = (home if home is not None else stack_home()) / "stack.json"
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict):
        return None
    pid = state.get("pid")
    if isinstance(pid, int) and pid > 0:  # `rlvr up` itself: its stack.json outlives a kill -9
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass  # alive, another user's
    return state


def dialable(address: str) -> str:
    """A listening address as a client dials it: a service bound to every interface (0.0.0.0, ::)
    is reached on loopback."""
    host, _, port = address.rpartition(":")
    if host == "0.0.0.0":
        return f"127.0.0.1:{port}"
    if host in ("[::]", "::"):
        return f"[::1]:{port}"
    return address


def stack_addresses(state: dict[str, object] | None) -> dict[str, str]:
    """The five services' addresses of a stack's state (`read_stack_file`), as clients dial them."""
    addresses = state.get("addresses") if state else None
    if not isinstance(addresses, dict):
        return {}
    return {name: dialable(str(a)) for name, a in addresses.items() if name in DEFAULT_ADDRESSES}


def stack_user_token(state: dict[str, object]) -> str | None:
    """The user token of a local stack (its tokens file, 0600, readable by whoever started it)."""
    from rlvr.common.auth import read_tokens_file
    from rlvr.common.settings import SettingsError

    tokens_file = state.get("tokens_file")
    if not isinstance(tokens_file, str):
        return None
    try:
        tokens = read_tokens_file(Path(tokens_file))
    except SettingsError:
        return None
    return next((token for token, role in tokens.items() if role == "user"), None)


class ClientSettings(BaseSettings):
    """Where the services are and how to reach them: each address given (an argument, or the
    environment's `RLVR_SCHEDULER_ADDRESS`, ...), else the running local stack's (`rlvr up`, its
    stack.json under $RLVR_HOME/stack), else the default ports on 127.0.0.1 (`origin(service)`
    says which). The token and TLS files from `RLVR_TOKEN`, `RLVR_CA_FILE`, ...

    With no token set, the token of the local stack is sent to each service whose address here is
    one of that stack's (`auth(service)`): it is never sent anywhere else."""

    model_config = SettingsConfigDict(env_prefix="RLVR_", extra="ignore", use_attribute_docstrings=True)

    scheduler_address: str = DEFAULT_ADDRESSES["scheduler"]
    """The scheduler service (HOST:PORT): jobs, loops, metrics; the public API."""
    trainer_address: str = DEFAULT_ADDRESSES["trainer"]
    """A trainer worker (HOST:PORT); normally only the scheduler calls it."""
    reward_address: str = DEFAULT_ADDRESSES["reward"]
    """The reward service (HOST:PORT)."""
    rollout_address: str = DEFAULT_ADDRESSES["rollout"]
    """The rollout service (HOST:PORT)."""
    benchmark_address: str = DEFAULT_ADDRESSES["benchmark"]
    """The benchmark service (HOST:PORT)."""
    timeout: float | None = Field(default=None, gt=0)
    """Deadline in seconds for unary calls and uploads; unset = the per-method defaults of
    rlvr.common.client (30 s for most calls). Streams (Watch*, Generate, downloads) keep their own
    longer defaults; pass `timeout=` to a call to change one."""

    token: str | None = Field(default=None, repr=False)
    """Bearer token sent on every call (RLVR_TOKEN); unset = the local stack's, else none."""
    ca_file: Path | None = None
    """TLS: the CA certificate (PEM) the services' certificates chain to (RLVR_CA_FILE); unset =
    plaintext."""
    cert_file: Path | None = None
    """Mutual TLS: this client's certificate (PEM, RLVR_CERT_FILE), for services that ask for one."""
    key_file: Path | None = None
    """Mutual TLS: the key of cert_file (RLVR_KEY_FILE)."""

    _origins: dict[str, str] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _local_stack(self) -> Self:
        stack = stack_addresses(read_stack_file())
        for name in DEFAULT_ADDRESSES:
            field = f"{name}_address"
            if field in self.model_fields_set:
                env = os.environ.get(f"RLVR_{name.upper()}_ADDRESS")
                self._origins[name] = "env" if env is not None and env.strip() == self.address(name) else "given"
            elif name in stack:
                setattr(self, field, stack[name])
                self._origins[name] = "stack"
            else:
                self._origins[name] = "default"
        if self.token is None:  # every service the stack's: the token for all of them
            self.token = self._stack_token(*(self.address(name) for name in DEFAULT_ADDRESSES))
        return self

    def origin(self, service: str) -> str:
        """Where `service`'s address came from: "given" (an argument, e.g. the CLI's --address),
        "env" (RLVR_<SERVICE>_ADDRESS), "stack" (the running local stack's stack.json) or
        "default" (127.0.0.1 and the default port: no local stack runs)."""
        return self._origins.get(service, "given")

    @staticmethod
    def _stack_token(*addresses: str) -> str | None:
        """The local stack's user token when each of `addresses` is one of its services' (a stack
        bound to 0.0.0.0 or :: is reached on loopback); else None. One read of its stack.json."""
        state = read_stack_file()
        theirs_by_name = state.get("addresses") if state else None
        if not state or not isinstance(theirs_by_name, dict):
            return None
        theirs = [str(a).rpartition(":") for a in theirs_by_name.values()]
        loopback = {"127.0.0.1", "localhost", "[::1]", "::1"}

        def reached(address: str) -> bool:
            host, _, port = address.rpartition(":")
            return any(their_port == port and (their_host == host or their_host in ("0.0.0.0", "[::]", "::")
                                               and host in loopback) for their_host, _, their_port in theirs)

        return stack_user_token(state) if all(reached(a) for a in addresses) else None

    @classmethod
    def for_stack(cls, home: Path | None = None, **overrides: object) -> ClientSettings:
        """Settings for the stack a `rlvr up` (or `rlvr.clients.stack.Stack`) runs at `home` (default
        $RLVR_HOME/stack): its addresses and its user token, from its stack.json."""
        state = read_stack_file(home)
        if state is None:
            where = home if home is not None else "$RLVR_HOME/stack"
            raise FileNotFoundError(f"no running stack at {where} (no stack.json)")
        values: dict[str, object] = {f"{name}_address": address for name, address in stack_addresses(state).items()}
        values["token"] = stack_user_token(state)
        return cls(**{**values, **overrides})  # type: ignore[arg-type]

    def address(self, service: str) -> str:
        """The address of a service by short name ("reward")."""
        return str(getattr(self, f"{service}_address"))

    def client(self, cls: type[ClientT]) -> ClientT:
        """A client of `cls`'s service (sync or async) at its address here, with its timeout and
        auth (`auth(cls.service)`)."""
        return cls(self.address(cls.service), timeout=self.timeout, auth=self.auth(cls.service))

    def auth(self, service: str | None = None) -> ChannelAuth:
        """The token and TLS material a client presents: to `service` ("scheduler", ...), the local
        stack's token when no token is set and that service's address here is the stack's, even
        if other addresses are not (`rlvr jobs list --address HOST:PORT` on a stack started with
        --base-port)."""
        token = self.token
        if token is None and service is not None:
            token = self._stack_token(self.address(service))
        return ChannelAuth.from_files(token, self.ca_file, self.cert_file, self.key_file)
