"""Turning a Problem into the prompt text a model sees, through the model's own chat template.

Two prompt forms exist. The *full* form appends an instruction asking for
``<think>…</think><answer>…</answer>``, which is what a pretrained instruct model needs. A model may
declare the *compact* form (key ``rlvr_prompt_style: "compact"`` in its tokenizer config or
config, or in an ``rlvr_model.json`` beside its weights): it gets the bare problem, because it was
warmed up on that format and, being character-level, pays one token per character of instruction.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from rlvr.tasks.base import Problem, RewardFunction

PromptStyle = Literal["full", "compact"]
PROMPT_STYLE_KEY = "rlvr_prompt_style"
COMPACT_STYLE: PromptStyle = "compact"
FULL_STYLE: PromptStyle = "full"
MODEL_MARKER_FILE = "rlvr_model.json"

INSTRUCTIONS: dict[RewardFunction, str] = {
    "math_pairs": (
        "Think step by step inside <think></think>, then give only the final number inside <answer></answer>."
    ),
    "gsm8k": (
        "Think step by step inside <think></think>, then give only the final number inside <answer></answer>."
    ),
    "boxed": (
        "Think step by step inside <think></think>, then give the final answer as \\boxed{...} "
        "inside <answer></answer>."
    ),
    "code": (
        "Think step by step inside <think></think>, then give the code as one ```python block "
        "inside <answer></answer>."
    ),
}


def _style_value(value: object) -> PromptStyle | None:
    return COMPACT_STYLE if value == COMPACT_STYLE else (FULL_STYLE if value == FULL_STYLE else None)


def prompt_style(tokenizer: Any) -> PromptStyle:  # Any: any transformers tokenizer (or vLLM's wrapper)
    """The prompt form a model declares; ``full`` unless it says ``compact``."""
    declared = _style_value(getattr(tokenizer, "init_kwargs", {}).get(PROMPT_STYLE_KEY))
    if declared is not None:
        return declared
    name = getattr(tokenizer, "name_or_path", "") or ""
    return model_dir_prompt_style(name) if name else FULL_STYLE


def model_dir_prompt_style(model_dir: str | Path) -> PromptStyle:
    """The prompt form declared by the files of a local model directory (``full`` otherwise)."""
    directory = Path(model_dir)
    for filename in (MODEL_MARKER_FILE, "tokenizer_config.json", "config.json"):
        path = directory / filename
        if not path.is_file():
            continue
        try:
            declared = _style_value(json.loads(path.read_text(encoding="utf-8")).get(PROMPT_STYLE_KEY))
        except (OSError, ValueError, AttributeError):
            continue  # an unreadable or odd file declares nothing
        if declared is not None:
            return declared
    return FULL_STYLE


def prompt_messages(problem: Problem, style: PromptStyle = FULL_STYLE) -> list[dict[str, str]]:
    """The conversation for a problem (TRL's conversational prompt format)."""
    if problem.messages:
        messages = [{"role": m.role, "content": m.content} for m in problem.messages]
    else:
        question = problem.compact if style == COMPACT_STYLE and problem.compact else problem.question
        messages = [{"role": "user", "content": question}]
    if style == FULL_STYLE:
        # the instruction goes in the user's turn: some chat templates have no system role
        last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
        if last_user is None:
            messages.append({"role": "user", "content": INSTRUCTIONS[problem.task]})
        else:
            turn = messages[last_user]
            turn["content"] = f"{turn['content']}\n\n{INSTRUCTIONS[problem.task]}"
    return messages


def render_prompt(tokenizer: Any, problem: Problem, style: PromptStyle | None = None) -> str:
    """The prompt text for ``problem``, ending where the model's answer starts.

    ``style`` overrides what the model declares. A tokenizer without a chat template (a base model)
    gets the turns' contents joined by blank lines.
    """
    messages = prompt_messages(problem, style or prompt_style(tokenizer))
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "\n\n".join(m["content"] for m in messages) + "\n"
