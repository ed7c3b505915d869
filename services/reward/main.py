"""Console script `rlvr-reward`: parses settings, then starts the service (heavy imports after)."""

import sys

from rlvr.services.common.server import service_main
from rlvr.services.reward.settings import RewardSettings

DESCRIPTION = "The rlvr reward service: scores completions (accuracy and format kept apart)."


def main(argv: list[str] | None = None) -> int:
    return service_main(RewardSettings, "rlvr.services.reward.server:build_service", argv, DESCRIPTION)


if __name__ == "__main__":
    sys.exit(main())
