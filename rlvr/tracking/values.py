"""What every tracker logs, by name: a step's MetricEvent as numbers, a spec as config, the tiles.

Each per-step number is named after its MetricEvent field (`reward_mean`, `kl`, `policy_lag`, ...;
`kl` and `entropy` only at the steps that have them) and each reward component as
`reward_components/<key>`; so a tracker's series and the store's export have the same names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.json_format import MessageToDict

from rlvr.v1 import common_pb2

NOT_LOGGED = frozenset({"job_id", "step", "time", "reward_components"})
"""MetricEvent fields that are not a per-step series (the step is the x axis)."""
_TEXT = (FieldDescriptor.CPPTYPE_STRING, FieldDescriptor.CPPTYPE_MESSAGE)
STEP_FIELDS: tuple[str, ...] = tuple(f.name for f in common_pb2.MetricEvent.DESCRIPTOR.fields
                                     if f.name not in NOT_LOGGED and f.cpp_type not in _TEXT)
"""The numeric fields (a text field such as `sampler_correction` is the step's note, not a series)."""
COMPONENT_PREFIX = "reward_components/"
CLASS_F1_PREFIX = "class_f1/"
SUMMARY_PREFIX = "summary/"
SAMPLE_COLUMNS = ("step", "prompt", "completion", "reward", "accuracy")
"""The columns of a step's sample of completions (where a tracker has tables)."""


def step_values(event: common_pb2.MetricEvent) -> dict[str, float]:
    """The step's numbers by name, in the contract's order; unset optional fields are left out."""
    out: dict[str, float] = {}
    for name in STEP_FIELDS:
        field = common_pb2.MetricEvent.DESCRIPTOR.fields_by_name[name]
        if field.has_presence and not event.HasField(name):
            continue
        out[name] = float(getattr(event, name))
    for key in sorted(event.reward_components):
        out[COMPONENT_PREFIX + key] = float(event.reward_components[key])
    for key in sorted(event.class_f1):  # a Head job's evaluations: each class's F1
        out[CLASS_F1_PREFIX + key] = float(event.class_f1[key])
    return out


def summary_values(tiles: Mapping[str, float]) -> dict[str, float]:
    """The final tiles (StatTiles: steps, final_reward, ...) as numbers."""
    return {k: float(v) for k, v in tiles.items()}


def spec_config(spec: common_pb2.JobSpec) -> dict[str, Any]:
    """The job spec as a nested dict (field names as in the contract, defaults included)."""
    return MessageToDict(spec, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


def flat_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config flattened to "a.b.c" -> text (MLflow's params); lists as JSON."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat_params(value, name + "."))
        else:
            out[name] = json.dumps(value) if isinstance(value, list) else str(value)
    return out


def safe_name(text: str) -> str:
    """A name usable as a folder (TensorBoard run, W&B run id): letters, digits, . _ - only."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "run"
