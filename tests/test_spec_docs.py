"""The JobSpec's proto comments (what users read in the contract, and the generated CLI shows) state
the same ranges and defaults as rlvr/jobspec.py, the one place the code takes them from."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlvr import jobspec

PROTO = Path(__file__).resolve().parent.parent / "protos" / "rlvr" / "v1" / "common.proto"

# field -> the jobspec constant that holds its range and default
RANGED = {
    "synthetic_prompts": jobspec.SYNTHETIC_PROMPTS,
    "format_bonus_weight": jobspec.FORMAT_BONUS_WEIGHT,
    "group_size": jobspec.GROUP_SIZE,
    "max_completion_tokens": jobspec.MAX_COMPLETION,
    "lora_rank": jobspec.LORA_RANK,
    "lora_alpha": jobspec.LORA_ALPHA,
    "learning_rate": jobspec.LEARNING_RATE,
    "epochs": jobspec.EPOCHS,
    "gpu_memory_fraction": jobspec.GPU_MEMORY_FRACTION,
    "kl_beta": jobspec.KL_BETA,
    "temperature": jobspec.TEMPERATURE,
    "checkpoint_every": jobspec.CHECKPOINT_EVERY,
    "num_processes": jobspec.NUM_PROCESSES,
    "max_async_steps": jobspec.MAX_ASYNC_STEPS,
}
NUMBER = r"([0-9]+(?:\.[0-9]+)?(?:e-?[0-9]+)?)"
SPEC_MESSAGES = ("RewardConfig", "GrpoConfig", "AdvancedOptions")


def field_comments() -> dict[str, str]:
    """Each field of the spec's three cards -> the comment lines right above it, joined."""
    comments: dict[str, str] = {}
    pending: list[str] = []
    message = ""
    for line in PROTO.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("message "):
            message = stripped.split()[1]
        if message not in SPEC_MESSAGES:
            continue
        if stripped.startswith("//"):
            pending.append(stripped.removeprefix("//").strip())
            continue
        match = re.match(r"(?:optional )?\w+ (\w+) = \d+;", stripped)
        if match:
            comments[match.group(1)] = " ".join(pending)
        pending = []
    return comments


@pytest.mark.parametrize("field", sorted(RANGED))
def test_range_and_default_in_the_proto_match_the_spec_module(field: str) -> None:
    comment = field_comments()[field]
    rng = RANGED[field]
    match = re.search(rf"Range {NUMBER}(?:-| to ){NUMBER}, default {NUMBER}", comment)
    assert match, f"{field}: no 'Range a-b, default c' in its proto comment: {comment!r}"
    low, high, default = (float(g) for g in match.groups())
    assert (low, high, default) == (float(rng.low), float(rng.high), float(rng.default)), field


def test_the_other_stated_defaults_match() -> None:
    comments = field_comments()
    assert f"Default {jobspec.MAX_STEPS_DEFAULT}." in comments["max_steps"]
    sizes = ", ".join(map(str, jobspec.BATCH_SIZES))
    assert f"One of {sizes}; default {jobspec.BATCH_SIZE_DEFAULT}." in comments["batch_size"]
    assert f'Default "{jobspec.DEFAULT_DATASET_SPLIT}"' in comments["dataset_split"]
    for init in jobspec.LORA_INITS:
        assert f'"{init}"' in comments["lora_init"]
    for precision in jobspec.PRECISIONS:
        assert f'"{precision}"' in comments["precision"]
