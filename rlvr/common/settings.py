"""Service settings: one pydantic-settings model per service, read from flags, environment and a
config file, in that order of precedence (a flag beats the environment, which beats the file,
which beats the documented default).

Every field carries a docstring; it becomes the field's `--help` text and its docs entry. The
flag parser is derived from the model, so a new field is a flag, an environment variable
(`RLVR_<SERVICE>_<FIELD>`) and a config-file key at once. This module imports nothing heavy so
that `--help` answers at once.
"""

from __future__ import annotations

import argparse
import contextvars
import json
import tomllib
import typing
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

# Each service's port, declared once: the services' `--port` defaults, the clients' default
# addresses (rlvr.common.client.DEFAULT_ADDRESSES) and the local stack (`rlvr up`) derive from it.
DEFAULT_PORTS: dict[str, int] = {"scheduler": 50051, "trainer": 50052, "reward": 50053, "rollout": 50054,
                                 "benchmark": 50055}


def local_address(service: str) -> str:
    """The service's address on this host with its default port."""
    return f"127.0.0.1:{DEFAULT_PORTS[service]}"

_CONFIG_FILE: contextvars.ContextVar[Path | None] = contextvars.ContextVar("rlvr_config_file", default=None)


class SettingsError(ValueError):
    """A bad setting, reported as one line naming the setting."""


def read_secret_file(path: Path, what: str) -> str:
    """A one-line secret kept in a file (a token, a password, a URL with credentials): its text,
    stripped; a SettingsError naming the setting `what` when it cannot be read or is empty."""
    try:
        text = path.read_text().strip()
    except OSError as e:
        raise SettingsError(f"{what}: cannot read {path}: {e.strerror or e}") from None
    if not text:
        raise SettingsError(f"{what}: {path} is empty")
    return text

class _ConfigFileSource(PydanticBaseSettingsSource):
    """Reads the config file given by --config (TOML, JSON or YAML). A service's keys may sit at
    the top level or under a table named after the service (`[rollout]`), so one file can
    configure the whole stack."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ returns the whole mapping

    def __call__(self) -> dict[str, Any]:
        path = _CONFIG_FILE.get()
        if path is None:
            return {}
        data = read_config_file(path)
        section = data.get(getattr(self.settings_cls, "service_name", ""), {})
        flat = {k: v for k, v in data.items() if not isinstance(v, dict)}
        merged = {**flat, **(section if isinstance(section, dict) else {})}
        known = set(self.settings_cls.model_fields)
        return {k.replace("-", "_"): v for k, v in merged.items() if k.replace("-", "_") in known}


def read_config_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as e:
        raise SettingsError(f"config: cannot read config file {path}: {e.strerror}") from None
    try:
        if path.suffix == ".toml":
            return tomllib.loads(text)
        if path.suffix == ".json":
            return json.loads(text)
        if path.suffix in (".yaml", ".yml"):
            import yaml  # only needed for YAML files

            return yaml.safe_load(text) or {}
    except Exception as e:  # any parse error becomes one readable line
        raise SettingsError(f"config: cannot parse {path}: {e}") from None
    raise SettingsError(f"config: {path} must end in .toml, .json, .yaml or .yml")


class ServiceSettings(BaseSettings):
    """Settings every service has. Subclasses set `service_name` and the env prefix."""

    service_name: ClassVar[str] = "service"
    model_config = SettingsConfigDict(
        env_prefix="RLVR_", extra="ignore", use_attribute_docstrings=True, validate_default=True
    )

    host: str = "127.0.0.1"
    """Address the gRPC server binds to (0.0.0.0 to serve other hosts)."""
    port: int = Field(default=0, ge=0, le=65535)
    """gRPC port (0 = pick a free one; the chosen port is logged)."""
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    """Serve Prometheus metrics at http://HOST:PORT/metrics (0 = a free port, logged); unset = none
    served (docs/metrics.md). No auth: the metrics hold no secret, only counts and timings."""
    health_port: int | None = Field(default=None, ge=0, le=65535)
    """Also serve the gRPC health service (grpc.health.v1 alone: no other service, no token) in
    plaintext on this port, on `host` (0 = a free port, logged); unset = none. For probes that
    cannot speak TLS, such as Kubernetes' `grpc:` probe (docs/kubernetes.md); the main port stays
    TLS only. Also RLVR_HEALTH_PORT."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Log level."""
    log_format: Literal["json", "text"] = "json"
    """Structured JSON lines (default) or human-readable text."""
    grace_seconds: float = Field(default=10.0, ge=0, le=600)
    """On SIGTERM/SIGINT: how long in-flight calls may run before the server closes."""
    auth_token: str | None = Field(default=None, repr=False)
    """Shared secret (role service): accepted from callers as `authorization: Bearer <token>`, and
    sent by this service to its peers. Also RLVR_AUTH_TOKEN for every service. Unset with no
    tokens file: no auth (loopback only, unless allow_insecure)."""
    auth_token_file: Path | None = None
    """A file holding the shared secret (auth_token), e.g. a Docker secret; also RLVR_AUTH_TOKEN_FILE."""
    auth_tokens_file: Path | None = None
    """Per-client tokens: a JSON object {"<token>": "user" | "service", ...}; also RLVR_AUTH_TOKENS_FILE.
    Users may call every public RPC; only the service role may call the internal ones."""
    allow_insecure: bool = False
    """Serve beyond loopback (a host other than 127.0.0.1/::1/localhost) without auth; also
    RLVR_ALLOW_INSECURE. Off: such a start is refused."""
    tls_cert_file: Path | None = None
    """TLS: this service's certificate chain (PEM); with tls_key_file the port serves TLS only, and
    calls to peers present it as a client certificate. Also RLVR_TLS_CERT_FILE."""
    tls_key_file: Path | None = None
    """TLS: the private key of tls_cert_file (PEM); also RLVR_TLS_KEY_FILE."""
    tls_ca_file: Path | None = None
    """TLS: the CA certificate(s) (PEM) this service trusts when it calls its peers (and, with
    tls_client_auth, checks callers' certificates against); also RLVR_TLS_CA_FILE."""
    tls_client_auth: bool = False
    """Mutual TLS: callers must present a certificate signed by tls_ca_file; also RLVR_TLS_CLIENT_AUTH."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _SharedEnvSource(settings_cls), _ConfigFileSource(settings_cls))

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


SHARED_ENV_FIELDS = ("auth_token", "auth_token_file", "auth_tokens_file", "allow_insecure", "tls_cert_file",
                     "tls_key_file", "tls_ca_file", "tls_client_auth", "database_password_file", "nats_url_file",
                     "nats_ca_file", "metrics_port", "health_port", "remote_environments")
"""Settings every service also reads from `RLVR_<FIELD>` (after its own `RLVR_<SERVICE>_<FIELD>`), so
one environment (a compose file's, `rlvr up`'s) secures the whole stack."""


class _SharedEnvSource(PydanticBaseSettingsSource):
    """`RLVR_<FIELD>` for the fields in SHARED_ENV_FIELDS."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ returns the whole mapping

    def __call__(self) -> dict[str, Any]:
        import os

        found = {}
        for name in SHARED_ENV_FIELDS:
            value = os.environ.get(f"RLVR_{name.upper()}")
            if value is not None and name in self.settings_cls.model_fields:
                found[name] = value
        return found


def port_field(default: int) -> Any:
    """A gRPC port field with the range check every service shares."""
    return Field(default=default, ge=0, le=65535)


STARTS_IN = "the folder the service starts in"
"""How `--help` names a default that is the service's working folder (Path.cwd() when it starts)."""


def described_field(default_factory: typing.Callable[[], Any], default_help: str) -> Any:
    """A field whose default depends on where the service starts (its working folder): `--help`
    prints `default_help` for it, as the value in the shell that asks would mislead."""
    return Field(default_factory=default_factory, json_schema_extra={"default_help": default_help})


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _default_help(info: FieldInfo) -> str:
    """A field's default as `--help` prints it: what the flag would take to set that value (a comma
    list, a JSON object), "unset" for None, or the field's words for it (described_field)."""
    extra = info.json_schema_extra
    if isinstance(extra, dict) and isinstance(extra.get("default_help"), str):
        return str(extra["default_help"])
    default = info.get_default(call_default_factory=True)
    if default is None:
        return "unset"
    if isinstance(default, list | tuple):
        items = [str(v) for v in default]
        return ",".join(items) if items and not any("," in v for v in items) else json.dumps(items)
    if isinstance(default, dict):
        return json.dumps(default, default=str)
    return str(default)


def _field_type_help(info: FieldInfo) -> str:
    ann = info.annotation
    if typing.get_origin(ann) is Literal:
        return "{" + ",".join(str(a) for a in typing.get_args(ann)) + "}"
    return getattr(ann, "__name__", str(ann)).replace("typing.", "")


def build_parser(cls: type[ServiceSettings], prog: str, description: str) -> argparse.ArgumentParser:
    """An argparse parser with one flag per settings field, help text from the field docstring."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=f"Every flag is also the environment variable {cls.model_config.get('env_prefix')}<NAME> "
        "and a key in the --config file (top level or under a [" + cls.service_name + "] table).",
    )
    parser.add_argument("--config", type=Path, default=None, help="TOML, JSON or YAML config file")
    for name, info in cls.model_fields.items():
        help_text = f"{info.description or ''} [{_field_type_help(info)}; default: {_default_help(info)}]"
        if info.annotation is bool:
            parser.add_argument(_flag(name), dest=name, action=argparse.BooleanOptionalAction,
                                default=None, help=help_text)
        else:
            parser.add_argument(_flag(name), dest=name, default=None, metavar=name.upper(), help=help_text)
    return parser


def setting_label(settings: ServiceSettings | type[ServiceSettings], field: str) -> str:
    """How every start-up error names a setting: `setting port (--port / RLVR_REWARD_PORT)`."""
    env = f"{settings.model_config.get('env_prefix', '')}{field}".upper()
    return f"setting {field} ({_flag(field)} / {env})"


def _one_line(cls: type[ServiceSettings], err: ValidationError) -> str:
    first = err.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "settings"
    value = first.get("input")
    return f"{setting_label(cls, field)} = {value!r}: {first['msg']}"


def _parse_flag(cls: type[ServiceSettings], name: str, value: Any) -> Any:
    """List-valued flags take a JSON list or a comma list; mapping-valued ones a JSON object."""
    origin = typing.get_origin(cls.model_fields[name].annotation)
    if isinstance(value, str) and origin is dict:
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value  # validation reports it with the setting's name
    if isinstance(value, str) and origin is list:
        if value.lstrip().startswith("["):
            try:
                return json.loads(value)
            except json.JSONDecodeError:
                return value  # validation reports it with the setting's name
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


S = typing.TypeVar("S", bound=ServiceSettings)


def load_settings(
    cls: type[S], argv: list[str] | None = None, *, prog: str | None = None, description: str = ""
) -> S:
    """Parses flags, environment and the config file into `cls`. Raises SettingsError (one line)."""
    parser = build_parser(cls, prog or f"rlvr-{cls.service_name}", description)
    args = parser.parse_args(argv)
    flags = {k: _parse_flag(cls, k, v) for k, v in vars(args).items() if k != "config" and v is not None}
    token = _CONFIG_FILE.set(args.config)
    try:
        return cls(**flags)
    except ValidationError as e:
        raise SettingsError(_one_line(cls, e)) from None
    finally:
        _CONFIG_FILE.reset(token)


def rlvr_home() -> Path:
    """Where rlvr keeps models, the local stack's database, NATS data, artifacts and logs:
    $RLVR_HOME, default ~/.cache/rlvr. Always absolute: paths under it are stored (a built model's
    record, a stack's state) and read by processes that may run in another folder."""
    import os

    return Path(os.environ.get("RLVR_HOME") or Path.home() / ".cache" / "rlvr").expanduser().absolute()


class NatsFields(BaseSettings):
    model_config = SettingsConfigDict(use_attribute_docstrings=True)

    nats_url: str = "nats://127.0.0.1:4222"
    """NATS server (JetStream on) for metric and status events; a comma list for a cluster. With a
    user and password: nats://USER:PASSWORD@HOST:4222 (better from nats_url_file); over TLS:
    tls://HOST:4222."""
    nats_url_file: Path | None = None
    """A file holding nats_url (e.g. a Docker secret, as the URL carries the NATS password); when
    set, it replaces nats_url."""
    nats_ca_file: Path | None = None
    """The CA that the NATS server's TLS certificate chains to (PEM); set, the connection is TLS
    and the server's certificate is checked against it (unset: the system's CAs for tls:// URLs)."""

    def nats_connection(self) -> tuple[str, Path | None]:
        """(the NATS URL, the CA file): what EventBus.connect takes."""
        if self.nats_url_file is not None:
            return read_secret_file(self.nats_url_file, "nats_url_file"), self.nats_ca_file
        return self.nats_url, self.nats_ca_file


class StoreFields(BaseSettings):
    model_config = SettingsConfigDict(use_attribute_docstrings=True)

    database_url: str = Field(default_factory=lambda: f"sqlite:///{rlvr_home() / 'stack' / 'rlvr.db'}")
    """The store: sqlite:///PATH (default, under $RLVR_HOME/stack) or postgresql+psycopg://USER@HOST/DB."""
    database_password_file: Path | None = None
    """A file holding the database password (a Docker secret), put into database_url at start so the
    URL carries none; also RLVR_DATABASE_PASSWORD_FILE."""


class ArtifactFields(BaseSettings):
    model_config = SettingsConfigDict(use_attribute_docstrings=True)

    artifact_root: Path = Field(default_factory=lambda: rlvr_home() / "stack" / "artifacts")
    """Root folder for adapters, checkpoints, merged models and exports; no path leaves it."""
    artifact_store: str = ""
    """An S3-compatible object store for adapters and merged models, "s3://BUCKET/PREFIX" (empty:
    none): trainers put each job's final adapter and each merged model there, and the scheduler's
    downloads read them from there before asking the worker that wrote them (needs `rlvr[s3]`;
    credentials from boto3's chain, e.g. AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)."""
    artifact_store_endpoint: str = ""
    """The S3 endpoint URL of `artifact_store` for a server other than AWS (MinIO, Ceph: http(s)://HOST:PORT)."""


class DataRootFields(BaseSettings):
    model_config = SettingsConfigDict(use_attribute_docstrings=True)

    data_roots: list[Path] = described_field(lambda: [Path.cwd()], STARTS_IN)
    """Folders local dataset files and folders may be read from (JSON list or comma list); nothing
    outside them."""


class PeerFields(BaseSettings):
    model_config = SettingsConfigDict(use_attribute_docstrings=True)

    rollout_address: str = local_address("rollout")
    """The rollout service (HOST:PORT)."""
    rollout_addresses: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Several rollout replicas (a comma list or JSON list of HOST:PORT, all serving the same base
    model); set, it replaces rollout_address: each step's (each batch's) prompts are spread across
    them, every adapter version is pushed to all of them, and a replica that dies is dropped while
    others remain."""
    reward_address: str = local_address("reward")
    """The reward service (HOST:PORT)."""

    @field_validator("rollout_addresses", mode="before")
    @classmethod
    def _address_list(cls, value: Any) -> Any:
        if isinstance(value, str):  # the environment's or a flag's: a comma list or a JSON list
            if value.lstrip().startswith("["):
                try:
                    return json.loads(value)
                except json.JSONDecodeError:
                    raise ValueError("not a JSON list of HOST:PORT addresses") from None
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("rollout_addresses")
    @classmethod
    def _distinct_addresses(cls, value: list[str]) -> list[str]:
        for address in value:
            host, _, port = address.strip().rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) <= 65535:
                raise ValueError(f"{address!r} is not HOST:PORT")
        twice = sorted({a for a in value if value.count(a) > 1})
        if twice:
            raise ValueError(f"{', '.join(twice)} given twice (each replica once)")
        return [a.strip() for a in value]

    def rollout_replicas(self) -> list[str]:
        """The rollout servers to use: rollout_addresses when set, else rollout_address alone."""
        return list(self.rollout_addresses) or [self.rollout_address]
