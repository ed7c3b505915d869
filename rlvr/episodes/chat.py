"""The model's chat template as token-in, token-out operations.

`ChatCodec(tokenizer, tools=None, template_kwargs=None)`:
- ``prompt_ids(messages) -> list[int]``: the episode's first prompt, ``apply_chat_template(messages,
  tools=tools, add_generation_prompt=True)``.
- ``after_turn(conversation, new_messages) -> list[int] | None``: the ids to append after an
  assistant turn's sampled ids (which end with its stop token when it stopped): the rest of the
  assistant turn's closing after the stop token, the new messages (tool results, the environment's
  user reply) and the next generation prompt; computed from the template by rendering, tokenized
  once. ``conversation`` is the conversation so far, the just-sampled assistant message last. None
  when the template does not only append for these messages: the caller starts a new sample from
  ``prompt_ids(conversation + new_messages)``.
- ``parse_tool_calls(text) -> (calls, errors)``: the tool calls in an assistant turn's text.
- ``assistant_message(text, calls) -> dict``: the turn as it enters the conversation.
- ``stop_ids``: the ids that end an assistant turn.

How ``after_turn`` decides, for any template (no model names): it renders the conversation
(``a``, ending with the assistant turn and its closing, e.g. ``...<|im_end|>\\n``) and the
conversation plus the new messages with the generation prompt (``b``). The sampled ids cover ``a``
up to the end of the stop token; if ``b`` starts with exactly that text, what follows in ``b`` is
what to append (ChatML: ``"\\n<|im_start|>user\\n<tool_response>...<|im_end|>\\n<|im_start|>assistant\\n"``),
tokenized once with ``add_special_tokens=False`` (it starts right after a special token, so it
tokenizes as it does inside the whole text). If ``b`` renders the earlier text differently (Qwen3
drops a turn's ``<think>`` once a later user message follows, and its empty ``<think>`` block once
any message follows), the answer is None and the episode splits. Nothing earlier is ever
re-tokenized: the sampled ids stay as sampled.

The verdict depends on the messages' contents (Qwen3 keeps a non-empty thinking before a tool
result but not an empty one), so it is decided per call: two renders of the conversation, which
cost far less than sampling a turn. What does not depend on them is found once per codec by
rendering probe conversations: the assistant turn's closing and stop token, whether the template
renders ``tool_calls``, and the tool-call format (a small registry chosen from the template text).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlvr.environments.base import ToolCall

__all__ = ["ChatCodec", "ChatCodecs", "TOOL_CALL_FORMATS", "ToolCallFormat", "parse_hermes", "parse_llama3_json", "tool_message"]

_PROBE_USER = "rlvr-probe-user-7f3a"
_PROBE_REPLY = "rlvr-probe-reply-7f3a"
_PROBE_TOOL = "rlvr_probe_tool_7f3a"
# Turn enders a template may use besides the closing it renders for a plain answer (Llama 3.1 ends a
# built-in tool call with <|eom_id|>): stop ids when the template names them and the vocabulary has them.
_OTHER_TURN_ENDERS = ("<|eom_id|>",)


# --- tool-call formats ------------------------------------------------------------------------------

def _arguments(obj: Mapping[str, Any], key_order: Sequence[str]) -> tuple[Mapping[str, Any] | None, str]:
    for key in key_order:
        if key in obj:
            value = obj[key]
            if isinstance(value, str):
                try:
                    value = json.loads(value) if value.strip() else {}
                except json.JSONDecodeError as e:
                    return None, f"its {key} are not valid JSON ({e.msg})"
            if not isinstance(value, Mapping):
                return None, f"its {key} are not a JSON object"
            return value, ""
    return {}, ""


def _call_from_json(raw: str, where: str, key_order: Sequence[str]) -> tuple[ToolCall | None, str]:
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as e:
        return None, f"{where}: not valid JSON ({e.msg} at character {e.pos})"
    if not isinstance(obj, Mapping):
        return None, f"{where}: not a JSON object"
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None, f"{where}: no tool name (\"name\" is missing or not a string)"
    arguments, problem = _arguments(obj, key_order)
    if arguments is None:
        return None, f"{where} ({name}): {problem}"
    call_id = obj.get("id")
    return ToolCall(name=name.strip(), arguments=dict(arguments), id=call_id if isinstance(call_id, str) else ""), ""


_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_HERMES_OPEN = re.compile(r"<tool_call>(?!.*</tool_call>)(.*)\Z", re.DOTALL)


def parse_hermes(text: str) -> tuple[list[ToolCall], list[str]]:
    """``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` blocks (Hermes, Qwen2.5, Qwen3)."""
    calls: list[ToolCall] = []
    errors: list[str] = []
    blocks = _HERMES_BLOCK.findall(text)
    for n, raw in enumerate(blocks, start=1):
        call, error = _call_from_json(raw.strip(), f"tool call {n}", ("arguments", "parameters"))
        if call is not None:
            calls.append(call)
        else:
            errors.append(error)
    if _HERMES_OPEN.search(_HERMES_BLOCK.sub("", text)):
        errors.append(f"tool call {len(blocks) + 1}: <tool_call> is never closed by </tool_call>")
    return calls, errors


def _strip_hermes(text: str) -> str:
    return _HERMES_OPEN.sub("", _HERMES_BLOCK.sub("", text)).strip()


_PYTHON_TAG = "<|python_tag|>"


def _llama_body(text: str) -> str | None:
    """The text of a Llama 3 JSON tool call when the whole answer is one (else None)."""
    body = text.strip()
    if body.startswith(_PYTHON_TAG):
        body = body[len(_PYTHON_TAG):].strip()
    if body.startswith("{") and '"name"' in body:
        return body
    return None


def parse_llama3_json(text: str) -> tuple[list[ToolCall], list[str]]:
    """Llama 3.x JSON tool calls: the whole answer is ``{"name": ..., "parameters": {...}}`` (the
    template renders one call a turn); several may be separated by ``;``."""
    body = _llama_body(text)
    if body is None:
        return [], []
    calls: list[ToolCall] = []
    errors: list[str] = []
    try:
        json.loads(body)
        parts = [body]
    except json.JSONDecodeError:
        parts = [p for p in body.split(";") if p.strip()]
    for n, raw in enumerate(parts, start=1):
        call, error = _call_from_json(raw.strip(), f"tool call {n}", ("parameters", "arguments"))
        if call is not None:
            calls.append(call)
        else:
            errors.append(error)
    return calls, errors


def _strip_llama3_json(text: str) -> str:
    return "" if _llama_body(text) is not None else text.strip()


@dataclass(frozen=True)
class ToolCallFormat:
    """A tool-call format: how to find the calls in a turn's text and what text is left besides them."""

    name: str
    parse: Callable[[str], tuple[list[ToolCall], list[str]]]
    strip: Callable[[str], str]
    matches: Callable[[str], bool]  # does a chat template's text use this format?


# First match wins; Hermes is also the default (a template without tools support, like the tiny model's).
TOOL_CALL_FORMATS: tuple[ToolCallFormat, ...] = (
    ToolCallFormat("hermes", parse_hermes, _strip_hermes, lambda t: "<tool_call>" in t),
    ToolCallFormat("llama3_json", parse_llama3_json, _strip_llama3_json,
                   lambda t: "<|start_header_id|>" in t and '"parameters"' in t),
)


def _format_for(template_text: str, name: str | None) -> ToolCallFormat:
    for fmt in TOOL_CALL_FORMATS:
        if (fmt.name == name) if name else fmt.matches(template_text):
            return fmt
    if name:
        raise ValueError(f"unknown tool-call format {name!r} (known: {', '.join(f.name for f in TOOL_CALL_FORMATS)})")
    return TOOL_CALL_FORMATS[0]


def tool_message(call: ToolCall, content: str) -> dict[str, Any]:
    """A tool's result as the conversation's ``tool`` message."""
    message: dict[str, Any] = {"role": "tool", "name": call.name, "content": content}
    if call.id:
        message["tool_call_id"] = call.id
    return message


# --- the codec --------------------------------------------------------------------------------------

def _plain_ids(out: Any) -> list[int]:
    """apply_chat_template's ids as a flat list, whatever it returned (a BatchEncoding or dict with
    input_ids, a tensor, a list, a batch of one)."""
    if isinstance(out, Mapping) or hasattr(out, "input_ids"):
        out = out["input_ids"]
    if hasattr(out, "tolist"):
        out = out.tolist()
    out = list(out)
    if out and isinstance(out[0], (list, tuple)):
        if len(out) != 1:
            raise ValueError(f"expected the ids of one conversation, got a batch of {len(out)}")
        out = list(out[0])
    return [int(i) for i in out]


class ChatCodec:
    """One tokenizer's chat template (with the job's tools and template options) for an episode."""

    def __init__(self, tokenizer: Any, tools: list[dict] | None = None,
                 template_kwargs: Mapping[str, Any] | None = None, *, tool_format: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.tools = list(tools) if tools else None
        self.template_kwargs = dict(template_kwargs or {})
        template = self.template_kwargs.get("chat_template") or getattr(tokenizer, "chat_template", None)
        if not template:
            raise ValueError("the tokenizer has no chat template")
        self.template_text = template if isinstance(template, str) else "\n".join(map(str, dict(template).values()))
        self.tool_format = _format_for(self.template_text, tool_format)
        self._added = {tok: int(i) for tok, i in tokenizer.get_added_vocab().items()}
        self._find_closing()
        self.renders_tool_calls = self._probe_tool_calls()

    # rendering -----------------------------------------------------------------------------------

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> str:
        """The template's text for ``messages`` (with the codec's tools and options)."""
        text = self.tokenizer.apply_chat_template(
            list(messages), tools=self.tools, add_generation_prompt=add_generation_prompt, tokenize=False,
            **self.template_kwargs)
        if not isinstance(text, str):  # a batch of one
            text = text[0]
        return text

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]

    def prompt_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        out = self.tokenizer.apply_chat_template(
            list(messages), tools=self.tools, add_generation_prompt=True, tokenize=True, return_dict=False,
            **self.template_kwargs)
        return _plain_ids(out)

    def _find_closing(self) -> None:
        """The assistant turn's closing (ChatML ``<|im_end|>\\n``, Llama 3 ``<|eot_id|>``): its stop
        token (the first added token in it) and what follows the stop token."""
        user = {"role": "user", "content": _PROBE_USER}
        rendered = self.render([user, {"role": "assistant", "content": _PROBE_REPLY}], False)
        closing = rendered[rendered.rfind(_PROBE_REPLY) + len(_PROBE_REPLY):]
        if not any(tok in closing for tok in self._added):
            # The template leaves its last assistant turn open: the closing shows before the next message.
            rendered = self.render([user, {"role": "assistant", "content": _PROBE_REPLY}, user], False)
            closing = rendered[rendered.rfind(_PROBE_REPLY) + len(_PROBE_REPLY):rendered.rfind(_PROBE_USER)]
        found = [(closing.find(tok), tok) for tok in self._added if tok and tok in closing]
        if found:
            stop_text = min(found, key=lambda f: (f[0], -len(f[1])))[1]
        elif getattr(self.tokenizer, "eos_token", None):
            stop_text = self.tokenizer.eos_token
        else:
            raise ValueError(f"cannot find the token that ends an assistant turn in the template's closing {closing!r}")
        self.stop_text: str = stop_text
        self.after_stop: str = closing.split(stop_text, 1)[1] if stop_text in closing else ""
        stop_texts = [stop_text] + [t for t in _OTHER_TURN_ENDERS if t in self.template_text and t in self._added]
        self._stop_texts = list(dict.fromkeys(stop_texts))
        ids = [self._added[t] for t in self._stop_texts if t in self._added]
        self.turn_enders: list[int] = list(dict.fromkeys(ids))  # the turn-end tokens the template renders
        eos = getattr(self.tokenizer, "eos_token_id", None)
        ids += list(eos) if isinstance(eos, (list, tuple)) else ([eos] if eos is not None else [])
        self.stop_ids: list[int] = list(dict.fromkeys(int(i) for i in ids))
        self.turn_end_ids: list[int] = self.encode(stop_text)  # what to append when a turn was cut unstopped

    def _probe_tool_calls(self) -> bool:
        """Does the template render an assistant message's ``tool_calls``?"""
        call = ToolCall(_PROBE_TOOL, {})
        try:
            text = self.render([{"role": "user", "content": _PROBE_USER}, self.assistant_message("", [call])], False)
        except Exception:  # a template may refuse a message form: then it does not render it
            return False
        return _PROBE_TOOL in text

    # turns ---------------------------------------------------------------------------------------

    def _stop_end(self, a: str, b: str) -> int | None:
        """Where the sampled ids end in ``a`` (just after the last turn's stop token); past len(a)
        when the template leaves the last turn open and ``b`` closes it."""
        for stop in self._stop_texts:
            if a.endswith(stop + self.after_stop):
                return len(a) - len(self.after_stop)
        if b.startswith(a):
            rest = b[len(a):]
            for stop in self._stop_texts:
                if rest.startswith(stop):
                    return len(a) + len(stop)
        return None

    def after_turn(self, conversation: Sequence[Mapping[str, Any]],
                   new_messages: Sequence[Mapping[str, Any]]) -> list[int] | None:
        """The ids that follow the last assistant turn's stop token: the rest of its closing,
        ``new_messages`` and the next generation prompt; None when rendering them changes earlier
        text (start a new sample). A turn cut before its stop token needs ``turn_end_ids`` first."""
        a = self.render(conversation, False)
        b = self.render([*conversation, *new_messages], True)
        end = self._stop_end(a, b)
        if end is None or not b.startswith(a[:end]):
            return None
        return self.encode(b[end:])

    def parse_tool_calls(self, text: str) -> tuple[list[ToolCall], list[str]]:
        """The calls in an assistant turn's text and an error for each malformed one (never raises)."""
        try:
            return self.tool_format.parse(text)
        except Exception as e:  # a parser bug must not end the episode
            return [], [f"tool calls could not be read: {type(e).__name__}: {e}"]

    def assistant_message(self, text: str, calls: Sequence[ToolCall]) -> dict[str, Any]:
        """The turn as the conversation holds it: its text without the tool-call blocks (the template
        renders ``tool_calls`` itself), or the whole text when the template does not render them."""
        message: dict[str, Any] = {"role": "assistant"}
        if calls:
            rendered_calls = getattr(self, "renders_tool_calls", True)
            message["content"] = self.tool_format.strip(text) if rendered_calls else text.strip()
            message["tool_calls"] = [
                {"type": "function", **({"id": c.id} if c.id else {}),
                 "function": {"name": c.name, "arguments": dict(c.arguments)}}
                for c in calls]
        else:
            message["content"] = text.strip()
        return message

    def tool_message(self, call: ToolCall, content: str) -> dict[str, Any]:
        return tool_message(call, content)


class ChatCodecs:
    """A tokenizer's chat codecs, one per set of tool schemas (an environment's tools), each made
    once: what an episode runner hands `run_episode` as ``codec_for``, with ``decode``."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._codecs: dict[str, ChatCodec] = {}

    def __call__(self, schemas: list[dict[str, Any]]) -> ChatCodec:
        key = json.dumps(schemas, sort_keys=True)
        if key not in self._codecs:
            self._codecs[key] = ChatCodec(self.tokenizer, tools=schemas or None)
        return self._codecs[key]

    def decode(self, ids: list[int]) -> str:
        """A turn's text, special tokens skipped."""
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))
