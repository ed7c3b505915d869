"""`rlvr up` as a user runs it: NATS and all five services as child processes, every health
check SERVING, an outside reflection client sees every service, and Ctrl-C leaves nothing behind."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_bootstrap import PROBE

from rlvr.clients.stack import Stack, StackConfig, free_port, status, supervise
from rlvr.peers.base import check_health

SERVICES = ("scheduler", "trainer", "reward", "rollout", "benchmark")


def _descendants(pid: int) -> set[int]:
    """Every process whose ancestry reaches pid (read from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        children = {p for p, pp in parents.items() if pp in frontier} - found
        found |= children
        frontier = children
    return found


def _started(pid: int) -> int | None:
    """When the process started (clock ticks since boot): with the pid, it names one process even
    after its pid is reused (pid_max is 32768 here, and a test run spawns thousands)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _alive(pid: int, started: int | None) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and int(fields[19]) == started


def _check_the_nats_password(state: dict) -> None:
    """The embedded NATS takes only the stack's user and password, which no command line shows."""
    import asyncio

    from rlvr.infra.events import EventBus, EventBusError

    secret = Path(state["nats_file"])
    assert secret.stat().st_mode & 0o777 == 0o600
    url = json.loads(secret.read_text())["url"]
    assert "@" in url and "@" not in state["nats_url"]
    password = url.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]
    for pid in state["pids"].values():
        assert password.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()

    async def connect(nats_url: str) -> bool:
        try:
            bus = await EventBus.connect(nats_url, name="test-stack-nats", connect_timeout_s=3)
        except EventBusError:
            return False
        await bus.close()
        return True

    assert asyncio.run(connect(url)) and not asyncio.run(connect(state["nats_url"]))


def _check_the_stack_token(rlvr_home: Path, home: Path, state: dict) -> None:
    """Auth is on with a token made for this run: a call without it is refused, the CLI (which
    finds it through stack.json) and `ClientSettings.for_stack` get in, only the owner reads it."""
    import grpc

    from rlvr.clients.sdk import ClientSettings, connect
    from rlvr.v1 import scheduler_pb2

    tokens = Path(state["tokens_file"])
    assert tokens.parent == home and tokens.stat().st_mode & 0o777 == 0o600
    assert sorted(json.loads(tokens.read_text()).values()) == ["service", "user"]
    _check_the_nats_password(state)
    with grpc.insecure_channel(state["addresses"]["scheduler"]) as channel, pytest.raises(grpc.RpcError) as e:
        channel.unary_unary("/rlvr.v1.SchedulerService/ListJobs")(b"", timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with connect(ClientSettings.for_stack(home)) as rlvr:
        assert rlvr.scheduler.list_jobs(scheduler_pb2.ListJobsRequest()).total == 0
    env = {**os.environ, "RLVR_HOME": str(rlvr_home), **{f"RLVR_{name.upper()}_ADDRESS": address
                                                         for name, address in state["addresses"].items()}}
    env.pop("RLVR_TOKEN", None)
    call = subprocess.run([sys.executable, "-m", "rlvr.clients.cli", "call", "scheduler", "ListJobs", "{}"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert call.returncode == 0, call.stdout + call.stderr
    # Only the scheduler's address given (the others are the defaults, not this stack's): the
    # scheduler still gets the stack's token.
    env = {k: v for k, v in env.items() if not (k.startswith("RLVR_") and k.endswith("_ADDRESS"))}
    listed = subprocess.run([sys.executable, "-m", "rlvr.clients.cli", "jobs", "list", "--address",
                             state["addresses"]["scheduler"]], capture_output=True, text=True, timeout=60, env=env)
    assert listed.returncode == 0, listed.stdout + listed.stderr


def test_free_ports_stay_free_while_the_machine_opens_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """`rlvr up --base-port 0` picks every service's port before any binds it. Picked from the
    kernel's ephemeral range (bind to 0), a port could go to another process's outgoing connection
    in between (a CI run lost `test_a_dying_service_is_reported` to that). Picked ports are distinct,
    below that range, and no outgoing connection takes one."""
    import socket

    from rlvr.clients.stack import ports as stack

    low, _ = stack._ephemeral_range()
    picked = [stack.free_port() for _ in range(60)]
    assert len(set(picked)) == len(picked)
    assert all(port < low for port in picked), (low, sorted(picked))
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        conns: list[socket.socket] = []
        try:
            for _ in range(200):  # each accepted at once: a full backlog (somaxconn) would stall connect
                conns.append(socket.create_connection(server.getsockname(), timeout=10))
                conns.append(server.accept()[0])
            taken = {c.getsockname()[1] for c in conns[::2]}
            assert not taken & set(picked)
            assert all(stack._listenable("127.0.0.1", port) for port in picked)
        finally:
            for c in conns:
                c.close()
    # No room below the ephemeral range: the kernel's pick, still never one handed out before.
    monkeypatch.setattr(stack, "_ephemeral_range", lambda: (1024, 65535))
    more = [stack.free_port() for _ in range(20)]
    assert len(set(more) | set(picked)) == len(more) + len(picked)
    assert all(stack._listenable("127.0.0.1", port) for port in more)


def test_two_processes_picking_at_once_never_pick_the_same_port(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Two test workers (or two `rlvr up`) pick their stacks' ports at the same time, and neither has
    bound any yet: the bind check cannot tell them apart, the machine-wide claims do. 400 picks each
    from about 15,000 ports would share about ten by chance alone."""
    import os as _os

    from rlvr.clients.stack import ports as stack

    claims = tmp_path / "claims"
    monkeypatch.setattr(stack, "CLAIMS", claims)
    code = ("import sys; from pathlib import Path; from rlvr.clients.stack import ports as s; "
            "s.CLAIMS = Path(sys.argv[1]); print(*(s.free_port() for _ in range(400)))")
    other = subprocess.Popen([sys.executable, "-c", code, str(claims)], stdout=subprocess.PIPE, text=True)
    mine = [stack.free_port() for _ in range(400)]
    theirs = [int(p) for p in other.communicate(timeout=120)[0].split()]
    assert len(theirs) == 400 and len(set(mine)) == 400
    assert not set(mine) & set(theirs)
    assert len(list(claims.iterdir())) == 800

    # A claim older than CLAIM_S is stale: its port can be picked again.
    stale = claims / str(mine[0])
    _os.utime(stale, (time.time() - stack.CLAIM_S - 1,) * 2)
    stack._handed_out.discard(mine[0])
    assert stack._claim(mine[0]) and stale.stat().st_mtime > time.time() - 60
    assert not stack._claim(theirs[0])  # a fresh one of the other process's is not


@pytest.mark.vllm
def test_up_serving_status_probe_and_clean_stop(tmp_path: Path) -> None:
    home = tmp_path / "stack"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # vLLM's KV cache at 10% of host memory, as the other tests' stacks (`make test` runs two workers):
    # the default 30% takes 15 s more to set up here and does not change what is checked.
    proc = subprocess.Popen([sys.executable, "-m", "rlvr.clients.cli", "up", "--home", str(home), "--base-port", "0",
                             "--model", "rlvr-tiny-test", "--memory-fraction", "0.1", "--start-timeout", "240"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[str] = []
    started = time.monotonic()
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if "rlvr is up" in line or proc.poll() is not None:
                break
        assert any("rlvr is up" in line for line in lines), "".join(lines)
        up_seconds = time.monotonic() - started
        for name in (*SERVICES, "web"):  # the five services and the web console
            assert any(line.startswith(name) and "SERVING" in line for line in lines), name
        state = json.loads((home / "stack.json").read_text())
        assert (home / "rlvr.db").is_file()  # the store the stack gave its services (in their environment)
        children = _descendants(proc.pid)
        assert set(state["pids"].values()) <= children
        started_at = {pid: _started(pid) for pid in children}

        status = subprocess.run([sys.executable, "-m", "rlvr.clients.cli", "status", "--home", str(home)],
                                capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stdout + status.stderr
        assert status.stdout.count("SERVING") == 7 and state["web_url"] in status.stdout  # with NATS
        # A second `rlvr up` on the same home is refused before it writes anything there: the
        # running stack keeps its tokens and state (checked next, with its token).
        tokens, stack_json = (home / "tokens.json").read_text(), (home / "stack.json").read_text()
        second = subprocess.run([sys.executable, "-m", "rlvr.clients.cli", "up", "--home", str(home),
                                 "--base-port", "0", "--model", "rlvr-tiny-test"],
                                capture_output=True, text=True, timeout=60)
        assert second.returncode == 2 and f"a stack already runs with its state in {home}" in second.stdout, \
            second.stdout + second.stderr
        assert "stopped." not in second.stdout
        assert (home / "tokens.json").read_text() == tokens and (home / "stack.json").read_text() == stack_json
        _check_the_stack_token(tmp_path, home, state)
        probe = subprocess.run([sys.executable, str(PROBE), *state["addresses"].values()],
                               capture_output=True, text=True, timeout=60)
        assert probe.returncode == 0 and "serving 5/5" in probe.stdout, probe.stdout
        for name in SERVICES:
            assert f"rlvr.v1.{name.capitalize()}Service SERVING" in probe.stdout

        # kill -9 of one service: `rlvr up` reports it and starts it again on the same address,
        # and the other services keep running (their pids do not change).
        reward_pid = state["pids"]["reward"]
        os.killpg(reward_pid, signal.SIGKILL)
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if line.startswith("reward") and "restarted" in line or proc.poll() is not None:
                break
        text = "".join(lines)
        assert "service reward exited with code -9" in text and "restarting reward in 1 s (restart 1 of at most 5" \
            in text, text
        deadline = time.monotonic() + 120
        while check_health(state["addresses"]["reward"], timeout=1.0) != "SERVING":
            assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
            time.sleep(0.3)
        after = json.loads((home / "stack.json").read_text())["pids"]
        assert after["reward"] != reward_pid and {n: p for n, p in after.items() if n != "reward"} == \
            {n: p for n, p in state["pids"].items() if n != "reward"}
        children = _descendants(proc.pid)
        started_at = {pid: _started(pid) for pid in children}

        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=90)
        assert proc.returncode == 0, rest
        assert "stopped." in rest
        left = [pid for pid in children if _alive(pid, started_at[pid])]  # `rlvr up` waits for them all
        assert not left, f"orphans after Ctrl-C: {left}"
        assert not (home / "stack.json").exists()
        print(f"stack SERVING after {up_seconds:.1f} s")
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_dying_service_is_reported(tmp_path: Path) -> None:
    """A bad setting kills one service at start: up says which, shows its log, and stops the rest."""
    out = subprocess.run([sys.executable, "-m", "rlvr.clients.cli", "up", "--home", str(tmp_path), "--base-port", "0",
                          "--model", str(tmp_path / "no-such-model"), "--start-timeout", "120"],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "service rollout exited" in out.stdout and "no-such-model" in out.stdout
    assert "stopped." in out.stdout


class _Crashing(Stack):
    """A stack whose one "service" is a real process that exits with 3 as soon as it starts."""

    def _launch(self, name: str) -> None:
        self.procs[name] = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], start_new_session=True)


def test_a_service_that_keeps_dying_stops_the_stack_after_its_restarts(tmp_path: Path) -> None:
    import io

    out = io.StringIO()
    stack = _Crashing(StackConfig(home=tmp_path, max_restarts=2), out=out)
    stack.logs.mkdir(parents=True)
    stack._launch("reward")
    assert supervise(stack, poll=0.05) == 1
    text = out.getvalue()
    assert text.count("service reward exited with code 3") == 3
    assert "restarting reward in 1 s (restart 1 of at most 2" in text and "restarting reward in 2 s (restart 2" in text
    assert text.count("reward     restarted") == 2
    assert "service reward died 3 times in 600 s (at most 2 restarts); stopping the stack" in text


def test_a_database_password_stays_off_command_lines_and_out_of_stack_json(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`rlvr up --database-url postgresql://USER:PASSWORD@...`: the URL reaches the scheduler and the
    benchmark service in their environment (ps shows command lines to every user) and stack.json,
    which any user may read, holds it redacted."""
    from rlvr.clients.stack import supervisor as stack_module

    url = "postgresql+psycopg://rlvr:s3cret-pw@db.internal:5432/rlvr"
    cfg = StackConfig(home=tmp_path, database_url=url)
    spawned: dict[str, tuple[list[str], dict[str, str]]] = {}

    real_popen = subprocess.Popen

    def spawn(command: list[str], **kwargs: object) -> object:
        if "-m" not in command:
            return real_popen(command, **kwargs)  # not a service (ctypes' ldconfig, ...)
        spawned[command[command.index("-m") + 1]] = (command, kwargs["env"])  # type: ignore[assignment]
        return type("Spawned", (), {"pid": 4242})()

    monkeypatch.setattr(stack_module.subprocess, "Popen", spawn)
    s = Stack(cfg)
    s.logs.mkdir(parents=True)
    s.nats = type("Nats", (), {"url_with_credentials": "nats://rlvr:pw@127.0.0.1:4222",  # type: ignore[assignment]
                               "url": "nats://127.0.0.1:4222", "pid": 4243})()
    for name in cfg.names:
        s._launch(name)
    for module, (command, env) in spawned.items():
        assert not any("s3cret-pw" in arg for arg in command), command
        service = module.split(".")[2]
        if service in ("scheduler", "benchmark"):
            assert env[f"RLVR_{service.upper()}_DATABASE_URL"] == url
    assert {m.split(".")[2] for m in spawned} == set(SERVICES)
    s._write_state()
    text = (tmp_path / "stack.json").read_text()
    assert "s3cret-pw" not in text and "rlvr:***@db.internal" in text


def _free_base_port(count: int = 5) -> int:
    """A port with the next `count - 1` free as well, below the ephemeral range (as `--base-port`)."""
    import random

    from rlvr.clients.stack import ports as stack

    rng = random.Random()
    for _ in range(500):
        base = rng.randrange(15000, min(30000, stack._ephemeral_range()[0]) - count)
        if all(stack._listenable("127.0.0.1", base + i) for i in range(count)):
            return base
    raise AssertionError("no five free consecutive ports")


def _read_until(proc: subprocess.Popen[str], lines: list[str], done: str, timeout: float) -> bool:
    """Reads `proc`'s output into `lines` until a line contains `done` (True), it exits or time runs out."""
    import queue
    import threading

    got: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in proc.stdout or ():
            got.put(line)
        got.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = got.get(timeout=max(0.1, deadline - time.monotonic()))
        except Exception:  # noqa: BLE001 (queue.Empty: out of time)
            return False
        if line is None:
            return False
        lines.append(line)
        if done in line:
            return True
    return False


@pytest.mark.slow  # make test-all (32 s: a second `rlvr up`); make test keeps the CLI finding a running stack's
# addresses in its stack.json (test_cli_addresses.py) and its NATS (test_events_cli.py), and `rlvr up` above
def test_after_up_with_a_base_port_the_cli_needs_no_address(tmp_path: Path) -> None:
    """`rlvr up --base-port N`, then `rlvr train`, `rlvr jobs list` and `rlvr events tail` with no
    address option and no RLVR_*_ADDRESS or RLVR_NATS_URL: they find that stack's addresses, token
    and NATS in its stack.json under $RLVR_HOME/stack (the issue: they dialled 127.0.0.1:50051)."""
    base = _free_base_port()
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("RLVR_") and (k.endswith("_ADDRESS") or k in ("RLVR_TOKEN", "RLVR_NATS_URL")))}
    env.update(RLVR_HOME=str(tmp_path), PYTHONUNBUFFERED="1", RLVR_TRAINER_TORCH_THREADS="1")
    rlvr = [sys.executable, "-m", "rlvr.clients.cli"]
    up = subprocess.Popen([*rlvr, "up", "--base-port", str(base), "--model", "rlvr-tiny-test", "--rollout-backend",
                           "transformers", "--no-web", "--start-timeout", "240"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[str] = []
    try:
        assert _read_until(up, lines, "rlvr is up", 300), "".join(lines)
        state = json.loads((tmp_path / "stack" / "stack.json").read_text())
        assert state["addresses"]["scheduler"] == f"127.0.0.1:{base}"
        dry = subprocess.run([*rlvr, "train", "--dry-run"], capture_output=True, text=True, timeout=120, env=env)
        assert dry.returncode == 0 and "Training Summary" in dry.stdout and "rlvr-tiny" in dry.stdout, \
            dry.stdout + dry.stderr
        train = subprocess.run([*rlvr, "train", "--model", "rlvr-tiny-test", "--backend", "transformers", "--max-steps",
                                "2", "--group-size", "4", "--batch-size", "4", "--max-completion", "32",
                                "--synthetic-prompts", "16"], capture_output=True, text=True, timeout=400, env=env)
        assert train.returncode == 0, train.stdout + train.stderr
        job = re.search(r"job (\w+) queued", train.stdout)
        assert job is not None, train.stdout
        listed = subprocess.run([*rlvr, "jobs", "list"], capture_output=True, text=True, timeout=120, env=env)
        assert listed.returncode == 0 and job.group(1) in listed.stdout and "COMPLETED" in listed.stdout, \
            listed.stdout + listed.stderr
        tail = subprocess.Popen([*rlvr, "events", "tail", "--job", job.group(1)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env)
        events: list[str] = []
        try:
            assert _read_until(tail, events, "COMPLETED", 60), "".join(events)
        finally:
            tail.kill()
            tail.wait(timeout=30)
        text = "".join(events)
        assert f"job {job.group(1)} step 1/2: reward" in text and f"job {job.group(1)} step 2/2: reward" in text, text
        assert f"job {job.group(1)} QUEUED" in text
        password = json.loads(Path(state["nats_file"]).read_text())["url"].split(":")[2].split("@")[0]
        assert password not in text and password not in train.stdout
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
            try:
                up.wait(timeout=90)
            except subprocess.TimeoutExpired:
                up.kill()


class _NatsOnly(Stack):
    """The stack's NATS, real, and no service processes (their health answered by `_healthy`)."""

    def prepare_model(self) -> None:
        pass

    def _launch(self, name: str) -> None:
        pass


def _healthy(ports: list[int]) -> object:
    """One gRPC server answering the health check SERVING on each of `ports`: the five services."""
    from concurrent import futures

    import grpc
    from grpc_health.v1 import health, health_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    for port in ports:
        server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server


def test_nats_killed_is_named_by_status_and_started_again_with_its_stream(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """kill -9 of `rlvr up`'s NATS: `rlvr status` exits 1 naming it (it printed only the URL and
    exited 0), and `supervise` starts it again on the same port with the same JetStream files, so
    the events and the durable consumer it had are still there."""
    import argparse
    import asyncio
    import io
    import threading

    import nats

    out = io.StringIO()
    cfg = StackConfig(home=tmp_path / "stack", ports={name: free_port() for name in SERVICES})
    stack = _NatsOnly(cfg, out=out)
    services = _healthy(list(cfg.ports.values()))
    stop = threading.Event()
    watcher = threading.Thread(target=supervise, args=(stack,), kwargs={"poll": 0.05, "stop": stop})

    def rlvr_status() -> tuple[int, str]:
        code = status(argparse.Namespace(home=cfg.home))
        return code, next(line for line in capsys.readouterr().out.splitlines() if line.startswith("nats"))

    async def stream(url: str, publish: bool) -> tuple[int, str]:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            if publish:
                await js.add_stream(name="KEPT", subjects=["kept.>"])
                await js.publish("kept.one", b"1", stream="KEPT")
                await js.pull_subscribe("kept.>", durable="reader", stream="KEPT")
            info = await js.stream_info("KEPT")
            return info.state.messages, (await js.consumer_info("KEPT", "reader")).name
        finally:
            await nc.close()

    try:
        stack.start()
        assert stack.nats is not None
        url, pid, secret = stack.nats.url, stack.nats.pid, stack.nats.url_with_credentials
        assert asyncio.run(stream(secret, publish=True)) == (1, "reader")
        watcher.start()
        assert rlvr_status() == (0, f"nats       {url:<24} SERVING")

        os.kill(pid, signal.SIGKILL)
        while stack.nats.returncode is None:
            time.sleep(0.01)
        assert rlvr_status() == (1, f"nats       {url:<24} UNREACHABLE")
        deadline = time.monotonic() + 30
        while "nats       restarted" not in out.getvalue():
            assert time.monotonic() < deadline, out.getvalue()
            time.sleep(0.05)
        text = out.getvalue()
        assert "nats exited with code -9; last lines of" in text and "restarting nats in 1 s (restart 1 of at most 5" \
            in text, text
        assert stack.nats.url == url and stack.nats.pid != pid
        assert json.loads((cfg.home / "stack.json").read_text())["nats_pid"] == stack.nats.pid
        assert rlvr_status() == (0, f"nats       {url:<24} SERVING")
        assert asyncio.run(stream(secret, publish=False)) == (1, "reader")
    finally:
        stop.set()
        if watcher.is_alive():
            watcher.join(timeout=10)
        stack.stop()
        services.stop(0)  # type: ignore[attr-defined]


def test_group_alive_sees_a_group_until_its_last_process_ends() -> None:
    """`rlvr up`'s stop waits on it: a group whose leader is gone but whose child runs is alive; a
    group whose processes are all reaped is not."""
    from rlvr.clients.stack import group_alive

    leader = subprocess.Popen(["sh", "-c", "sleep 600 & echo $!; wait"], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    child = int(leader.stdout.readline())  # type: ignore[union-attr]
    try:
        assert group_alive(leader.pid)
        os.kill(leader.pid, signal.SIGKILL)
        leader.wait(10)
        assert group_alive(leader.pid)  # the sleep, in the same group, still runs
        os.kill(child, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while group_alive(leader.pid):  # init reaps the orphaned sleep
            assert time.monotonic() < deadline, "the group still looks alive after its processes ended"
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader.pid, signal.SIGKILL)
