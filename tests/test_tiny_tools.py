"""The tools model's parts (rlvr/tiny/tools.py, the "tools" recipe): the tokenizer's tool tags, the
warm-up's two-turn tool episode (its tokens and where the loss is), the calculator, and the
two-turn evaluation protocol on a scripted model. No build: seconds."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch  # noqa: E402

from rlvr.tasks import math_pairs as mp  # noqa: E402
from rlvr.tasks.render import render_prompt  # noqa: E402
from rlvr.tiny.build import RECIPES, _examples, default_model_name, recipe_record  # noqa: E402
from rlvr.tiny.tokenizer import CHAT_TEMPLATE, IM_END, TOOL_TAGS, build_tokenizer  # noqa: E402
from rlvr.tiny.tools import (  # noqa: E402
    CalculatorError,
    calculate,
    call_text,
    evaluate_tools,
    expression,
    parse_call,
    run_episodes,
)

EPISODE = ('<|im_start|>user\n3 4 5 6<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{"name": "calculate", '
           '"arguments": {"expression": "(3+4)*(5+6)"}}\n</tool_call><|im_end|>\n<|im_start|>tool\n77<|im_end|>\n'
           '<|im_start|>assistant\n<think>~77</think><answer>77</answer><|im_end|>\n')


@pytest.fixture(scope="module")
def tok():  # noqa: ANN201
    return build_tokenizer(number_tokens=325, tool_tags=True)


def test_the_tool_tags_option_leaves_the_other_tokenizers_unchanged() -> None:
    for numbers in (0, 325):
        plain, off, on = build_tokenizer(number_tokens=numbers), *(build_tokenizer(number_tokens=numbers, tool_tags=t) for t in (False, True))
        assert plain.get_vocab() == off.get_vocab() and plain.chat_template == off.chat_template == CHAT_TEMPLATE
        vocab = on.get_vocab()
        assert {k: vocab[k] for k in plain.get_vocab()} == plain.get_vocab()  # every earlier id kept
        assert sorted(vocab[t] for t in TOOL_TAGS) == list(range(len(plain), len(plain) + len(TOOL_TAGS)))
    assert RECIPES["tools"].number_tokens == RECIPES["headroom"].number_tokens
    assert default_model_name("tools") == "rlvr-tiny-tools"


def test_a_call_is_a_few_tokens_and_round_trips(tok) -> None:  # noqa: ANN001
    call = call_text(expression((3, 14, 5, 6)))
    ids = tok(call, add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(ids)[:3] == ["<tool_call>", "Ċ", '{"name": "calculate", "arguments": {"expression": "']
    assert len(ids) == 3 + len("(3+14)*(5+6)") - 1 + 3 and tok.decode(ids) == call  # "14" is one number token


def test_the_tools_template_renders_calls_in_the_content_or_in_tool_calls_alike(tok) -> None:  # noqa: ANN001
    user = {"role": "user", "content": "3 4 5 6"}
    rest = [{"role": "tool", "content": "77"},
            {"role": "assistant", "content": "<think>~77</think><answer>77</answer>"}]
    call = {"name": "calculate", "arguments": {"expression": "(3+4)*(5+6)"}}
    forms = [{"role": "assistant", "content": call_text("(3+4)*(5+6)")},
             {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": call}]},
             {"role": "assistant", "tool_calls": [call]},
             {"role": "assistant", "content": None, "tool_calls": [
                 {"type": "function", "function": {**call, "arguments": '{"expression": "(3+4)*(5+6)"}'}}]},
             {"role": "assistant", "content": call_text("(3+4)*(5+6)"), "tool_calls": [call]}]
    for form in forms:
        assert tok.apply_chat_template([user, form, *rest], tokenize=False) == EPISODE, form
    plain = build_tokenizer(number_tokens=325)
    for messages in ([user], [user, *rest], [user, forms[0]]):  # no tool_calls: as CHAT_TEMPLATE renders
        for prompt in (True, False):
            assert (tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
                    == plain.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt))


def test_the_recipe_records_keep_cached_builds_valid() -> None:
    assert "tool_share" not in recipe_record(RECIPES["headroom"]) and "tool_after" not in recipe_record(RECIPES["default"])
    assert recipe_record(RECIPES["tools"])["tool_share"] == RECIPES["tools"].tool_share > 0


def test_the_tool_episode_trains_on_the_assistant_turns_only(tok) -> None:  # noqa: ANN001
    messages = [{"role": "user", "content": "3 4 5 6"},
                {"role": "assistant", "content": call_text("(3+4)*(5+6)")},
                {"role": "tool", "content": "77"},
                {"role": "assistant", "content": "<think>~77</think><answer>77</answer>"}]
    assert tok.apply_chat_template(messages, tokenize=False) == EPISODE  # the template renders it as is
    ids, labels = _examples(tok, 12, seed=0, tool_share=1.0)
    for row, row_labels, problem in zip(ids, labels, mp.training_problems(12, 0), strict=True):
        numbers = mp.parse_numbers(problem.question)
        answer = str(mp.answer(numbers))
        text = EPISODE.replace("3 4 5 6", problem.compact).replace("(3+4)*(5+6)", expression(numbers))
        expected = tok(text.replace("77", answer).removesuffix("\n"), add_special_tokens=False)["input_ids"]
        used = row[row != tok.pad_token_id].tolist()
        assert used == expected  # the pieces tokenize as the whole episode does
        trained = [t for t in row_labels.tolist() if t != -100]
        assert tok.decode(trained) == (call_text(expression(numbers)) + IM_END
                                       + f"<think>~{answer}</think><answer>{answer}</answer>" + IM_END)
        # the labels sit on the very positions of those tokens: the prompt, the tool message and the
        # next turn's header are masked
        at = [i for i, t in enumerate(row_labels.tolist()) if t != -100]
        assert row[at].tolist() == trained
        prompt = len(tok(render_prompt(tok, problem), add_special_tokens=False)["input_ids"])
        assert min(at) == prompt and "<|im_start|>" not in tok.decode(row[at])


def test_a_share_of_tool_episodes_leaves_the_other_examples_as_they_were(tok) -> None:  # noqa: ANN001
    plain, _ = _examples(tok, 200, seed=0, direct_share=0.6, direct_from=20)
    mixed, _ = _examples(tok, 200, seed=0, direct_share=0.6, direct_from=20, tool_share=0.25, tool_from=40)
    open_id = tok.convert_tokens_to_ids("<tool_call>")
    tools = [bool((row == open_id).any()) for row in mixed]
    assert not any(tools[:40]) and 30 <= sum(tools) <= 50  # a hash picks about a quarter after tool_from
    width = plain.shape[1]
    for i, tool in enumerate(tools):
        if not tool:
            assert torch.equal(mixed[i, :width], plain[i]) and not mixed[i, width:].ne(tok.pad_token_id).any()


def test_the_big_sums_take_their_own_share(tok) -> None:  # noqa: ANN001
    ids, _ = _examples(tok, 100, seed=0, tool_hard=(25, 1.0))
    open_id = tok.convert_tokens_to_ids("<tool_call>")
    big = [sum(mp.parse_numbers(p.question)) >= 25 for p in mp.training_problems(100, 0)]
    assert [bool((row == open_id).any()) for row in ids] == big and any(big)


def test_wide_episodes_are_never_math_pairs_problems(tok) -> None:  # noqa: ANN001
    ids, labels = _examples(tok, 60, seed=0, tool_wide=0.5)
    wide = 0
    for row, problem in zip(ids, mp.training_problems(60, 0), strict=True):
        text = tok.decode(row, skip_special_tokens=True)
        numbers = tuple(int(x) for x in text.split("user\n")[1].split("assistant")[0].split())
        if "<tool_call>" in text:
            wide += 1
            assert max(numbers) > 9 and f"tool\n{(numbers[0] + numbers[1]) * (numbers[2] + numbers[3])}\n" in text
        else:
            assert numbers == mp.parse_numbers(problem.question)
    assert 20 <= wide <= 40


def test_a_tools_build_outside_its_gate_fails() -> None:
    from rlvr.tiny.build import BuildFailedGate, check_tool_gate

    def found(use: float, right: float) -> dict[str, object]:
        return {"greedy": {"tool_use": use, "accuracy_with_tool": right}}

    check_tool_gate(found(0.186, 0.903), (0.10, 0.35, 0.85))
    for use, right in ((0.05, 0.95), (0.5, 0.95), (0.2, 0.5)):
        with pytest.raises(BuildFailedGate, match="failed its gate"):
            check_tool_gate(found(use, right), (0.10, 0.35, 0.85))


def test_the_calculator_evaluates_arithmetic_and_nothing_else() -> None:
    assert calculate("(3+4)*(5+6)") == "77" and calculate(" 12 // 5 - -3") == "5"
    for bad in ("__import__('os')", "2**100", "1/0", "7/2", "x+1", "(1+", "1.5*2", "9" * 300):
        with pytest.raises(CalculatorError):
            calculate(bad)


def test_a_call_is_parsed_or_refused() -> None:
    assert parse_call(call_text("(1+2)*(3+4)")) == "(1+2)*(3+4)"
    assert parse_call("<think>~3</think><answer>3</answer>") is None
    for bad in ("<tool_call>\n{\"name\": \"calculate\"\n</tool_call>",
                '<tool_call>\n{"name": "search", "arguments": {"expression": "1"}}\n</tool_call>',
                "<tool_call>\n"):
        assert isinstance(parse_call(bad), CalculatorError)


class ScriptedModel:
    """Calls the calculator when a problem's first number is odd, glances wrongly when it is even,
    and after a tool message copies its result; records each turn's input ids."""

    def __init__(self, tok) -> None:  # noqa: ANN001
        self.tok, self.inputs = tok, []

    def generate(self, input_ids, attention_mask, max_new_tokens, pad_token_id, **_):  # noqa: ANN001, ANN201
        rows = []
        for ids, mask in zip(input_ids, attention_mask, strict=True):
            text = self.tok.decode(ids[mask.bool()])
            self.inputs.append(text)
            if text.endswith("<|im_start|>assistant\n") and "<|im_start|>tool\n" in text:
                result = text.rsplit("<|im_start|>tool\n", 1)[1].split("<|im_end|>")[0]
                reply = f"<think>~{result}</think><answer>{result}</answer>"
            else:
                numbers = mp.parse_numbers(text.split("user\n")[1].split("<|im_end|>")[0])
                reply = call_text(expression(numbers)) if numbers[0] % 2 else "<think>~1</think><answer>1</answer>"
            new = self.tok(reply + IM_END, add_special_tokens=False)["input_ids"]
            rows.append(ids.tolist() + new + [pad_token_id] * (max_new_tokens - len(new)))
        return torch.tensor(rows)


def test_the_protocol_runs_two_turns_token_in_token_out(tok) -> None:  # noqa: ANN001
    model = ScriptedModel(tok)
    found = evaluate_tools(model, tok, "scripted", n=40, batch_size=16)
    odd = sum(mp.parse_numbers(p.question)[0] % 2 for p in mp.heldout_problems(40))
    assert (found.n, found.k, found.tool_use, found.well_formed) == (40, 1, odd / 40, 1.0)
    assert (found.accuracy_with_tool, found.accuracy_without_tool, found.accuracy) == (1.0, 0.0, odd / 40)
    second = [t for t in model.inputs if "<|im_start|>tool" in t]
    assert len(second) == odd
    problem = next(p for p in mp.heldout_problems(40) if mp.parse_numbers(p.question)[0] % 2)
    numbers = mp.parse_numbers(problem.question)
    episode = (EPISODE.replace("3 4 5 6", problem.compact).replace("(3+4)*(5+6)", expression(numbers))
               .replace("77", str(mp.answer(numbers))))
    assert episode.split("<think>")[0] in second  # turn 2 starts from exactly the episode's text
    sampled = evaluate_tools(model, tok, "scripted", n=10, k=3, temperature=0.3, batch_size=8)
    assert sampled.k == 3 and sampled.groups_with_tool_spread == 0.0  # the script never varies


def test_a_call_the_calculator_refuses_is_wrong(tok) -> None:  # noqa: ANN001
    class Refused(ScriptedModel):
        def generate(self, input_ids, attention_mask, max_new_tokens, pad_token_id, **_):  # noqa: ANN001, ANN201
            reply = tok('<tool_call>\n{"name": "calculate", "arguments": {"expression": "2**99"}}\n</tool_call>'
                        + IM_END, add_special_tokens=False)["input_ids"]
            return torch.tensor([ids.tolist() + reply for ids in input_ids])

    (episode,) = run_episodes(Refused(tok), tok, [render_prompt(tok, mp.heldout_problems(1)[0])], ["1"])
    assert episode.called and not episode.well_formed and not episode.correct
