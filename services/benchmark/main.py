"""Console script `rlvr-benchmark`: parses settings, then starts the service (heavy imports after)."""

import sys

from rlvr.services.benchmark.settings import BenchmarkSettings
from rlvr.services.common.server import service_main

DESCRIPTION = "The rlvr benchmark service: evaluations of a model or adapter on held-out tasks."


def main(argv: list[str] | None = None) -> int:
    return service_main(BenchmarkSettings, "rlvr.services.benchmark.server:build_service", argv, DESCRIPTION)


if __name__ == "__main__":
    sys.exit(main())
