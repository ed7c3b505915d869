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
