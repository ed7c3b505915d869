"""The project's own small base models, built offline (no model hub is reachable here).

``build_untrained_model`` writes a random-init Qwen2 with the character tokenizer (seconds);
``build_tiny_model`` adds the Math Pairs warm-up that makes it a useful RL base (minutes).
Both import torch/transformers lazily, so importing this package is cheap.
"""

from rlvr.tiny.build import BuildReport, build_tiny_model, default_model_dir, evaluate_heldout
from rlvr.tiny.model import SIZES, build_untrained_model

__all__ = [
    "SIZES",
    "BuildReport",
    "build_tiny_model",
    "build_untrained_model",
    "default_model_dir",
    "evaluate_heldout",
]
