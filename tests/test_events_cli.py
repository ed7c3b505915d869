"""`rlvr events tail` and the nats-py subscriber of docs/cli.md, against an embedded NATS started as
`rlvr up` starts its own: a free port, a user and a password made for the run, its URL in a
`nats.json` only the owner reads, named by the stack's `stack.json`."""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures_infra import connected_bus

from rlvr.clients import cli
from rlvr.infra.nats_server import EmbeddedNats
from rlvr.infra.subjects import job_metrics_subject, job_status_subject, loop_status_subject, metric_msg_id
from rlvr.v1 import common_pb2, scheduler_pb2

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def stack_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EmbeddedNats, Path]]:
    """A NATS with a password and the RLVR_HOME of a stack that uses it (its stack.json and nats.json)."""
    rlvr_home = tmp_path_factory.mktemp("rlvr-home")
    home = rlvr_home / "stack"
    home.mkdir()
    with EmbeddedNats(home / "nats", user="rlvr", password=secrets.token_urlsafe(24)) as server:
        (home / "nats.json").write_text(json.dumps({"url": server.url_with_credentials}))
        (home / "nats.json").chmod(0o600)
        (home / "stack.json").write_text(json.dumps({"pid": os.getpid(), "nats_url": server.url,
                                                     "nats_file": str(home / "nats.json"), "addresses": {}}))
        yield server, rlvr_home


def _publish(url: str, job: str, steps: int) -> None:
    async def go() -> None:
        async with connected_bus(url) as bus:
            status = common_pb2.JobStatusEvent(job_id=job, status=common_pb2.JOB_STATUS_RUNNING, message="running")
            await bus.publish(job_status_subject(job), status.SerializeToString(), f"{job}:status:RUNNING")
            for step in range(1, steps + 1):
                m = common_pb2.MetricEvent(job_id=job, step=step, total_steps=steps, reward_mean=0.1 * step,
                                           accuracy=0.05 * step, loss=0.5, adapter_version=step)
                await bus.publish(job_metrics_subject(job), m.SerializeToString(), metric_msg_id(job, step))
            loop = scheduler_pb2.LoopStatusEvent(loop_id="loop" + job, status=scheduler_pb2.LOOP_STATUS_TRAINING,
                                                 round=1, message="round 1 training")
            await bus.publish(loop_status_subject("loop" + job), loop.SerializeToString(), f"loop{job}:1:TRAINING")

    asyncio.run(go())


def test_tail_reads_the_stacks_nats_json_and_decodes_a_jobs_events(
        stack_nats: tuple[EmbeddedNats, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    server, rlvr_home = stack_nats
    job = uuid.uuid4().hex[:12]
    _publish(server.url_with_credentials, job, 2)
    monkeypatch.setenv("RLVR_HOME", str(rlvr_home))
    monkeypatch.delenv("RLVR_NATS_URL", raising=False)
    assert cli.main(["events", "tail", "--job", job, "--count", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [re.sub(r"^#\d+ ", "", line) for line in lines] == [
        f"job {job} RUNNING: running",
        f"job {job} step 1/2: reward 0.100 accuracy 0.050 format 0.000 loss 0.5 (adapter v1)",
        f"job {job} step 2/2: reward 0.200 accuracy 0.100 format 0.000 loss 0.5 (adapter v2)"]
    assert cli.main(["events", "tail", "--loop", "loop" + job, "--count", "1", "--json"]) == 0
    event = json.loads(capsys.readouterr().out)
    assert event["subject"] == f"rlvr.loops.loop{job}.status" and event["type"] == "LoopStatusEvent"
    assert event["event"]["status"] == "LOOP_STATUS_TRAINING" and event["event"]["round"] == 1
    password = server.url_with_credentials.split(":")[2].split("@")[0]
    assert cli.main(["events", "tail", "--nats-url", server.url, "--count", "1"]) == 1  # no password: refused
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot connect to NATS at {server.url}") and password not in err


def test_tail_without_a_stack_says_how_to_start_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RLVR_HOME", str(tmp_path))
    monkeypatch.delenv("RLVR_NATS_URL", raising=False)
    assert cli.main(["events", "tail", "--job", "j1"]) == 1
    err = capsys.readouterr().err
    assert f"no local stack runs (no {tmp_path / 'stack' / 'stack.json'})" in err
    assert "`rlvr up`" in err and "--nats-url" in err and "RLVR_NATS_URL" in err
    assert cli.main(["events", "tail", "--job", "a.b"]) == 1
    assert "--job: 'a.b' is not an id" in capsys.readouterr().err


def _lines(proc: subprocess.Popen[str], n: int, timeout: float) -> list[str]:
    """The first `n` lines the process prints (fewer if they do not come within `timeout` s)."""
    import queue
    import threading

    got: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [got.put(line) for line in proc.stdout or ()], daemon=True).start()
    lines = []
    try:
        while len(lines) < n:
            lines.append(got.get(timeout=timeout))
    except queue.Empty:
        pass
    return lines


def test_the_documented_nats_py_subscriber_follows_a_job_on_the_stacks_nats(
        stack_nats: tuple[EmbeddedNats, Path], tmp_path: Path) -> None:
    """docs/cli.md's snippet, as written, against a NATS that takes only its user and password."""
    server, rlvr_home = stack_nats
    text = (ROOT / "docs" / "cli.md").read_text()
    marker = text.index("<!-- snippet: nats-subscriber")
    snippet = re.search(r"```python\n(.*?)```", text[marker:], re.S)
    assert snippet is not None
    script = tmp_path / "follow.py"
    script.write_text(snippet.group(1))
    job = uuid.uuid4().hex[:12]
    _publish(server.url_with_credentials, job, 3)
    env = {**os.environ, "RLVR_HOME": str(rlvr_home)}
    proc = subprocess.Popen([sys.executable, str(script), job], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        lines = [line.split() for line in _lines(proc, 3, timeout=30)]
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=30)
    assert lines == [[str(step), str(0.1 * step), str(0.05 * step), str(step)] for step in (1, 2, 3)], err
