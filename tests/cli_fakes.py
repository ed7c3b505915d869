"""What the CLI tests share: a fake SchedulerService served on loopback, and running `rlvr` in-process."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager

import grpc
import pytest

from rlvr.clients import cli
from rlvr.v1 import scheduler_pb2_grpc


@contextmanager
def serving(fake: scheduler_pb2_grpc.SchedulerServiceServicer) -> Iterator[str]:
    """`fake` as a SchedulerService on a free loopback port; yields its address."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0)


def run(capfd: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """`rlvr ARGV` in-process: (exit code, stdout, stderr)."""
    code = cli.main(list(argv))
    out, err = capfd.readouterr()
    return code, out, err
