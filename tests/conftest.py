"""Fixtures for the real parts: NATS, the store, services on loopback."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# Tests never touch the user's own state folder.
os.environ.setdefault("RLVR_HOME", str(Path(__file__).resolve().parent.parent / ".rlvr" / "test-home"))

from fixtures_infra import *  # noqa: E402,F403
from fixtures_rewards import checkout_entry_points, faulty_plugins  # noqa: E402,F401
from fixtures_stack import SHARED_STACK_MODULES, small_stack  # noqa: E402,F401
from fixtures_trainer import *  # noqa: E402,F403

# `make test` runs two pytest workers (pytest-xdist, `--dist loadfile`: a module's tests, and so its
# module-scoped stack or engine, stay on one worker). A worker takes the next module in collection
# order when it is free, so the modules that start stacks, vLLM engines and training processes go
# first, longest first, and the light modules fill the gaps: the run does not end with one worker
# alone on a long module. Seconds, a module's total in a `make test` run (--junitxml, 2026-12-07 at
# 87bbb8b, 15 s and more); every module not named here follows, in its usual order.
SLOW_MODULES = {
    "test_loops_e2e.py": 140, "test_stack.py": 97, "test_trainer_colocate.py": 82, "test_trainer_multiproc.py": 76,
    "test_rewards_e2e.py": 74, "test_e2e_training.py": 72, "test_trainer_job.py": 59, "test_web_e2e.py": 58,
    "test_benchmark_service.py": 54, "test_bad_input.py": 53, "test_trainer_fsdp.py": 52, "test_nats_infra.py": 47,
    "test_rollout_core.py": 46, "test_trainer_service.py": 46, "test_rollout_service.py": 46,
    "test_trainer_multinode.py": 45, "test_multihost.py": 39, "test_job_actions.py": 37, "test_metrics.py": 36,
    "test_stacking.py": 35, "test_artifact_relay.py": 28, "test_trainer_forkserver.py": 27, "test_train_cli.py": 26,
    "test_rollout_replicas.py": 26, "test_tiny_model.py": 23, "test_auth.py": 23, "test_sandbox.py": 21,
    "test_cli_addresses.py": 18, "test_docs.py": 17, "test_trainer_sft.py": 17, "test_sdk.py": 15,
}


def pytest_configure(config) -> None:  # noqa: ANN001 (pytest's hook)
    # pytest-xdist (3.6+) reorders --dist loadfile's modules by their count of tests unless told not
    # to, which put the few-test, long modules last and left one worker alone on them at the end.
    if getattr(config.option, "dist", "no") == "loadfile":
        config.option.loadscopereorder = False


def pytest_xdist_make_scheduler(config, log):  # noqa: ANN001,ANN201 (pytest-xdist's hook)
    """--dist loadfile, except that the modules sharing one stack (fixtures_stack.py) go to one
    worker together, which then starts it once."""
    if getattr(config.option, "dist", "no") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedStackScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return "shared stack: " + " ".join(SHARED_STACK_MODULES) if path in SHARED_STACK_MODULES else path

    return SharedStackScheduling(config, log)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):  # noqa: ANN001,ANN201 (pytest's hook)
    """The shared stack stops once the next test does not use it (after this test's own teardown:
    a page still open on the console must not see it go)."""
    try:
        return (yield)
    finally:
        shared = getattr(item, "funcargs", {}).get("small_stack")
        if shared is not None and "small_stack" not in getattr(nextitem, "fixturenames", ()):
            shared.stop()


def pytest_collection_modifyitems(config, items) -> None:  # noqa: ANN001 (pytest's hook)
    if not hasattr(config, "workerinput"):  # a plain `pytest` run keeps the usual order
        return
    items.sort(key=lambda item: -SLOW_MODULES.get(item.path.name, 0))  # stable: the rest keeps its order
