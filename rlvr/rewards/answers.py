"""Finding and comparing final answers: the part of scoring that peer scorers most often get wrong.

Everything here is linear in the input: no regular expression with nested quantifiers, brace
matching by a counter, and normalisation applied only to a candidate answer capped at
``MAX_ANSWER_CHARS``. That is what lets the reward service promise a time limit per completion.

Numbers compare as exact fractions (``18`` == ``18.0`` == ``\\frac{36}{2}``) and fall back to a
relative tolerance only where a square root makes them irrational.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

MAX_ANSWER_CHARS = 1_000  # a longer "answer" is not one; normalising it would only cost time
_MAX_PARSE_DEPTH = 8
_MAX_BOX_ATTEMPTS = 4  # unbalanced boxes tried before giving up (bounds the work on junk input)

Number = Fraction | float

# A number as written in prose: optional sign (not after a word, digit or closing bracket, where a
# minus is subtraction), thousands groups or plain digits, decimals, and an optional "/ denominator".
_NUMBER = re.compile(
    r"(?:(?<![\w)\]}])[-+])?"
    r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+|(?<![\d.])(?=\.\d))"
    r"(?:\.\d+)?"
    r"(?:[ \t]*/[ \t]*\d+(?!\.\d))?"
)
_SIMPLE_FRAC = re.compile(r"\\[dtc]?frac\{([-+]?[\d.]+)\}\{([-+]?[\d.]+)\}")
_SHORT_FRAC = re.compile(r"\\[dtc]?frac(\d)(\d)")
_THIN_SPACE_IN_NUMBER = re.compile(r"(?<=\d)(?:\\,|\\!|\{,\}|\\ )(?=\d)")
_THOUSANDS = re.compile(r"^[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_TRAILING_UNITS = re.compile(r"^(.*?\d)\s*[A-Za-z][A-Za-z .]*$")
_TEXT_WRAPPERS = ("\\text", "\\textnormal", "\\textrm", "\\textbf", "\\textit", "\\mathrm", "\\mathbf", "\\mbox",
                  "\\operatorname")
# An equation's left side that names the value on its right ("x = 5", "x_1 = 5", "\\theta = 30"): the
# value is what follows the "=". Any other left side with a letter makes the answer an equation.
_ASSIGNED_NAME = re.compile(r"^\\?[a-z]{1,12}(?:_\{?[a-z0-9]{1,4}\}?)?$")
_LETTER = re.compile(r"[a-z]")
# "The final answer is $10,455$", "Final Answer: the final answer is 7": a stated final answer, as
# Math-Verify's "final answer ... is" pattern reads it (at most 100 characters between, one line).
_FINAL_ANSWER = re.compile(r"final answer\b[^\n]{0,100}?\bis\b:?[ \t]*(?:\$|\\\(|\\\[)?[ \t]*", re.IGNORECASE)
_GSM8K_MARKER = re.compile(r"^\s*####\s*:?\s*")
_DROPPED = (
    "\\left",
    "\\right",
    "\\displaystyle",
    "\\!",
    "\\,",
    "\\;",
    "\\:",
    "\\quad",
    "\\qquad",
    "^\\circ",
    "^{\\circ}",
    "\\circ",
    "°",
    "\\%",
    "%",
    "\\$",
    "$",
    "\\(",
    "\\)",
    "\\[",
    "\\]",
)


def match_brace(text: str, open_index: int, limit: int | None = None) -> int:
    """Index of the ``}`` closing the ``{`` at ``open_index``, or -1 when unbalanced (or further
    than ``limit`` characters away).

    >>> match_brace("{a{b}c}d", 0)
    6
    """
    depth = 0
    stop = len(text) if limit is None else min(len(text), open_index + limit)
    for i in range(open_index, stop):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
    return -1


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed 5``), nested braces kept.

    >>> last_boxed(r"so \\boxed{1} no, \\boxed{\\frac{1}{2}}.")
    '\\\\frac{1}{2}'
    """
    found = last_boxed_at(text)
    return None if found is None else found[1]


def last_boxed_at(text: str) -> tuple[int, str] | None:
    """Where the last closed box starts in ``text``, and its content (see `last_boxed`)."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    for _attempt in range(_MAX_BOX_ATTEMPTS):
        if start < 0:
            break
        after_command = start + (6 if text.startswith("\\boxed", start) else 5)
        i = after_command
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            end = match_brace(text, i, limit=MAX_ANSWER_CHARS + 2)
            if end > 0:
                return start, text[i + 1 : end].strip()
        elif after_command < i < len(text):  # "\boxed 5": the argument is the next word
            return start, text[i:].split(maxsplit=1)[0].rstrip("$.")
        # unbalanced (e.g. cut off by the token limit) or no argument: try an earlier box
        start = max(text.rfind("\\boxed", 0, start), text.rfind("\\fbox", 0, start))
    return None


def stated_final_answer(text: str) -> tuple[int, str] | None:
    """The number the last "final answer is ..." statement in ``text`` states (``$N$`` too), and
    where the statement's answer starts; None without one. Math-Verify ranks this statement with a
    ``\\boxed{}`` answer and takes whichever comes last; lm-eval's GSM8K takes the last number.

    The statement may give the working that leads to the number: "is 6 + 12 + 24 = 48" states 48,
    the result after the last ``=``; "is 6 + 12 + 24" states their sum, 42 (`_stated_result`).

    >>> stated_final_answer(r"so \\boxed{255}. Final Answer: The final answer is $10,455$. I hope it is correct.")
    (51, '10,455')
    >>> stated_final_answer("So the final answer is 6 + 12 + 24 = 48.")
    (23, '48')
    """
    found = None
    for found in _FINAL_ANSWER.finditer(text):  # noqa: B007  # only the last one matters
        pass
    if found is None:
        return None
    stated = _stated_result(_prepare_numbers(text[found.end() : found.end() + MAX_ANSWER_CHARS]))
    return (found.end(), stated) if stated else None


# The arithmetic a stated answer may be written with, at the start of what follows "is": numbers,
# operators, brackets and "=" (a currency sign before a number is skipped).
_OPERATORS = {"+": "+", "-": "-", "\u2212": "-", "*": "*", "\u00d7": "*", "\u00b7": "*", "\\times": "*",
              "\\cdot": "*", "/": "/", "\u00f7": "/", "\\div": "/"}
_EXPRESSION_TOKEN = re.compile(r"[ \t]*(\\times|\\cdot|\\div|[-+*/=()\u2212\u00d7\u00b7\u00f7])")
_CURRENCY = re.compile(r"[ \t]*(?:\\\$|\$)?[ \t]*")
Token = tuple[str, str]  # ("number", as written) or (an operator "+-*/", a bracket "()" or "=", "")


def _stated_result(text: str) -> str | None:
    """What the arithmetic at the start of ``text`` comes to, as written when it is one number:
    "48." -> '48'; "6+12+24 = 48." -> '48' (after the last "="); "2*3=6" -> '6'; "6 + 12 + 24" ->
    '42' (computed exactly); "$1,200 and more" -> '1,200'. None when no number starts it."""
    tokens: list[Token] = []
    complete = 0  # tokens[:complete] is a whole expression (it ends after a number or a bracket)
    depth, at, want_number = 0, 0, True
    while at < len(text) and len(tokens) < 200:
        if want_number:
            at = _CURRENCY.match(text, at).end()  # type: ignore[union-attr]  # matches the empty string
            number = _NUMBER.match(text, at)
            if number and number.group(0).strip():
                tokens.append(("number", number.group(0).strip()))
                at, want_number = number.end(), False
                complete = len(tokens) if depth == 0 else complete
                continue
        symbol = _EXPRESSION_TOKEN.match(text, at)
        if symbol is None:
            break
        op = _OPERATORS.get(symbol.group(1), symbol.group(1))
        if want_number and op == "(" and depth < _MAX_PARSE_DEPTH:
            depth += 1
        elif not want_number and op == ")" and depth > 0:
            depth -= 1
            complete = len(tokens) + 1 if depth == 0 else complete
        elif not want_number and (op in ("+", "-", "*", "/") or (op == "=" and depth == 0)):
            want_number = True
        else:
            break
        tokens.append((op, ""))
        at = symbol.end()
    tokens = tokens[:complete]
    if not tokens:
        return None
    result = tokens[max((i + 1 for i, t in enumerate(tokens) if t[0] == "="), default=0):]
    if len(result) == 1:
        return result[0][1]
    value = _evaluate(result)
    if value is None:
        return None
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _evaluate(tokens: list[Token]) -> Fraction | None:
    """The exact value of + - * / over numbers and brackets (tokens from `_stated_result`, whose
    brackets are balanced); None on a division by zero or a number that is not a plain one."""
    position = 0

    def term() -> Fraction | None:  # factor (* or / factor)...
        nonlocal position
        value = factor()
        while value is not None and position < len(tokens) and tokens[position][0] in "*/":
            op = tokens[position][0]
            position += 1
            right = factor()
            if right is None or (op == "/" and right == 0):
                return None
            value = value * right if op == "*" else value / right
        return value

    def expression() -> Fraction | None:  # term (+ or - term)...
        nonlocal position
        value = term()
        while value is not None and position < len(tokens) and tokens[position][0] in "+-":
            op = tokens[position][0]
            position += 1
            right = term()
            value = None if right is None else value + right if op == "+" else value - right
        return value

    def factor() -> Fraction | None:  # a number or a bracketed expression
        nonlocal position
        kind, written = tokens[position]
        position += 1
        if kind == "(":
            value = expression()
            position += 1  # its ")"
            return value
        number = numeric_value(written)
        return number if isinstance(number, Fraction) else None

    return expression()


def _prepare_numbers(text: str) -> str:
    text = text.replace("\u2212", "-").replace("\u2013", "-")  # unicode minus and en dash
    text = _THIN_SPACE_IN_NUMBER.sub("", text)  # 8\,000 and 8{,}000 mean 8000
    text = _SIMPLE_FRAC.sub(r"\1/\2", text)
    return _SHORT_FRAC.sub(r"\1/\2", text)


def last_number(text: str) -> str | None:
    """The last number written in ``text`` (the final answer wins), as written.

    >>> last_number("3+4=7, 7*11 = 77 apples")
    '77'
    >>> last_number("it costs $8,000.50.")
    '8,000.50'
    """
    found = None
    for found in _NUMBER.finditer(_prepare_numbers(text)):  # noqa: B007  # only the last one matters
        pass
    return found.group(0).strip() if found else None


def final_answer(text: str) -> str | None:
    """The final answer of a worked solution, as written: the later of the last closed box and the
    last "final answer is N" statement (Math-Verify ranks the two alike and takes the last), else
    the last number (a box outranks the numbers after it, as in Math-Verify).

    >>> final_answer(r"so \\boxed{255}. The final answer is $10,455$."), final_answer(r"\\boxed{12}. Check: 3 more")
    ('10,455', '12')
    """
    box, stated = last_boxed_at(text), stated_final_answer(text)
    if stated is not None and (box is None or stated[0] > box[0]):
        return stated[1]
    return box[1] if box is not None else last_number(text)


def _unwrap(text: str, command: str) -> str:
    """Replace every ``\\command{X}`` by ``X`` (a bounded loop: each pass removes one wrapper)."""
    start = text.find(command + "{")
    while start >= 0:
        open_index = start + len(command)
        end = match_brace(text, open_index)
        if end < 0:
            break
        text = text[:start] + text[open_index + 1 : end] + text[end + 1 :]
        start = text.find(command + "{", start)
    return text


def normalize(answer: str) -> str:
    """A canonical string for comparing non-numeric answers (LaTeX decoration removed).

    >>> normalize(r"$\\left( 1, \\dfrac{1}{2} \\right)$.")
    '(1,\\\\frac{1}{2})'
    """
    text = answer[:MAX_ANSWER_CHARS].strip()
    for command in _TEXT_WRAPPERS:
        text = _unwrap(text, command)
    for token in _DROPPED:
        text = text.replace(token, "")
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\cfrac", "\\frac")
    text = text.replace("\u2212", "-")
    text = "".join(text.split())
    return text.rstrip(".").lower()


def _parse(text: str, depth: int = 0) -> Number | None:
    """Value of a small numeric expression: n, -n, a/b, \\frac{a}{b}, \\sqrt{n}, k\\sqrt{n}, (x)."""
    if depth > _MAX_PARSE_DEPTH or not text:
        return None
    if text[0] in "+-":
        inner = _parse(text[1:], depth + 1)
        return None if inner is None else (-inner if text[0] == "-" else inner)
    if text[0] == "(" and text[-1] == ")":
        return _parse(text[1:-1], depth + 1)
    if _THOUSANDS.match(text):
        text = text.replace(",", "")
    if text.replace(".", "", 1).isdigit():
        return Fraction(text)
    if text.startswith("\\frac{"):
        mid = match_brace(text, 5)
        if (
            mid > 0
            and mid + 1 < len(text)
            and text[mid + 1] == "{"
            and match_brace(text, mid + 1) == len(text) - 1
        ):
            num, den = _parse(text[6:mid], depth + 1), _parse(text[mid + 2 : -1], depth + 1)
            return _divide(num, den)
        return None
    sqrt = text.find("\\sqrt")
    if sqrt >= 0:
        coefficient = _parse(text[:sqrt], depth + 1) if sqrt > 0 else Fraction(1)
        radicand_text = text[sqrt + 5 :]
        if radicand_text.startswith("{") and match_brace(radicand_text, 0) == len(radicand_text) - 1:
            radicand_text = radicand_text[1:-1]
        radicand = _parse(radicand_text, depth + 1)
        if coefficient is None or radicand is None or radicand < 0:
            return None
        return float(coefficient) * math.sqrt(radicand)
    if text.count("/") == 1:
        num_text, den_text = text.split("/")
        return _divide(_parse(num_text, depth + 1), _parse(den_text, depth + 1))
    return None


def _divide(num: Number | None, den: Number | None) -> Number | None:
    if num is None or den is None or den == 0:
        return None
    return num / den if isinstance(num, Fraction) and isinstance(den, Fraction) else float(num) / float(den)


def numeric_value(answer: str) -> Number | None:
    """The number an answer denotes, or None when it is not a number.

    Tolerates what surrounds numbers in real answers: ``$``, ``\\%``, degrees, ``\\text{units}``,
    trailing unit words, thousands separators and a leading ``x =``.

    >>> numeric_value(r"\\$8,000") == 8000, numeric_value(r"x = \\tfrac{3}{6}") == Fraction(1, 2)
    (True, True)
    """
    text = normalize(_prepare_numbers(answer[:MAX_ANSWER_CHARS]))
    if "=" in text:
        # "x=5", "7*11=77": the value is what follows the last "=". An equation with unknowns on
        # its left ("x+y-z+2=0") is not a number: it matches only as an equation (answers_match).
        *left, text = text.split("=")
        if any(_LETTER.search(side) and not _ASSIGNED_NAME.match(side) for side in left):
            return None
    units = _TRAILING_UNITS.match(text)
    if units and "\\" not in text:
        text = units.group(1)
    return _parse(text)


def answers_match(candidate: str | None, ground_truth: str) -> bool:
    """Whether an extracted answer equals the ground truth: numerically when both are numbers.

    >>> answers_match("18.0", "18"), answers_match(r"\\frac{1}{2}", "0.5"), answers_match("17", "18")
    (True, True, False)
    """
    if candidate is None or not candidate.strip():
        return False
    ground_truth = _GSM8K_MARKER.sub("", ground_truth, count=1)  # "#### 55", "####: 55": GSM8K's marker
    expected, got = numeric_value(ground_truth), numeric_value(candidate)
    if expected is not None and got is not None:
        if isinstance(expected, Fraction) and isinstance(got, Fraction):
            return expected == got
        return math.isclose(float(expected), float(got), rel_tol=1e-6, abs_tol=1e-9)
    if expected is not None or got is not None:
        return False  # a number against a non-number never matches
    want, have = normalize(candidate), normalize(ground_truth)
    if want.count("=") == 1 and have.count("=") == 1:  # an equation: the same two sides, either way round
        return sorted(want.split("=")) == sorted(have.split("="))
    return want == have
