"""The character-level tokenizer of the tiny base model.

transformers 5.x reloads any ``model_type=qwen2`` tokenizer as ``Qwen2Tokenizer`` (byte-level BPE),
silently replacing a saved WordLevel/Split pre-tokenizer, so spaces and newlines would vanish in
TRL and vLLM. The tokenizer is therefore *built* as a ``Qwen2Tokenizer`` with no merges: every one of
the 256 byte-level symbols (space is ``Ġ``, newline ``Ċ``) is its own token, which makes it a
character tokenizer for ASCII that still round-trips any UTF-8 text byte by byte.

Chat specials are special tokens (dropped by ``skip_special_tokens=True``); the answer-format tags are
ordinary added tokens, so one tag is one token and decoding keeps them, which the reward relies on.
With ``number_tokens=N`` the whole numbers 0 to N-1 are ordinary added tokens too (the longest match
wins, so ``77`` is one token and ``1234`` is ``123`` then ``4``): a model then predicts each sum and
each product of the Math Pairs chain as one token instead of digit by digit.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from rlvr.tasks.render import COMPACT_STYLE, PROMPT_STYLE_KEY

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
CHAT_SPECIALS: tuple[str, ...] = (IM_START, IM_END)
FORMAT_TAGS: tuple[str, ...] = ("<think>", "</think>", "<answer>", "</answer>")
# The tool-call tags of Hermes/Qwen tool calls, and the constant pieces of the calculator's call
# JSON around its expression (rlvr.tiny.tools): with them the whole call is four predictions plus
# the expression, so a tiny model writes it well-formed and a training row stays short. Only the
# tools model's tokenizer has them (build_tokenizer(tool_tags=True)).
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
CALCULATE_OPEN = '{"name": "calculate", "arguments": {"expression": "'
CALCULATE_CLOSE = '"}}'
TOOL_TAGS: tuple[str, ...] = (TOOL_CALL_OPEN, TOOL_CALL_CLOSE, CALCULATE_OPEN, CALCULATE_CLOSE)

# The tiny model declares the compact prompt form (see rlvr.tasks.render): every character costs a
# token, so it is warmed up on the bare problem instead of the long instruction larger models get.

# ChatML, as the Qwen2 family uses, so TRL and vLLM treat it like any Qwen chat model.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# The tools model's (build_tokenizer(tool_tags=True)): CHAT_TEMPLATE, except that an assistant
# message carrying its calls as ``tool_calls`` (OpenAI form, or {"name", "arguments"}) without the
# call's text in its content renders them in the Hermes/Qwen form, so an episode's conversation
# reads the same whether the call stays in the content or moves to ``tool_calls``:
# ``<tool_call>\n{"name": "calculate", "arguments": {...}}\n</tool_call>``, one per call, "\n" apart.
TOOLS_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% set content = message.content if message.content is string else '' %}"
    "{% if message.role == 'assistant' and message.tool_calls and '<tool_call>' not in content %}"
    "{{ '<|im_start|>assistant\n' + content }}"
    "{% for call in message.tool_calls %}"
    "{% set fn = call.function if call.function is defined else call %}"
    "{% if content or not loop.first %}{{ '\n' }}{% endif %}"
    "{{ '<tool_call>\n{\"name\": \"' + fn.name + '\", \"arguments\": ' }}"
    "{% if fn.arguments is string %}{{ fn.arguments }}{% else %}{{ fn.arguments | tojson }}{% endif %}"
    "{{ '}\n</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable-character map used by byte-level BPE."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    byte_values = printable[:]
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in byte_values:
            byte_values.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(byte_values, chars, strict=True)}


def build_vocab() -> dict[str, int]:
    """``<|endoftext|>`` at id 0, then the 256 byte-level symbols in byte order."""
    vocab = {ENDOFTEXT: 0}
    for _byte, symbol in sorted(bytes_to_unicode().items()):
        vocab[symbol] = len(vocab)
    return vocab


def build_tokenizer(model_max_length: int = 4096, number_tokens: int = 0,
                    tool_tags: bool = False):  # -> transformers.Qwen2Tokenizer
    """Build the character tokenizer (not saved; call ``save_pretrained`` on the result), with the
    whole numbers below ``number_tokens`` as single tokens (after the tags, so every other id is
    the same as without them), and with ``tool_tags`` the TOOL_TAGS as ordinary added tokens after
    those (every earlier id unchanged)."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    tokenizer = Qwen2Tokenizer(
        vocab=build_vocab(),
        merges=[],
        unk_token=None,  # every byte has a token, so nothing is ever unknown
        eos_token=IM_END,  # generation stops at the end of the assistant turn, as in Qwen2.5-Instruct
        pad_token=ENDOFTEXT,
        additional_special_tokens=list(CHAT_SPECIALS),
        model_max_length=model_max_length,
        **{PROMPT_STYLE_KEY: COMPACT_STYLE},
    )
    tokenizer.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in FORMAT_TAGS])
    if number_tokens:
        tokenizer.add_tokens([AddedToken(str(i), special=False, normalized=False) for i in range(number_tokens)])
    if tool_tags:
        tokenizer.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in TOOL_TAGS])
    tokenizer.chat_template = TOOLS_CHAT_TEMPLATE if tool_tags else CHAT_TEMPLATE
    tokenizer.padding_side = "left"  # decoder-only batched generation pads on the left
    return tokenizer


def save_tokenizer(out_dir: str | Path, model_max_length: int = 4096, number_tokens: int = 0,
                   tool_tags: bool = False) -> int:
    """Write the tokenizer files into ``out_dir``; returns the tokenizer's length (vocab + added)."""
    tokenizer = build_tokenizer(model_max_length, number_tokens, tool_tags)
    tokenizer.save_pretrained(str(out_dir))
    return len(tokenizer)
