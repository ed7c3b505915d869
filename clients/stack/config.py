"""What the local stack runs, and where: its processes' names in start order, their ports and
addresses under one home folder (StackConfig), and each child's command line."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from rlvr.common.settings import DEFAULT_PORTS

# Start order: the services others depend on come first.
SERVICES = ("reward", "rollout", "trainer", "benchmark", "scheduler")
WEB = "web"  # the web console's process (clients/web): HTTP, not gRPC; started last, stopped first
DEFAULT_WEB_PORT = 8050
NATS = "nats"  # the embedded NATS server's process name (rlvr up's messages, rlvr status)
NATS_SERVICES = ("scheduler", "trainer", "benchmark")  # the services that publish or read events
NATS_USER = "rlvr"  # the embedded NATS's one user; its password is made at each start
RESTART_WINDOW = 600.0  # seconds over which StackConfig.max_restarts counts a service's restarts
GRPC_NAMES = {
    "scheduler": "rlvr.v1.SchedulerService",
    "trainer": "rlvr.v1.TrainerService",
    "reward": "rlvr.v1.RewardService",
    "rollout": "rlvr.v1.RolloutService",
    "benchmark": "rlvr.v1.BenchmarkService",
}


def replica_name(k: int) -> str:
    """The process name of rollout replica k (1 is "rollout" itself)."""
    return "rollout" if k == 1 else f"rollout-{k}"


def service_of(name: str) -> str:
    """The service a process name runs ("rollout-2" runs the rollout service)."""
    return "rollout" if name.startswith("rollout-") else name


def default_home() -> Path:
    from rlvr.common.settings import rlvr_home

    return rlvr_home() / "stack"


@dataclass
class StackConfig:
    home: Path = field(default_factory=default_home)
    host: str = "127.0.0.1"
    ports: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_PORTS))
    nats_port: int = 0
    database_url: str = ""
    model: str = "rlvr-tiny"
    rollout_backend: str = "vllm"
    memory_fraction: float = 0.3
    start_timeout: float = 300.0
    log_format: str = "json"
    web_port: int | None = None  # the web console's port; None: no console
    web_host: str = "127.0.0.1"  # loopback unless asked (--web-host); beyond it the console asks for a login
    # `rlvr up` starts a service that dies again, at most this many times in RESTART_WINDOW seconds
    # (then it stops everything, as a stack that keeps crashing is not serving anyone).
    max_restarts: int = 5
    # Rollout servers: "rollout", then "rollout-2" ... (ports[name] each); the trainer and the
    # benchmark get all their addresses (rollout_addresses).
    rollout_replicas: int = 1
    # Each service process's Prometheus /metrics port (`rlvr up --metrics`: free ones); empty: none served.
    metrics_ports: dict[str, int] = field(default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        """The services' process names in start order, the extra rollout replicas after "rollout"."""
        extra = tuple(replica_name(k) for k in range(2, self.rollout_replicas + 1))
        return tuple(n for name in SERVICES for n in ((name, *extra) if name == "rollout" else (name,)))

    @property
    def addresses(self) -> dict[str, str]:
        return {name: f"{self.host}:{port}" for name, port in self.ports.items()}

    @property
    def web_url(self) -> str:
        from rlvr.clients.web.server import url

        return url(self.web_host, self.web_port) if self.web_port is not None else ""


def web_command(cfg: StackConfig) -> list[str]:
    """The web console's command line: a client of the stack's scheduler and benchmark service."""
    a = cfg.addresses
    return [sys.executable, "-m", "rlvr.clients.web", "--host", cfg.web_host, "--port", str(cfg.web_port),
            "--scheduler-address", a["scheduler"], "--benchmark-address", a["benchmark"]]


def service_command(name: str, cfg: StackConfig) -> list[str]:
    """The child process's command line: the service's own module with explicit flags (the NATS
    URL, which holds the embedded server's password, and the database URL, which may hold one, go
    in the environment: see Stack._launch)."""
    a = cfg.addresses
    artifacts = str(cfg.home / "artifacts")
    port, replica, name = cfg.ports[name], name.removeprefix("rollout"), service_of(name)  # replica: "", "-2" ...
    cmd = [sys.executable, "-m", f"rlvr.services.{name}.main", "--host", cfg.host, "--port", str(port),
           "--log-format", cfg.log_format]
    if name in ("scheduler", "trainer"):
        cmd += ["--artifact-root", artifacts]
    if name == "reward":  # the Head jobs' adapters it scores with as rewards (head_<job id>)
        cmd += ["--head-roots", artifacts]
    if name in ("trainer", "benchmark"):
        cmd += ["--rollout-address", a["rollout"], "--reward-address", a["reward"]]
        if cfg.rollout_replicas > 1:
            cmd += ["--rollout-addresses", ",".join(a[n] for n in cfg.names if service_of(n) == "rollout")]
    if name == "scheduler":
        cmd += ["--trainer-addresses", a["trainer"], "--benchmark-address", a["benchmark"],
                "--reward-address", a["reward"]]
    if name == "benchmark":  # trained adapters it may upload for an evaluation: the stack's own
        cmd += ["--adapter-roots", artifacts]
    if name == "rollout":
        cmd += ["--model", cfg.model, "--backend", cfg.rollout_backend,
                "--memory-fraction", str(cfg.memory_fraction),
                "--adapter-root", str(cfg.home / f"rollout-adapters{replica}")]
    return cmd
