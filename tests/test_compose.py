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
        assert module == f"rlvr.services.{name}.main"
        assert (ROOT / module.replace(".", "/")).with_suffix(".py").exists()
        # Every flag the compose file passes is one the service's settings accept.
        from rlvr.common.settings import build_parser

        settings_cls = __import__(f"rlvr.services.{name}.settings", fromlist=["x"])
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


def make_secrets(folder: Path, tls_names: str = "") -> Path:
    """Runs deploy/make-secrets.sh (the openssl CLI) into `folder`; the compose file's secrets live there.
    `tls_names`: its RLVR_TLS_NAMES, more names for the certificate."""
    import os
    import subprocess

    out = subprocess.run(["sh", str(ROOT / "deploy" / "make-secrets.sh"), str(folder)], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "RLVR_TLS_NAMES": tls_names})
    assert out.returncode == 0, out.stdout + out.stderr
    return folder


def secret_files(compose: dict, secrets_dir: Path) -> dict[str, Path]:
    """Each declared secret's file, with compose's ./secrets resolved to `secrets_dir`."""
    return {name: secrets_dir / Path(spec["file"]).relative_to("secrets")
            for name, spec in compose["secrets"].items()}


def test_no_password_in_the_file_and_every_service_has_its_secrets(tmp_path: Path) -> None:
    import json

    from sqlalchemy.engine import make_url

    compose = _compose()
    text = (ROOT / "docker-compose.yml").read_text()
    services = compose["services"]
    postgres = services["postgres"]["environment"]
    assert "POSTGRES_PASSWORD" not in postgres and postgres["POSTGRES_PASSWORD_FILE"] == "/run/secrets/postgres_password"
    assert "postgres_password" in services["postgres"]["secrets"]
    assert ":rlvr@" not in text
    env = compose["x-rlvr-service"]["environment"]
    mounted = {f"/run/secrets/{name}" for name in compose["x-rlvr-service"]["secrets"]}
    for key in ("RLVR_AUTH_TOKEN_FILE", "RLVR_AUTH_TOKENS_FILE", "RLVR_TLS_CERT_FILE", "RLVR_TLS_KEY_FILE",
                "RLVR_TLS_CA_FILE", "RLVR_DATABASE_PASSWORD_FILE"):
        assert env[key] in mounted, key
    assert set(compose["x-rlvr-service"]["secrets"]) <= set(compose["secrets"])
    for name in SERVICE_PORTS:
        db = _flag(services[name]["command"], "--database-url")
        if db is not None:
            assert make_url(db).password is None, db
    # The script makes every file the compose file mounts: tokens, the tokens file, TLS material.
    files = secret_files(compose, make_secrets(tmp_path / "secrets"))
    for name, path in files.items():
        assert path.stat().st_size > 0 and path.stat().st_mode & 0o077 == 0, name
    roles = json.loads(files["rlvr_tokens"].read_text())
    assert list(roles.values()) == ["user"] and (tmp_path / "secrets" / "user_token").read_text().strip() in roles
    # NATS: its authorization block and TLS from the secrets; the services read its URL (password
    # included) from a secret and check its certificate against the CA; no URL in a command line.
    nats = services["nats"]
    assert _flag(nats["command"], "-c") == "/run/secrets/nats_auth" and "--tls" in nats["command"]
    assert {"nats_auth", "rlvr_tls_cert", "rlvr_tls_key"} <= set(nats["secrets"])
    password = files["nats_url"].read_text().strip().split("@")[0].rsplit(":", 1)[1]
    assert f'password: "{password}"' in files["nats_auth"].read_text() and password not in text
    assert env["RLVR_NATS_URL_FILE"] == "/run/secrets/nats_url" in mounted
    assert env["RLVR_NATS_CA_FILE"] == "/run/secrets/rlvr_tls_ca" in mounted
    for name in ("scheduler", "trainer", "benchmark"):
        assert "--nats-url" not in services[name]["command"]


def test_services_on_0000_start_only_with_auth(tmp_path: Path, monkeypatch) -> None:
    """The compose environment, applied to each service's settings: its token makes the 0.0.0.0
    bind allowed, and without the secrets the same bind is refused."""
    import pytest

    from rlvr.common.auth import check_exposure, token_table
    from rlvr.common.settings import SettingsError, load_settings

    compose = _compose()
    files = secret_files(compose, make_secrets(tmp_path / "secrets"))
    services = compose["services"]
    for name in SERVICE_PORTS:
        settings_module = __import__(f"rlvr.services.{name}.settings", fromlist=["x"])
        cls = next(v for k, v in vars(settings_module).items() if k.endswith("Settings") and k != "ServiceSettings")
        argv = [substitute(a, {}) for a in services[name]["command"][1:]]
        with monkeypatch.context() as m:
            for key, value in compose["x-rlvr-service"]["environment"].items():
                if str(value).startswith("/run/secrets/"):
                    m.setenv(key, str(files[str(value).removeprefix("/run/secrets/")]))
            settings = load_settings(cls, argv)
            assert settings.host == "0.0.0.0"
            check_exposure(settings, token_table(settings))
        bare = load_settings(cls, argv)
        with pytest.raises(SettingsError, match="serving beyond loopback without auth is refused"):
            check_exposure(bare, token_table(bare))


def test_make_secrets_puts_more_host_names_in_the_certificate(tmp_path: Path) -> None:
    """RLVR_TLS_NAMES, for services on several hosts (tests/test_multihost.py serves host B on
    127.0.0.2 with it): names as DNS entries, addresses as IP entries, beside the compose names."""
    import subprocess

    def names(folder: Path) -> set[str]:
        out = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in",
                              str(folder / "tls" / "server.pem")], capture_output=True, text=True, check=True)
        return {n.strip() for n in out.stdout.splitlines()[-1].split(",")}

    compose_names = {"DNS:scheduler", "DNS:nats", "DNS:localhost", "IP Address:127.0.0.1"}
    more = names(make_secrets(tmp_path / "more", tls_names="host-a, host-b 10.0.0.7,::1"))
    assert compose_names | {"DNS:host-a", "DNS:host-b", "IP Address:10.0.0.7", "IP Address:0:0:0:0:0:0:0:1"} <= more
    plain = names(make_secrets(tmp_path / "plain"))
    assert compose_names <= plain and not any("host-" in n or "10.0.0.7" in n for n in plain)
