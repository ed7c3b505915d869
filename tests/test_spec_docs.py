"""The JobSpec's proto comments (what users read in the contract, and the generated CLI shows) state
the same ranges and defaults as rlvr/jobspec/, the one place the code takes them from."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlvr import jobspec

PROTO = Path(__file__).resolve().parent.parent / "protos" / "rlvr" / "v1" / "common.proto"

# path -> its range and default: every row of rlvr/jobspec/fields.py's table that has a range
RANGED = {row.path: row.range for row in jobspec.SPEC_FIELDS if row.range is not None and row.name != "seed"}
DOC = PROTO.parents[3] / "docs" / "spec-fields.md"
NUMBER = r"([0-9]+(?:\.[0-9]+)?(?:e-?[0-9]+)?)"
# The spec's cards' messages -> the JobSpec path of their fields
SPEC_MESSAGES = {"RewardConfig": "reward", "GrpoConfig": "grpo", "SftConfig": "sft", "HeadConfig": "head",
                 "AdvancedOptions": "advanced"}


def field_comments() -> dict[str, str]:
    """Each field of the spec's cards, by path ("grpo.batch_size") -> the comment lines right above it, joined."""
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
            comments[f"{SPEC_MESSAGES[message]}.{match.group(1)}"] = " ".join(pending)
        pending = []
    return comments


@pytest.mark.parametrize("field", sorted(RANGED))
def test_range_and_default_in_the_proto_match_the_spec_module(field: str) -> None:
    comment = field_comments()[field]
    rng = RANGED[field]
    assert rng is not None
    match = re.search(rf"Range {NUMBER}(?:-| to ){NUMBER}, default {NUMBER}", comment)
    assert match, f"{field}: no 'Range a-b, default c' in its proto comment: {comment!r}"
    low, high, default = (float(g) for g in match.groups())
    assert (low, high, default) == (float(rng.low), float(rng.high), float(rng.default)), field


def test_the_other_stated_defaults_match() -> None:
    comments = field_comments()
    assert f"Default {jobspec.MAX_STEPS_DEFAULT}." in comments["grpo.max_steps"]
    sizes = ", ".join(map(str, jobspec.BATCH_SIZES))
    assert f"One of {sizes}; default {jobspec.BATCH_SIZE_DEFAULT}." in comments["grpo.batch_size"]
    assert f'Default "{jobspec.DEFAULT_DATASET_SPLIT}"' in comments["reward.dataset_split"]
    for init in jobspec.LORA_INITS:
        assert f'"{init}"' in comments["advanced.lora_init"]
    for precision in jobspec.PRECISIONS:
        assert f'"{precision}"' in comments["advanced.precision"]
    assert f'Default "{jobspec.SFT_DEFAULT_SPLIT}"' in comments["sft.dataset_split"]
    assert "Default -1." in comments["sft.max_steps"] and jobspec.FIELDS_BY_PATH["sft.max_steps"].default == -1
    assert '"all-linear" (default' in comments["sft.target_modules"]
    assert "Default true" in comments["sft.completion_only_loss"]
    assert f'Default "{jobspec.SFT_DEFAULT_SPLIT}"' in comments["head.dataset_split"]
    assert "Default -1." in comments["head.max_steps"] and jobspec.FIELDS_BY_PATH["head.max_steps"].default == -1
    assert '"all-linear" (default' in comments["head.target_modules"]
    for column in ("text_column", "label_column"):
        assert f'Default "{jobspec.FIELDS_BY_PATH[f"head.{column}"].default}"' in comments[f"head.{column}"]


def test_the_field_reference_is_written_from_the_table() -> None:
    """docs/spec-fields.md is `fields_markdown()`'s output (RLVR_WRITE_DOCS=1 rewrites it)."""
    import os

    text = jobspec.fields_markdown()
    if os.environ.get("RLVR_WRITE_DOCS"):
        DOC.write_text(text)
    assert DOC.read_text() == text, "docs/spec-fields.md is stale: RLVR_WRITE_DOCS=1 pytest tests/test_spec_docs.py"
    for row in jobspec.SPEC_FIELDS:
        assert f"| `{row.path}` | {row.label} |" in text


def test_every_row_is_a_proto_field_and_reaches_the_cli_form_and_trainer() -> None:
    import dataclasses

    from rlvr.clients.commands.train import SPEC_FLAGS, flag_dest
    from rlvr.clients.web import forms
    from rlvr.services.trainer.job.config import HeadSettings, JobConfig, SftSettings

    config_fields = {f.name for f in dataclasses.fields(JobConfig)}
    for card, settings in (("sft", SftSettings), ("head", HeadSettings)):  # each card, whole
        assert {f.name for f in dataclasses.fields(settings)} == {r.name for r in jobspec.SPEC_FIELDS if r.card == card}
    flags = {flag: (group, name) for flag, group, name, _, _ in SPEC_FLAGS}
    import argparse

    from rlvr.clients.commands.train import add_train_arguments

    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    dests = [a.dest for a in parser._actions]
    assert len(dests) == len(set(dests)), "two flags would write one attribute (--lr and --sft-lr, --name)"
    assert {flag_dest(group, name) for _, group, name, _, _ in SPEC_FLAGS} <= set(dests)
    for row in jobspec.SPEC_FIELDS:
        jobspec.proto_field(row)  # KeyError if the table names a field the proto lacks
        assert row.path in forms.ALL_FIELDS and forms.ALL_FIELDS[row.path].label == row.label
        assert row.config_name is None or row.config_name in config_fields, row.path
        if row.flag:
            assert flags[row.flag] == (row.group, row.name)
        if row.range is not None:
            assert row.allowed() == f"{row.range.text()} (default {row.default_text()})"
