"""Who may call what: bearer tokens with roles, the table of internal RPCs, and TLS material.

A caller sends `authorization: Bearer <token>` metadata. A token has one of two roles:

- `user`: the people and programs that use the stack (the SDK, the CLI, the web console); they may
  call every public RPC;
- `service`: the stack's own services calling each other (the scheduler its trainers, a trainer its
  rollout and reward servers, ...); they may call everything, including the internal RPCs in
  `SERVICE_ONLY`.

A service's tokens come from its settings (`rlvr.common.settings.ServiceSettings`): the shared
secret `auth_token` (or `auth_token_file`), role service, which is also the token the service sends
to its peers; and `auth_tokens_file`, a JSON object mapping each token to its role. No token at all
means no auth (today's behaviour, allowed on loopback only unless `allow_insecure`). The server side
(the interceptor) lives in rlvr.services.common.server; this module is what clients and servers share.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from rlvr.common.settings import ServiceSettings, SettingsError, read_secret_file, setting_label

Role = Literal["user", "service"]
ROLES: tuple[Role, ...] = ("user", "service")

SERVICE_ONLY: dict[str, str] = {
    # The trainer is driven by the scheduler: a user who starts, cancels or merges on a worker
    # directly bypasses the queue, the store and the job's record.
    "rlvr.v1.TrainerService/StartJob": "users create jobs with SchedulerService/CreateJob",
    "rlvr.v1.TrainerService/CancelJob": "users cancel jobs with SchedulerService/CancelJob",
    "rlvr.v1.TrainerService/GetWorkerStatus": "users follow jobs with SchedulerService/GetJob and WatchJob",
    "rlvr.v1.TrainerService/MergeAdapter": "users merge with SchedulerService/MergeModel",
    "rlvr.v1.TrainerService/FetchFolder": "users download with SchedulerService/DownloadAdapter and DownloadMergedModel",
    # Adapters go live on the rollout server only from the trainer (each step's version) and the
    # benchmark service (an evaluated adapter); a user upload could replace a job's live version.
    "rlvr.v1.RolloutService/LoadAdapter": "adapters are pushed by the trainer and the benchmark service",
    "rlvr.v1.RolloutService/UnloadAdapter": "adapters are managed by the trainer and the benchmark service",
}
"""The internal RPCs: only the service role may call them (PERMISSION_DENIED for a user token),
each with what a user does instead. Everything else is public (any valid token). Health
(grpc.health.v1) and reflection need no token at all (`OPEN_SERVICES`)."""

OPEN_SERVICES: tuple[str, ...] = ("grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                                  "grpc.reflection.v1.ServerReflection")
"""Services answered without a token: liveness probes and tools that list the API."""

HOW_TO_SEND = ("send the metadata `authorization: Bearer <token>` (the SDK and the CLI read RLVR_TOKEN; "
               "`rlvr up` hands its own clients the local stack's token)")


def bearer(metadata: object) -> str | None:
    """The token of an `authorization: Bearer <token>` entry of gRPC metadata, None if none;
    "" when the entry is there but not in that form."""
    for key, value in metadata or ():  # type: ignore[attr-defined]
        if key.lower() == "authorization":
            text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
            scheme, _, token = text.strip().partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return None


@dataclass(frozen=True)
class TokenTable:
    """The tokens a service accepts, each with its role."""

    tokens: tuple[tuple[bytes, Role], ...] = ()

    @property
    def enabled(self) -> bool:
        return bool(self.tokens)

    def role_of(self, token: str) -> Role | None:
        """The role of `token`, None if it is none of ours. Every known token is compared (in
        constant time each), so the answer's timing tells nothing about which one came close."""
        given = token.encode()
        found: Role | None = None
        for known, role in self.tokens:
            if hmac.compare_digest(given, known) and found is None:
                found = role
        return found


def read_tokens_file(path: Path, what: str = "auth_tokens_file") -> dict[str, Role]:
    """A tokens file: a JSON object {"<token>": "user" | "service"}."""
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise SettingsError(f"{what}: cannot read {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise SettingsError(f"{what}: {path} is not JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(data, dict):
        raise SettingsError(f"{what}: {path} must hold a JSON object {{\"<token>\": \"user\" | \"service\"}}")
    out: dict[str, Role] = {}
    for i, (token, role) in enumerate(data.items()):
        if role not in ROLES:
            raise SettingsError(f"{what}: {path}: entry {i + 1} has role {role!r}; allowed: user, service")
        if not token.strip():
            raise SettingsError(f"{what}: {path}: entry {i + 1} has an empty token")
        out[token.strip()] = role
    return out


def service_token(settings: ServiceSettings) -> str | None:
    """The shared secret of a service's settings (auth_token, else the content of auth_token_file)."""
    if settings.auth_token:
        return settings.auth_token.strip() or None
    if settings.auth_token_file is not None:
        return read_secret_file(settings.auth_token_file, setting_label(settings, "auth_token_file"))
    return None


def token_table(settings: ServiceSettings) -> TokenTable:
    """Every token a service accepts. Raises SettingsError (one line) for an unreadable file."""
    tokens: dict[str, Role] = {}
    if settings.auth_tokens_file is not None:
        tokens.update(read_tokens_file(settings.auth_tokens_file, setting_label(settings, "auth_tokens_file")))
    shared = service_token(settings)
    if shared:
        tokens[shared] = "service"
    return TokenTable(tuple((t.encode(), r) for t, r in tokens.items()))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(settings: ServiceSettings, tokens: TokenTable) -> None:
    """Refuses to serve beyond loopback without auth, unless allow_insecure says so."""
    if tokens.enabled or settings.allow_insecure or is_loopback(settings.host):
        return
    raise SettingsError(
        f"{setting_label(settings, 'host')} = {settings.host!r}: serving beyond loopback without auth is refused; "
        f"set a token ({setting_label(settings, 'auth_token')}, or auth_token_file / auth_tokens_file; "
        "RLVR_AUTH_TOKEN for every service), or allow it explicitly with RLVR_ALLOW_INSECURE=true")


def _read(path: Path | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as e:
        raise SettingsError(f"{what}: cannot read {path}: {e.strerror}") from None


@dataclass(frozen=True)
class ChannelAuth:
    """What a client presents to the services: a bearer token, and for TLS the CA to trust (and,
    for mutual TLS, its own certificate and key). Empty: plaintext without a token."""

    token: str | None = field(default=None, repr=False)
    ca: bytes | None = field(default=None, repr=False)
    cert: bytes | None = field(default=None, repr=False)
    key: bytes | None = field(default=None, repr=False)

    @property
    def tls(self) -> bool:
        return self.ca is not None

    @classmethod
    def from_files(cls, token: str | None = None, ca_file: Path | None = None, cert_file: Path | None = None,
                   key_file: Path | None = None) -> ChannelAuth:
        if (cert_file is None) != (key_file is None):
            raise SettingsError("a client certificate needs both its cert file and its key file")
        return cls(token=token or None, ca=_read(ca_file, "ca_file"), cert=_read(cert_file, "cert_file"),
                   key=_read(key_file, "key_file"))


def peer_auth(settings: ServiceSettings) -> ChannelAuth:
    """How a service calls its peers: its shared secret (role service); with tls_ca_file over TLS,
    presenting its own certificate (for peers that ask for mutual TLS)."""
    ca = _read(settings.tls_ca_file, setting_label(settings, "tls_ca_file"))
    with_cert = ca is not None and settings.tls_cert_file is not None and settings.tls_key_file is not None
    return ChannelAuth(
        token=service_token(settings), ca=ca,
        cert=_read(settings.tls_cert_file, setting_label(settings, "tls_cert_file")) if with_cert else None,
        key=_read(settings.tls_key_file, setting_label(settings, "tls_key_file")) if with_cert else None)


@dataclass(frozen=True)
class ServerTls:
    """A service's TLS material, read at start."""

    cert: bytes
    key: bytes
    client_ca: bytes | None  # set: callers must present a certificate it signed


def server_tls(settings: ServiceSettings) -> ServerTls | None:
    """The TLS material of a service's settings; None for plaintext. SettingsError for half a pair."""
    if settings.tls_cert_file is None and settings.tls_key_file is None:
        if settings.tls_client_auth:
            raise SettingsError(f"{setting_label(settings, 'tls_client_auth')}: mutual TLS needs tls_cert_file "
                                "and tls_key_file")
        return None
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        missing = "tls_key_file" if settings.tls_key_file is None else "tls_cert_file"
        raise SettingsError(f"{setting_label(settings, missing)}: TLS needs both tls_cert_file and tls_key_file")
    cert = _read(settings.tls_cert_file, setting_label(settings, "tls_cert_file"))
    key = _read(settings.tls_key_file, setting_label(settings, "tls_key_file"))
    assert cert is not None and key is not None
    client_ca = None
    if settings.tls_client_auth:
        client_ca = _read(settings.tls_ca_file, setting_label(settings, "tls_ca_file"))
        if client_ca is None:
            raise SettingsError(f"{setting_label(settings, 'tls_client_auth')}: mutual TLS needs tls_ca_file "
                                "(the CA that signs the callers' certificates)")
    return ServerTls(cert, key, client_ca)
