"""docker-compose.yml cannot be run here (no Docker engine): parse it and check that it would
start what it says."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SERVICE_PORTS = {"scheduler": 50051, "trainer": 50052, "reward": 50053, "rollout": 50054, "benchmark": 50055}


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def substitute(value: str, env: dict[str, str]) -> str:
    """Compose's ${NAME:-default} variables, as `docker compose` expands them."""
    return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}", lambda m: env.get(m.group(1), m.group(2) or ""), value)


def _flag(command: list[str], name: str) -> str | None:
    return command[command.index(name) + 1] if name in command else None


def test_every_service_runs_a_real_console_script() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    services = _compose()["services"]
    for name in SERVICE_PORTS:
        command = services[name]["command"]
        assert command[0] == f"rlvr-{name}" and command[0] in scripts, command
        module, func = scripts[command[0]].split(":")
        assert module == f"services.{name}.main"
        assert (ROOT / module.replace(".", "/")).with_suffix(".py").exists()
        # Every flag the compose file passes is one the service's settings accept.
        from rlvr.common.settings import build_parser

        settings_cls = __import__(f"services.{name}.settings", fromlist=["x"])
        cls = next(v for k, v in vars(settings_cls).items() if k.endswith("Settings") and k != "ServiceSettings")
        build_parser(cls, name, "").parse_args([substitute(a, {}) for a in command[1:]])


def test_addresses_point_at_the_services_that_serve_them() -> None:
    services = _compose()["services"]
    ports = {name: int(_flag(services[name]["command"], "--port")) for name in SERVICE_PORTS}
    assert ports == SERVICE_PORTS
    for name in SERVICE_PORTS:
        command = services[name]["command"]
        assert _flag(command, "--host") == "0.0.0.0"
        for flag, target in (("--rollout-address", "rollout"), ("--reward-address", "reward"),
                             ("--benchmark-address", "benchmark"), ("--trainer-addresses", "trainer")):
            value = _flag(command, flag)
            if value is not None:
                for address in value.split(","):
                    host, port = address.rsplit(":", 1)
                    assert host == target and int(port) == ports[target], (name, flag, value)
        nats = _flag(command, "--nats-url")
        if nats is not None:
            assert nats == "nats://nats:4222"
        db = _flag(command, "--database-url")
        if db is not None:
            assert db.startswith("postgresql+psycopg://") and "@postgres:5432/" in db
    assert "-js" in services["nats"]["command"]


def test_gpu_reservations_for_rollout_and_trainer() -> None:
    services = _compose()["services"]
    for name in ("rollout", "trainer"):
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"] and devices[0]["driver"] == "nvidia"
    for name in ("scheduler", "reward", "benchmark"):
        assert "deploy" not in services[name]
