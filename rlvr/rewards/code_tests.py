"""The code reward's text side: a completion's code block, a dataset row's tests, and how one test's
outcome is judged. Pure functions; :mod:`rlvr.rewards.sandbox` runs what they prepare.

A test is a string of Python run in the namespace of the completion's code (``assert f(1) == 2``,
or a whole ``def test_...():`` function). A test of the form ``assert <expression> == <literal>``
(either side the literal) is a *value test*: the sandbox reports the expression's ``repr`` and the
comparison with the literal happens here, outside the sandbox, so a program cannot pass it without
computing the value (an object whose ``__eq__`` is always true, or a forged report, does not). Any
other test passes when it runs without raising, inside the sandbox.

>>> extract_code("Here:\\n```python\\ndef f(x):\\n    return x + 1\\n```\\nDone.")
'def f(x):\\n    return x + 1'
>>> parse_tests("assert f(1) == 2\\nassert f(2) == 3")
['assert f(1) == 2', 'assert f(2) == 3']
>>> prepare_test("assert f(1) == [2, 3]")
PreparedTest(kind='v', source='(f(1))', expected=[2, 3])
"""

from __future__ import annotations

import ast
import json
import re
import textwrap
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

MAX_TESTS = 256
MAX_TEST_CHARS = 20_000
PYTHON_TAGS = frozenset({"", "python", "py", "python3", "py3"})
# An opening fence anywhere (a model may write "<answer>```python"), its info string, the body up to
# the next fence: the last such block tagged Python (or untagged) is the code.
_BLOCK = re.compile(r"```[ \t]*([^\s`]*)[^\n`]*\n(.*?)```", re.DOTALL)


def extract_code(completion: str) -> str | None:
    """The last fenced code block tagged ``python`` (``py``, ``python3``) or untagged; None if none.

    Blocks in other languages are skipped; an unclosed last block does not count; the block's
    common indentation is removed.

    >>> extract_code("```bash\\nls\\n```") is None
    True
    >>> extract_code("```\\nx = 1\\n```\\n```py\\nx = 2\\n```")
    'x = 2'
    """
    code = None
    for match in _BLOCK.finditer(completion):
        if match.group(1).lower() in PYTHON_TAGS:
            code = textwrap.dedent(match.group(2)).strip("\n")
    return code


# CPython 3.11 builds every AST with one interpreter-wide recursion counter (gh-106905): two threads
# parsing at once (a test prepared in the caller's thread while the sandbox's reader thread judges a
# reported value with literal_eval) can make either raise SystemError "AST constructor recursion depth
# mismatch", seen in `make test`. Every parse here takes this lock.
_AST_LOCK = threading.Lock()


def _parse(text: str) -> ast.Module:
    with _AST_LOCK:
        return ast.parse(text)


def _literal_text(text: str) -> Any:
    """ast.literal_eval of a string, its parse under the lock."""
    with _AST_LOCK:
        tree = ast.parse(text.lstrip(" \t"), mode="eval")  # as literal_eval parses a string
    return ast.literal_eval(tree)


def _check_source(source: str, where: str) -> None:
    if len(source) > MAX_TEST_CHARS:
        raise ValueError(f"{where}: {len(source)} characters, at most {MAX_TEST_CHARS}")
    try:
        _parse(source)
    except SyntaxError as exc:
        raise ValueError(f"{where}: not valid Python: {exc.msg} (line {exc.lineno}): {source[:80]!r}") from None


def _split_source(text: str) -> list[str]:
    """One string of tests: each top-level ``assert`` and ``def test_*`` is a test; the other
    top-level statements (imports, helpers, assignments) are a prelude each test starts with."""
    try:
        tree = _parse(text)
    except SyntaxError as exc:
        raise ValueError(f"tests: not valid Python: {exc.msg} (line {exc.lineno})") from None
    prelude: list[str] = []
    tests: list[str] = []
    for node in tree.body:
        source = ast.get_source_segment(text, node) or ""
        if isinstance(node, ast.FunctionDef) and node.decorator_list:
            start = node.decorator_list[0]
            source = "\n".join(text.splitlines()[start.lineno - 1 : node.end_lineno or node.lineno])
        if isinstance(node, ast.Assert):
            tests.append(source)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
            tests.append(f"{source}\n{node.name}()")
        else:
            prelude.append(source)
    if not tests:
        raise ValueError("tests: no assert statement or test_ function in the string; "
                         "give a list of test strings or assert lines (e.g. 'assert f(1) == 2')")
    head = "\n".join(prelude)
    return [f"{head}\n{test}" if head else test for test in tests]


def parse_tests(value: Any) -> list[str]:
    """A dataset row's ``tests`` column as a list of test strings.

    Accepted: a list (or tuple) of strings, one test each; a JSON string of such a list; one string
    of Python holding ``assert`` lines and/or ``test_`` functions (see :func:`_split_source`).
    ``ValueError`` otherwise, naming the column, the item and what is accepted.
    """
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):
        value = value.tolist()  # a NumPy/Arrow array from a dataset
    if isinstance(value, str):
        text = value.strip()
        if not text:
            raise ValueError("tests: empty string; give at least one test (e.g. 'assert f(1) == 2')")
        if text.startswith("["):
            try:
                loaded = json.loads(text)
            except ValueError:
                loaded = None
            if isinstance(loaded, list):
                return parse_tests(loaded)
        return parse_tests(_split_source(text))
    if not isinstance(value, list | tuple):
        raise ValueError(f"tests: expected a list of test strings or one string of assert lines / test "
                         f"functions, got {type(value).__name__}")
    if not value:
        raise ValueError("tests: empty list; give at least one test (e.g. 'assert f(1) == 2')")
    if len(value) > MAX_TESTS:
        raise ValueError(f"tests: {len(value)} tests, at most {MAX_TESTS}")
    tests = []
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise ValueError(f"tests[{i}]: expected a string of Python (e.g. 'assert f(1) == 2'), "
                             f"got {type(item).__name__}")
        source = item.strip()
        if not source:
            raise ValueError(f"tests[{i}]: empty string")
        _check_source(source, f"tests[{i}]")
        tests.append(source)
    return tests


@dataclass(frozen=True)
class PreparedTest:
    """A test as the sandbox runs it: ``kind`` ``v`` (report ``source``'s value, compared here with
    ``expected``) or ``a`` (run ``source``; passes when nothing is raised)."""

    kind: str
    source: str
    expected: Any = None


def _literal(node: ast.expr) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


@lru_cache(maxsize=8192)  # the tests of a prompt repeat for every completion of its group
def prepare_test(test: str) -> PreparedTest:
    """Classify one test string (see the module docstring)."""
    try:
        tree = _parse(test)
    except SyntaxError:
        return PreparedTest("a", test)  # reported as a failure (SyntaxError) by the run
    if len(tree.body) == 1 and isinstance(stmt := tree.body[0], ast.Assert):
        check = stmt.test
        if isinstance(check, ast.Compare) and len(check.ops) == 1 and isinstance(check.ops[0], ast.Eq):
            left, right = check.left, check.comparators[0]
            (left_ok, left_value), (right_ok, right_value) = _literal(left), _literal(right)
            if left_ok != right_ok:
                expression, expected = (right, left_value) if left_ok else (left, right_value)
                source = ast.get_source_segment(test, expression)
                if source is not None:
                    return PreparedTest("v", f"({source})", expected)
    return PreparedTest("a", test)


_FLOATS = {"inf": float("inf"), "-inf": float("-inf"), "nan": float("nan")}


def judge(test: PreparedTest, outcome: Any) -> tuple[bool, str]:
    """Whether a test passed given the sandbox's outcome for it, and a short detail."""
    if not isinstance(outcome, list) or not outcome:
        return False, "fail: malformed outcome"
    if outcome[0] == "x" and len(outcome) == 2:
        return False, f"fail: {str(outcome[1])[:80]}"
    if test.kind == "a":
        return (True, "pass") if outcome == ["ok"] else (False, "fail: malformed outcome")
    if outcome[0] != "v" or len(outcome) != 2 or not isinstance(outcome[1], str):
        return False, "fail: malformed outcome"
    text = outcome[1]
    if text in _FLOATS:
        value = _FLOATS[text]
    else:
        try:
            value = _literal_text(text)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return False, f"fail: got {text[:80]} (not a literal)"
    try:
        equal = bool(value == test.expected)
    except Exception:  # comparing literals cannot run code; stay safe anyway
        equal = False
    return (True, "pass") if equal else (False, f"fail: got {text[:80]}")
