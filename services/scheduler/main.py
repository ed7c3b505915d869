"""Console script `rlvr-scheduler`: parses settings, then starts the service (heavy imports after)."""

import sys

from rlvr.services.common.server import service_main
from rlvr.services.scheduler.settings import SchedulerSettings

DESCRIPTION = "The rlvr scheduler: the public API for jobs and training loops, the store, dispatch to trainer workers."


def main(argv: list[str] | None = None) -> int:
    return service_main(SchedulerSettings, "rlvr.services.scheduler.server:build_service", argv, DESCRIPTION)


if __name__ == "__main__":
    sys.exit(main())
