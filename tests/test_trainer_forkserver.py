"""The fork server (services/trainer/process/forkserver.py): a job process forked from a process that has
imported the job's libraries is what a fresh `python -m rlvr.services.trainer.process.job_process` is (its
command line, session, log, environment, exit code), dies with that process, and the worker forks
its single-process jobs from it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from rlvr.services.trainer.process.forkserver import ForkServer, ForkServerError, forks_jobs

TESTS = Path(__file__).resolve().parent


@pytest.fixture
async def server(monkeypatch: pytest.MonkeyPatch):
    """A fork server that preloads only `json` and can import tests/forkserver_job.py."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]))
    forks = ForkServer(["json", "no_such_module_for_rlvr_tests"])
    await forks.start()
    yield forks
    await forks.close()


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


async def test_a_forked_process_is_what_python_m_would_start(server: ForkServer, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # Set after the server started: a job sees the worker's environment as of its request.
    monkeypatch.setenv("FORKSERVER_TEST_VALUE", "as of the request")
    log, out, cwd = tmp_path / "job.log", tmp_path / "seen.json", tmp_path / "cwd"
    cwd.mkdir()
    args = [str(out), "3", "--job-dir", str(tmp_path / "jobs" / "job-1")]
    child = await server.spawn("forkserver_job", args, log, cwd=str(cwd))
    assert await asyncio.wait_for(child.wait(), 30) == 3 and child.returncode == 3
    seen = json.loads(out.read_text())
    assert seen["pid"] == child.pid and seen["sid"] == child.pid  # a session of its own
    assert seen["ppid"] == server.pid  # forked, not a fresh interpreter
    assert seen["cmdline"] == [sys.executable, "-m", "forkserver_job", *args]  # what ps shows
    assert seen["argv"] == [str(TESTS / "forkserver_job.py"), *args] and seen["name"] == "__main__"
    assert seen["env"] == "as of the request" and seen["cwd"] == str(cwd)
    assert seen["sigterm_default"] and seen["stdin"] == ""  # the server's own SIG_IGN and pipe stay behind
    text = log.read_text()
    assert f"forkserver_job {child.pid} to stdout" in text and f"forkserver_job {child.pid} to stderr" in text


async def test_exit_codes_are_those_of_a_fresh_process(server: ForkServer, tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    raised = await server.spawn("forkserver_job", [str(tmp_path / "a.json"), "raise"], log)
    assert await asyncio.wait_for(raised.wait(), 30) == 1
    assert "RuntimeError: the job's own error" in log.read_text()
    clean = await server.spawn("forkserver_job", [str(tmp_path / "b.json"), "0"], log)
    assert await asyncio.wait_for(clean.wait(), 30) == 0
    for sig in (signal.SIGTERM, signal.SIGKILL):
        out = tmp_path / f"{sig.name}.json"
        sleeper = await server.spawn("forkserver_job", [str(out), "sleep"], log)
        while not out.exists():
            await asyncio.sleep(0.02)
        os.killpg(sleeper.pid, sig)  # the worker's cancel, and its SIGKILL after the grace period
        assert await asyncio.wait_for(sleeper.wait(), 30) == -sig


async def test_the_server_outlives_a_sigterm_and_its_jobs_die_with_it(server: ForkServer, tmp_path: Path) -> None:
    out = tmp_path / "seen.json"
    child = await server.spawn("forkserver_job", [str(out), "sleep"], tmp_path / "job.log")
    while not out.exists():
        await asyncio.sleep(0.02)
    server_pid = server.pid
    assert server_pid is not None
    os.kill(server_pid, signal.SIGTERM)  # a stop of the worker's process group: the worker cancels its job itself
    await asyncio.sleep(0.5)
    assert server.pid == server_pid and child.returncode is None
    os.kill(server_pid, signal.SIGKILL)  # gone however it goes: its job process goes with it
    assert await asyncio.wait_for(child.wait(), 30) == -signal.SIGKILL
    assert not Path(f"/proc/{child.pid}").exists() or _state(child.pid) == "Z"
    # The next job brings a new server up.
    again = await server.spawn("forkserver_job", [str(tmp_path / "again.json"), "0"], tmp_path / "job.log")
    assert server.pid not in (None, server_pid)
    assert await asyncio.wait_for(again.wait(), 30) == 0


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


async def test_a_log_it_cannot_open_fails_the_start_naming_it(server: ForkServer, tmp_path: Path) -> None:
    bad = tmp_path / "no-such-folder" / "job.log"
    with pytest.raises(ForkServerError, match="no-such-folder"):
        await server.spawn("forkserver_job", [str(tmp_path / "x.json"), "0"], bad)
    ok = await server.spawn("forkserver_job", [str(tmp_path / "y.json"), "0"], tmp_path / "job.log")
    assert await asyncio.wait_for(ok.wait(), 30) == 0  # the server carries on


def test_auto_forks_only_without_a_gpu_driver(tmp_path: Path) -> None:
    driver = tmp_path / "nvidiactl"
    assert forks_jobs("auto", [str(driver)]) and forks_jobs("fork", [str(driver)])
    assert not forks_jobs("fresh", [str(driver)])
    driver.touch()
    assert not forks_jobs("auto", [str(driver)]) and forks_jobs("fork", [str(driver)])


@pytest.mark.parametrize("job_start", ["fork", "fresh"])
async def test_the_worker_runs_a_job_in_a_forked_or_fresh_process(job_start: str, tmp_path: Path,
                                                                    tiny_model: str) -> None:
    from rlvr.services.trainer.process.worker import JobSupervisor
    from rlvr.services.trainer.settings import TrainerSettings
    from rlvr.v1 import common_pb2 as C
    from rlvr.v1 import trainer_pb2 as T

    settings = TrainerSettings(port=0, artifact_root=tmp_path / "artifacts", nats_url="", scorer="local",
                               torch_threads=1, worker_name="trainer-test", job_start=job_start)
    supervisor = JobSupervisor(settings)
    spec = C.JobSpec(base_model=tiny_model)
    spec.reward.synthetic_prompts = 8
    spec.grpo.group_size, spec.grpo.batch_size, spec.grpo.max_completion_tokens, spec.grpo.max_steps = 2, 4, 32, 2
    spec.advanced.generation_backend = C.GENERATION_BACKEND_TRANSFORMERS
    try:
        await supervisor.start(T.StartJobRequest(job_id="forked", spec=spec, total_steps=2))
        assert supervisor.current is not None
        pid = supervisor.current.process.pid
        parent = _ppid(pid)
        await asyncio.wait_for(supervisor.current.done.wait(), 300)
        assert supervisor.last is not None and supervisor.last.status == C.JOB_STATUS_COMPLETED, supervisor.last
        assert supervisor.last.adapter is not None and supervisor.last.adapter.version == 2
        log = (settings.artifact_root / "jobs" / "forked" / "job.log").read_text()
        assert "job forked completed: 2 steps" in log, log[-2000:]
        if job_start == "fork":
            assert supervisor.forks is not None and parent == supervisor.forks.pid
        else:
            assert supervisor.forks is None and parent == os.getpid()
    finally:
        await supervisor.close()
