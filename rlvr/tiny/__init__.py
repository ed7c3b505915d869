"""The project's own small base models (built offline, since no model hub is reachable here)."""

from rlvr.tiny.model import SIZES, build_untrained_model

__all__ = ["SIZES", "build_untrained_model"]
