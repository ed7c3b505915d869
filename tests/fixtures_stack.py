"""One running stack of every service on `rlvr-tiny-small`, shared by the end-to-end modules that
need nothing of it but that (SHARED_STACK_MODULES): embedded NATS, SQLite, the five services and
the web console as child processes, started by `rlvr.clients.stack.Stack` as `rlvr up` starts them.

Starting a stack costs 25-40 s on a 2-core machine (three processes import vLLM and torch), so it is
started once for those modules: conftest.py's pytest-xdist scheduler hands them to one worker
together, and the stack is stopped as soon as the next test needs it no more (conftest's
`pytest_runtest_teardown`), so it does not hold a tenth of the host's memory for the rest of the run.
A run that puts other modules between them (no xdist) starts it again when the next one asks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

SHARED_STACK_MODULES = ("tests/test_e2e_training.py", "tests/test_loops_e2e.py", "tests/test_trainer_recovery.py",
                        "tests/test_web_e2e.py")
"""The modules whose tests use `small_stack` (by their node id's path): one xdist worker runs them all."""
SMALL_MODEL = "rlvr-tiny-small"


@dataclass
class RunningStack:
    client: Any  # the SDK facade, connected with the stack's user token
    running: Any  # rlvr.clients.stack.Stack
    home: Path
    web_url: str
    log: Any  # the open stack.out the services' output goes to


class SharedStack:
    """The stack, started on the first `get()` and again after a `stop()`."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._tmp = tmp_path_factory
        self._current: RunningStack | None = None

    def get(self) -> RunningStack:
        if self._current is None:
            self._current = self._start()
        return self._current

    def _start(self) -> RunningStack:
        from rlvr.clients.sdk import connect
        from rlvr.clients.stack import Stack, StackConfig, free_port
        from rlvr.clients.stack.config import SERVICES

        home = self._tmp.mktemp("small-stack")
        cfg = StackConfig(home=home, model=SMALL_MODEL, ports={name: free_port() for name in SERVICES},
                          start_timeout=300.0, log_format="text", web_port=free_port(),
                          memory_fraction=0.1)  # the KV cache: 10% of host memory (`make test` runs two workers)
        log = open(home / "stack.out", "w")  # noqa: SIM115
        running = Stack(cfg, out=log)
        try:
            running.start()
            assert running.wait_serving(), (home / "stack.out").read_text()
            return RunningStack(connect(running.client_settings()), running, home, cfg.web_url, log)
        except BaseException:
            running.stop()
            log.close()
            raise

    def stop(self) -> None:
        if self._current is None:
            return
        current, self._current = self._current, None
        try:
            current.client.close()
        finally:
            current.running.stop()
            current.log.close()


@pytest.fixture(scope="session")
def small_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedStack]:
    shared = SharedStack(tmp_path_factory)
    yield shared
    shared.stop()
