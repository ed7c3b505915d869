"""Where the CLI and the SDK find the services (docs/cli.md): an address given (--address), else
RLVR_<SERVICE>_ADDRESS, else the running local stack's stack.json, else 127.0.0.1 and the default
ports; and what the CLI says when a service cannot be reached: the service, the address, where the
address came from and what to do, never gRPC's own text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr.clients import cli
from rlvr.clients.errors import unreachable
from rlvr.clients.sdk import ClientSettings
from rlvr.clients.stack import free_port
from rlvr.common.client import DEFAULT_ADDRESSES

SERVICES = ("scheduler", "trainer", "reward", "rollout", "benchmark")


def fake_stack(rlvr_home: Path, addresses: dict[str, str], pid: int | None = None) -> Path:
    """A stack.json as `rlvr up` writes it, for a stack whose process is `pid` (default: this one)."""
    home = rlvr_home / "stack"
    home.mkdir(parents=True, exist_ok=True)
    (home / "tokens.json").write_text(json.dumps({"service-token": "service", "user-token": "user"}))
    (home / "stack.json").write_text(json.dumps({"pid": pid or os.getpid(), "addresses": addresses,
                                                 "tokens_file": str(home / "tokens.json")}))
    return home


@pytest.fixture
def rlvr_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RLVR_HOME", str(tmp_path))
    for key in list(os.environ):
        if key.startswith("RLVR_") and key.endswith("_ADDRESS") or key == "RLVR_TOKEN":
            monkeypatch.delenv(key)
    return tmp_path


def test_without_addresses_the_running_local_stack_is_used(rlvr_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert {n: ClientSettings().address(n) for n in SERVICES} == DEFAULT_ADDRESSES  # no stack: the defaults
    assert ClientSettings().origin("scheduler") == "default"
    base = {name: f"127.0.0.1:{51500 + i}" for i, name in enumerate(SERVICES)}  # rlvr up --base-port 51500
    fake_stack(rlvr_home, {**base, "rollout-2": "127.0.0.1:51505"})
    settings = ClientSettings()
    assert {n: settings.address(n) for n in SERVICES} == base
    assert {settings.origin(n) for n in SERVICES} == {"stack"} and settings.token == "user-token"
    monkeypatch.setenv("RLVR_SCHEDULER_ADDRESS", "10.0.0.9:7000")  # the environment wins over the stack
    settings = ClientSettings()
    assert (settings.scheduler_address, settings.origin("scheduler")) == ("10.0.0.9:7000", "env")
    assert (settings.reward_address, settings.origin("reward")) == (base["reward"], "stack")
    assert settings.auth("scheduler").token is None and settings.auth("reward").token == "user-token"
    given = ClientSettings(scheduler_address="10.0.0.8:7000")  # an option wins over both
    assert (given.scheduler_address, given.origin("scheduler")) == ("10.0.0.8:7000", "given")
    monkeypatch.delenv("RLVR_SCHEDULER_ADDRESS")
    fake_stack(rlvr_home, {name: f"0.0.0.0:{51500 + i}" for i, name in enumerate(SERVICES)})  # --host 0.0.0.0
    wide = ClientSettings()
    assert wide.scheduler_address == "127.0.0.1:51500" and wide.token == "user-token"


def test_a_stack_json_left_by_a_dead_stack_is_not_used(rlvr_home: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # its pid now names no process: the stack.json of a `rlvr up` killed with -9
    fake_stack(rlvr_home, {name: f"127.0.0.1:{51500 + i}" for i, name in enumerate(SERVICES)}, pid=gone.pid)
    settings = ClientSettings()
    assert settings.scheduler_address == DEFAULT_ADDRESSES["scheduler"] and settings.origin("scheduler") == "default"
    assert settings.token is None


def test_no_stack_says_how_to_start_one_and_how_to_point_elsewhere(rlvr_home: Path) -> None:
    text = unreachable("scheduler", "127.0.0.1:50051", "failed to connect to all addresses; last error: "
                       "UNKNOWN: ipv4:127.0.0.1:50051: Failed to connect to remote host: Connection refused",
                       origin="default")
    assert text.startswith("cannot reach the scheduler service at 127.0.0.1:50051: nothing listens there.")
    assert f"No local stack runs (no {rlvr_home / 'stack' / 'stack.json'})" in text
    for hint in ("`rlvr up`", "--address HOST:PORT", "RLVR_SCHEDULER_ADDRESS", "docs/cli.md"):
        assert hint in text
    assert "failed to connect to all addresses" not in text and "ipv4:" not in text


@pytest.mark.parametrize("how", ["env", "option", "stack"])
def test_an_unreachable_service_is_named_with_its_address_and_what_to_do(
        rlvr_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], how: str) -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    argv = ["jobs", "list"]
    if how == "env":
        monkeypatch.setenv("RLVR_SCHEDULER_ADDRESS", address)
    elif how == "option":
        argv += ["--address", address]
    else:
        fake_stack(rlvr_home, {**DEFAULT_ADDRESSES, "scheduler": address})
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot reach the scheduler service at {address}: nothing listens there."), err
    expected = {"env": "That address was from RLVR_SCHEDULER_ADDRESS", "option": "That address was given with --address",
                "stack": "That address is the local stack's"}[how]
    assert expected in err and "failed to connect" not in err and "UNAVAILABLE" not in err
    assert ("`rlvr status`" if how == "stack" else "docs/cli.md") in err


def test_every_cli_path_explains_an_unreachable_service(rlvr_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """rlvr train, loops, eval and the generated `rlvr call` say the same, naming their service."""
    scheduler, benchmark = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    for argv, service, address in (
            (["train", "--dry-run", "--address", scheduler], "scheduler", scheduler),
            (["loops", "list", "--address", scheduler], "scheduler", scheduler),
            (["eval", "list", "--address", benchmark], "benchmark", benchmark),
            (["call", "benchmark", "ListBenchmarks", "{}", "--address", benchmark], "benchmark", benchmark)):
        assert cli.main(argv) != 0
        err = capsys.readouterr().err
        assert f"error: cannot reach the {service} service at {address}: nothing listens there." in err, (argv, err)
        assert "failed to connect" not in err, argv
