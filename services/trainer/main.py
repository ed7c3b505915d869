"""Console script `rlvr-trainer`: parses settings, then starts the service (heavy imports after)."""

import sys

from rlvr.services.common.server import service_main
from rlvr.services.trainer.settings import TrainerSettings

DESCRIPTION = "An rlvr trainer worker: runs one GRPO job at a time on a LoRA adapter."


def main(argv: list[str] | None = None) -> int:
    return service_main(TrainerSettings, "rlvr.services.trainer.server:build_service", argv, DESCRIPTION)


if __name__ == "__main__":
    sys.exit(main())
