"""``calculator``: one tool, ``calculate``, that evaluates + - * / and parentheses on integers and
decimals, for Math Pairs (or any number-answer reward). The episode ends at the first answer that
calls no tool (the default step); the job's reward scores that answer.

The expression is parsed with ``ast`` and only numbers, the four operators, unary signs and
parentheses are evaluated (exactly, as fractions): no names, calls, attributes, powers or anything
else, at most ``MAX_CHARS`` characters, every value within ``MAX_MAGNITUDE``.
"""

from __future__ import annotations

import ast
import math
from decimal import Decimal
from fractions import Fraction

from rlvr.environments.base import Environment, environment, tool
from rlvr.tasks.base import NUMBER_INSTRUCTION

MAX_CHARS = 200
MAX_MAGNITUDE = 10**30
DECIMALS = 10  # places a non-integer result is rounded to

_BINARY = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}


def _value(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise ValueError(f"a value is larger than {MAX_MAGNITUDE:.0e}")
        value = Fraction(node.value) if isinstance(node.value, int) else Fraction(Decimal(repr(node.value)))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        inner = _value(node.operand)
        value = inner if isinstance(node.op, ast.UAdd) else -inner
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        value = _BINARY[type(node.op)](_value(node.left), _value(node.right))
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        left, right = _value(node.left), _value(node.right)
        if right == 0:
            raise ValueError("division by zero")
        value = left / right
    else:
        what = type(node.op).__name__ if isinstance(node, ast.BinOp | ast.UnaryOp) else type(node).__name__
        raise ValueError(f"only numbers, + - * / and parentheses are allowed (found {what})")
    if abs(value) > MAX_MAGNITUDE:
        raise ValueError(f"a value is larger than {MAX_MAGNITUDE:.0e}")
    return value


def evaluate(expression: str) -> str:
    """The value of an arithmetic expression, as text: an integer exactly, else rounded to
    ``DECIMALS`` places (ValueError saying what is not allowed).

    >>> evaluate("(3 + 4) * (5 + 6)"), evaluate("7 / 2"), evaluate("1 / 3")
    ('77', '3.5', '0.3333333333')
    """
    if len(expression) > MAX_CHARS:
        raise ValueError(f"the expression has {len(expression)} characters; at most {MAX_CHARS}")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError) as exc:  # ValueError: a null byte
        raise ValueError(f"not an arithmetic expression: {getattr(exc, 'msg', exc)}") from None
    value = _value(tree.body)
    if value.denominator == 1:
        return str(value.numerator)
    rounded = round(Decimal(value.numerator) / Decimal(value.denominator), DECIMALS)
    return format(rounded.normalize(), "f")


@environment(
    "calculator",
    display_name="Calculator",
    version="1",
    instruction="You may call the calculate tool to do arithmetic. " + NUMBER_INSTRUCTION,
    default_benchmark="rlvr-math-pairs-heldout",
    max_turns=4,
    tool_timeout_seconds=2.0,
)
class Calculator(Environment):
    """A calculator tool (+ - * / and parentheses on integers and decimals) for arithmetic tasks such as
    Math Pairs; the episode ends at the first answer that calls no tool."""

    @tool
    def calculate(self, expression: str) -> str:
        """Evaluates an arithmetic expression exactly and returns its value.

        Args:
            expression: numbers with + - * / and parentheses, e.g. "(3 + 4) * (5 + 6)"
        """
        return evaluate(expression)


ENVIRONMENT = Calculator
