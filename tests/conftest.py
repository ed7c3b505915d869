"""Fixtures for the real parts: NATS, the store, services on loopback."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

# Tests never touch the user's own state folder.
os.environ.setdefault("RLVR_HOME", str(Path(__file__).resolve().parent.parent / ".rlvr" / "test-home"))

from fixtures_infra import *  # noqa: E402,F403
from fixtures_rewards import faulty_plugins  # noqa: E402,F401
from fixtures_trainer import *  # noqa: E402,F403

# `make test` runs two pytest workers (pytest-xdist, `--dist loadfile`: a module's tests, and so its
# module-scoped stack or engine, stay on one worker). A worker takes the next module in collection
# order when it is free, so the modules that start stacks, vLLM engines and training processes go
# first, longest first, and the light modules fill the gaps: the run does not end with one worker
# alone on a long module. Seconds, a module's total in a `make test` run (its --durations); every
# module not named here follows, in its usual order.
SLOW_MODULES = {
    "test_rewards_e2e.py": 300, "test_loops_e2e.py": 280, "test_trainer_recovery.py": 240,
    "test_trainer_multinode.py": 170, "test_stack.py": 150, "test_web_e2e.py": 150, "test_trainer_fsdp.py": 100,
    "test_e2e_training.py": 100, "test_trainer_service.py": 100, "test_benchmark_service.py": 100,
    "test_trainer_multiproc.py": 90, "test_tracking_e2e.py": 90, "test_metrics.py": 90,
    "test_rollout_service.py": 80, "test_rollout_core.py": 80, "test_artifact_relay.py": 60,
    "test_trainer_job.py": 60, "test_trainer_colocate.py": 50, "test_multihost.py": 40, "test_stacking.py": 40,
}


def pytest_configure(config) -> None:  # noqa: ANN001 (pytest's hook)
    # pytest-xdist (3.6+) reorders --dist loadfile's modules by their count of tests unless told not
    # to, which put the few-test, long modules last and left one worker alone on them at the end.
    if getattr(config.option, "dist", "no") == "loadfile":
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items) -> None:  # noqa: ANN001 (pytest's hook)
    if not hasattr(config, "workerinput"):  # a plain `pytest` run keeps the usual order
        return
    items.sort(key=lambda item: -SLOW_MODULES.get(item.path.name, 0))  # stable: the rest keeps its order
