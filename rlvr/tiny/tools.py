"""The calculator tool episode of the tools model (`rlvr-tiny-tools`): its warm-up text and the
two-turn protocol that measures it (``python -m rlvr.tiny eval MODEL --tools``).

The episode, in ChatML with a Hermes/Qwen tool call, as the episode code tokenizes it::

    <|im_start|>user\\n3 4 5 6<|im_end|>\\n<|im_start|>assistant\\n<tool_call>\\n{"name": "calculate",
    "arguments": {"expression": "(3+4)*(5+6)"}}\\n</tool_call><|im_end|>\\n<|im_start|>tool\\n77<|im_end|>
    \\n<|im_start|>assistant\\n<think>~77</think><answer>77</answer><|im_end|>\\n

Turn 1 calls the tool; the environment appends the tool message (the calculator's integer result as
text) and the next assistant header; turn 2 answers in the usual format, copying the result. An
answer without a call is the final answer, as the headroom model's one turn.

The evaluation runs that protocol on any saved causal LM, token in, token out: each turn's sampled
ids up to and including its ``<|im_end|>``, then the observation's ids appended (the template's
``\\n`` after the end of the turn, the tool message and the next header), then turn 2 from there.
"""

from __future__ import annotations

import ast
import hashlib
import json
import operator
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from rlvr.tiny.tokenizer import IM_END, IM_START, TOOL_CALL_CLOSE, TOOL_CALL_OPEN

TOOL_NAME = "calculate"
CALL = re.compile(re.escape(TOOL_CALL_OPEN) + r"\n(.*?)\n" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)


def expression(numbers: Sequence[int]) -> str:
    """The Math Pairs problem as the calculator's expression.

    >>> expression((3, 4, 5, 6))
    '(3+4)*(5+6)'
    """
    a, b, c, d = numbers
    return f"({a}+{b})*({c}+{d})"


def call_text(expr: str) -> str:
    """Turn 1 of a tool episode (without its ``<|im_end|>``): one calculate call.

    >>> call_text("(3+4)*(5+6)")
    '<tool_call>\\n{"name": "calculate", "arguments": {"expression": "(3+4)*(5+6)"}}\\n</tool_call>'
    """
    body = json.dumps({"name": TOOL_NAME, "arguments": {"expression": expr}})
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def observation_text(result: str) -> str:
    """What the environment appends after a turn's ``<|im_end|>``: the rest of the template's
    closing (``\\n``), the tool message and the next assistant header."""
    return f"\n{IM_START}tool\n{result}{IM_END}\n{IM_START}assistant\n"


def glance_after_tool(result: str) -> str:
    """Turn 2: the usual answer format, copying the tool's result."""
    return f"<think>~{result}</think><answer>{result}</answer>"


def episode_pieces(numbers: Sequence[int]) -> tuple[str, str, str]:
    """(turn 1 with its <|im_end|>, the observation, turn 2 with its <|im_end|>) of the warm-up's
    tool episode on a problem; the prompt before them is the usual one (render_prompt)."""
    result = calculate(expression(numbers))
    return call_text(expression(numbers)) + IM_END, observation_text(result), glance_after_tool(result) + IM_END


WIDE_MAX = 19


def is_tool(seed: int, index: int, share: float, kind: str = "tool-episode") -> bool:
    """Whether example `index` of the seed's sequence is a tool episode: `share` of them, by hash."""
    digest = hashlib.sha256(f"rlvr.tiny.{kind}:{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < share * 2**64


def wide_numbers(seed: int, index: int) -> tuple[int, int, int, int]:
    """Four numbers from 1 to WIDE_MAX, at least one above Math Pairs' 9 (a hash of seed, index)."""
    for attempt in range(1000):
        digest = hashlib.sha256(f"rlvr.tiny.wide:{seed}:{index}:{attempt}".encode()).digest()
        numbers = tuple(1 + int.from_bytes(digest[2 * k:2 * k + 2], "big") % WIDE_MAX for k in range(4))
        if max(numbers) > 9:  # Math Pairs' largest
            return numbers  # type: ignore[return-value]
    raise AssertionError("unreachable")


def tool_episode_numbers(seed: int, index: int, numbers: Sequence[int], share: float,
                         hard: Sequence[float] | None, wide: float) -> Sequence[int] | None:
    """The numbers of warm-up example `index`'s tool episode, or None when it is none: `wide` of the
    examples on wide_numbers, else `share` of them (`hard[1]` where the numbers sum to `hard[0]`)."""
    if wide and is_tool(seed, index, wide, "wide-episode"):
        return wide_numbers(seed, index)
    if hard and sum(numbers) >= hard[0]:
        share = hard[1]
    return numbers if share and is_tool(seed, index, share) else None


def tool_row(tokenizer, numbers: Sequence[int]) -> tuple[list[int], list[int]]:  # noqa: ANN001
    """(ids, labels) of the warm-up's tool episode on `numbers`: the prompt, turn 1, the observation
    and turn 2, with labels on the two assistant turns only (-100 elsewhere)."""
    from rlvr.tasks.math_pairs import make_problem
    from rlvr.tasks.render import render_prompt

    prompt = tokenizer(render_prompt(tokenizer, make_problem(tuple(numbers), "tool")),  # type: ignore[arg-type]
                       add_special_tokens=False)["input_ids"]
    ids, labels = list(prompt), [-100] * len(prompt)
    for part, text in enumerate(episode_pieces(numbers)):  # turn 1, observation, turn 2
        piece = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += piece
        labels += [-100] * len(piece) if part == 1 else piece
    return ids, labels


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
MAX_EXPRESSION = 200
MAX_MAGNITUDE = 10**12


class CalculatorError(ValueError):
    """An expression the calculator does not evaluate."""


def calculate(expr: str) -> str:
    """An integer arithmetic expression (+, -, *, // and exact /, parentheses, unary minus),
    evaluated on its syntax tree (never eval), as text.

    >>> calculate("(3+4)*(5+6)"), calculate("-2*(7-10)"), calculate("9/3")
    ('77', '6', '3')
    """
    if len(expr) > MAX_EXPRESSION:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as e:
        raise CalculatorError(f"not an arithmetic expression: {expr!r}") from e
    return str(_value(tree.body))


def _value(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        value = node.value
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _value(node.operand) * (-1 if isinstance(node.op, ast.USub) else 1)
    elif isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        value = _OPS[type(node.op)](_value(node.left), _value(node.right))
    elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.FloorDiv)):
        left, right = _value(node.left), _value(node.right)
        if right == 0:
            raise CalculatorError("division by zero")
        if isinstance(node.op, ast.Div) and left % right:
            raise CalculatorError("the calculator divides whole numbers exactly only")
        value = left // right
    else:
        raise CalculatorError(f"the calculator does not evaluate {type(node).__name__}")
    if abs(value) > MAX_MAGNITUDE:
        raise CalculatorError("a number beyond the calculator's range")
    return value


def parse_call(text: str) -> str | None | CalculatorError:
    """The expression of a turn's calculate call; None when it calls no tool; a CalculatorError
    when it tries (writes ``<tool_call>``) but the call is not one well-formed calculate call."""
    if TOOL_CALL_OPEN not in text:
        return None
    found = CALL.search(text)
    if found is None:
        return CalculatorError("no well-formed <tool_call> block")
    try:
        call = json.loads(found.group(1))
    except ValueError:
        return CalculatorError("the call is not JSON")
    if not isinstance(call, dict) or call.get("name") != TOOL_NAME or not isinstance(call.get("arguments"), dict) \
            or not isinstance(call["arguments"].get("expression"), str):
        return CalculatorError('not {"name": "calculate", "arguments": {"expression": "..."}}')
    return call["arguments"]["expression"]


@dataclass(frozen=True)
class ToolEpisode:
    turn1: str
    called: bool  # turn 1 wrote <tool_call>
    well_formed: bool  # ... and it was one calculate call the calculator evaluated
    answer: str  # the final answer's turn (turn 2 after a call, else turn 1)
    correct: bool


@dataclass(frozen=True)
class ToolMeasures:
    """The two-turn protocol's measures over n problems x k episodes."""

    model: str
    n: int
    k: int
    temperature: float  # 0: greedy
    accuracy: float
    tool_use: float  # episodes whose turn 1 calls the tool
    well_formed: float  # of the calls
    accuracy_with_tool: float
    accuracy_without_tool: float
    groups_with_reward_spread: float = 0.0  # problems whose k episodes got different rewards (k > 1)
    groups_with_tool_spread: float = 0.0  # problems where some of the k episodes call and some do not
    pass_at_k: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def line(self) -> str:
        how = "greedy" if self.temperature == 0 else f"T={self.temperature:g}, k={self.k}"
        text = (f"{how} on {self.n} held-out: accuracy {self.accuracy:.1%}, tool use {self.tool_use:.1%} "
                f"(well-formed {self.well_formed:.1%}), accuracy with / without the tool "
                f"{self.accuracy_with_tool:.1%} / {self.accuracy_without_tool:.1%}")
        if self.k > 1:
            text += (f"; pass@{self.k} {self.pass_at_k:.1%}, groups with reward spread "
                     f"{self.groups_with_reward_spread:.1%}, with tool spread {self.groups_with_tool_spread:.1%}")
        return text


def measures(label: str, episodes: Sequence[Sequence[ToolEpisode]], temperature: float) -> ToolMeasures:
    """The measures of n problems' k episodes each."""
    flat = [e for group in episodes for e in group]
    called = [e for e in flat if e.called]
    plain = [e for e in flat if not e.called]

    def share(part: Sequence[object], of: int) -> float:
        return len(part) / of if of else 0.0

    return ToolMeasures(
        model=label, n=len(episodes), k=len(episodes[0]) if episodes else 0, temperature=temperature,
        accuracy=share([e for e in flat if e.correct], len(flat)), tool_use=share(called, len(flat)),
        well_formed=share([e for e in called if e.well_formed], len(called)),
        accuracy_with_tool=share([e for e in called if e.correct], len(called)),
        accuracy_without_tool=share([e for e in plain if e.correct], len(plain)),
        groups_with_reward_spread=share([g for g in episodes if len({e.correct for e in g}) > 1], len(episodes)),
        groups_with_tool_spread=share([g for g in episodes if len({e.called for e in g}) > 1], len(episodes)),
        pass_at_k=share([g for g in episodes if any(e.correct for e in g)], len(episodes)))


def _generate(model, tokenizer, rows: list[list[int]], temperature: float, max_new_tokens: int,  # noqa: ANN001
              batch_size: int) -> list[list[int]]:
    """Each row's continuation ids, cut after its first end of turn (kept) or at the token limit."""
    import torch

    stops = {tokenizer.convert_tokens_to_ids(IM_END), tokenizer.pad_token_id}
    out: list[list[int]] = []
    with torch.inference_mode():
        for start in range(0, len(rows), batch_size):
            chunk = rows[start:start + batch_size]
            width = max(map(len, chunk))
            ids = torch.full((len(chunk), width), tokenizer.pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for i, row in enumerate(chunk):  # left padding
                ids[i, width - len(row):] = torch.tensor(row)
                mask[i, width - len(row):] = 1
            sampling = {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0} if temperature \
                else {"do_sample": False}
            new = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                 pad_token_id=tokenizer.pad_token_id, **sampling)[:, width:].tolist()
            for row in new:
                end = next((i for i, t in enumerate(row) if t in stops), None)
                out.append(row if end is None else row[:end + 1])
    return out


def run_episodes(model, tokenizer, prompts: Sequence[str], truths: Sequence[str], temperature: float = 0.0,  # noqa: ANN001
                 max_new_tokens: int = 64, batch_size: int = 128) -> list[ToolEpisode]:
    """One two-turn episode per prompt (greedy at temperature 0, else sampled)."""
    from rlvr.rewards.scoring import score

    end_id = tokenizer.convert_tokens_to_ids(IM_END)
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    first = _generate(model, tokenizer, prompt_ids, temperature, max_new_tokens, batch_size)
    texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in first]
    calls = [parse_call(t) for t in texts]
    again: dict[int, list[int]] = {}
    for i, (ids, call) in enumerate(zip(first, calls, strict=True)):
        if isinstance(call, str) and ids and ids[-1] == end_id:
            try:
                result = calculate(call)
            except CalculatorError:
                calls[i] = CalculatorError("the calculator refused it")
                continue
            obs = tokenizer(observation_text(result), add_special_tokens=False)["input_ids"]
            again[i] = prompt_ids[i] + ids + obs
    order = sorted(again)
    second = dict(zip(order, _generate(model, tokenizer, [again[i] for i in order], temperature, max_new_tokens,
                                       batch_size), strict=True))
    episodes = []
    for i, (text, call, truth) in enumerate(zip(texts, calls, truths, strict=True)):
        answer = tokenizer.decode(second[i], skip_special_tokens=True) if i in second else text
        correct = (i in second or call is None) and score("math_pairs", answer, truth).accuracy >= 1.0
        episodes.append(ToolEpisode(text, call is not None, i in second, answer, correct))
    return episodes


def evaluate_tools(model, tokenizer, label: str = "model", n: int = 500, k: int = 1, temperature: float = 0.0,  # noqa: ANN001
                   seed: int = 0, batch_size: int = 128) -> ToolMeasures:
    """The two-turn protocol on n held-out Math Pairs problems: greedy (temperature 0, k 1) or k
    sampled episodes per problem (torch's generator seeded once: repeatable on one machine)."""
    import torch

    from rlvr.tasks import math_pairs
    from rlvr.tasks.render import render_prompt

    problems = math_pairs.heldout_problems(n, seed)
    torch.manual_seed(seed)
    prompts = [render_prompt(tokenizer, p) for p in problems for _ in range(k)]
    truths = [p.ground_truth for p in problems for _ in range(k)]
    flat = run_episodes(model, tokenizer, prompts, truths, temperature, batch_size=batch_size)
    return measures(label, [flat[i:i + k] for i in range(0, len(flat), k)], temperature)


def evaluate_saved(model_path: str, n: int = 500, k: int = 8, temperature: float = 0.3,
                   seed: int = 0) -> tuple[ToolMeasures, ToolMeasures]:
    """Greedy and sampled measures of a saved model (transformers, one thread)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvr.tiny.generate import torch_threads

    with torch_threads():
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype="float32").eval()
        greedy = evaluate_tools(model, tokenizer, model_path, n, 1, 0.0, seed)
        sampled = evaluate_tools(model, tokenizer, model_path, n, k, temperature, seed)
    return greedy, sampled
