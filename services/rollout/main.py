"""Console script `rlvr-rollout`: parses settings, then starts the service (heavy imports after)."""

import sys

from rlvr.services.common.server import service_main
from rlvr.services.rollout.settings import RolloutSettings

DESCRIPTION = "The rlvr rollout server: vLLM (or transformers) generation with live LoRA adapter versions."


def main(argv: list[str] | None = None) -> int:
    return service_main(RolloutSettings, "rlvr.services.rollout.server:build_service", argv, DESCRIPTION)


if __name__ == "__main__":
    sys.exit(main())
