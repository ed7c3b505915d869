"""Code (synthetic): write a small Python function; the reward runs it against the problem's tests.

Twelve families of simple function-writing tasks (add a constant, an affine map, repeat a string,
count some letters, sum the numbers above a bound, fizzbuzz with other divisors and words, clamp,
rotate a string, count multiples, digit sums, a Caesar shift, filter words by length), each with a
small finite space of parameters: a problem is a *key* ``(family, parameters)``. Its prompt names
the function and asks for a ```python block; its ``ground_truth`` is a reference solution; its
``columns["tests"]`` are assert strings (``assert clamp(20) == 12``) whose inputs are drawn from
the key alone and whose expected values the generator computes, so a problem is the same whatever
seed or split draws it.

Held-out by construction (as Math Pairs): a fixed hash of the key puts one fifth of the keys of
every family in the held-out class; the training generator rejects them for every seed and the
``test`` split draws only from them, so no training prompt shares a function specification with a
benchmark prompt.
"""

from __future__ import annotations

import atexit
import hashlib
import itertools
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from rlvr.rewards.registry import RewardDefinition, RewardOutput, Sample
from rlvr.tasks.base import DEFAULT_SYNTHETIC_PROMPTS, Problem, RewardFunction, Split, TaskError, check_count

HELDOUT_MODULUS = 5  # 1 in 5 keys of each family is held out
DEFAULT_HELDOUT_N = 150  # of the 193 held-out problems
TESTS_PER_PROBLEM = 5


def _hash_int(text: str) -> int:
    # sha256, not hash(): stable across processes, Python versions and PYTHONHASHSEED
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


class _Draw:
    """Counter-based draws from a text key (no library RNG whose algorithm could change)."""

    def __init__(self, key: str) -> None:
        self.key, self.count = key, 0

    def integer(self, low: int, high: int) -> int:
        self.count += 1
        return low + _hash_int(f"{self.key}:{self.count}") % (high - low + 1)

    def choice(self, items: Sequence[Any]) -> Any:
        return items[self.integer(0, len(items) - 1)]

    def ints(self, n: int, low: int, high: int) -> list[int]:
        return [self.integer(low, high) for _ in range(n)]

    def word(self, letters: str = "abcdefghijklmnopqrstuvwxyz", low: int = 0, high: int = 8) -> str:
        return "".join(self.choice(letters) for _ in range(self.integer(low, high)))


@dataclass(frozen=True)
class Family:
    """One kind of problem: ``params`` every parameter tuple; ``statement``, ``solution`` and
    ``reference`` of a tuple; ``inputs`` draws one call's arguments."""

    name: str
    function: str
    signature: str
    params: tuple[tuple[Any, ...], ...]
    statement: Callable[..., str]
    solution: Callable[..., str]
    reference: Callable[..., Callable[..., Any]]
    inputs: Callable[[_Draw], tuple[Any, ...]]
    edge_cases: tuple[tuple[Any, ...], ...] = ()


def _fizz(a: int, b: int, w1: str, w2: str) -> Callable[[int], str]:
    return lambda n: w1 + w2 if n % a == 0 and n % b == 0 else w1 if n % a == 0 else w2 if n % b == 0 else str(n)


def _caesar(k: int) -> Callable[[str], str]:
    return lambda s: "".join(chr((ord(c) - 97 + k) % 26 + 97) if "a" <= c <= "z" else c for c in s)


def _rotate(shift: int) -> Callable[[str], str]:
    return lambda s: s[shift % len(s):] + s[:shift % len(s)] if s else s


_OPS = {"greater than": ">", "at least": ">=", "less than": "<"}
_CMP: dict[str, Callable[[int, int], bool]] = {">": lambda x, k: x > k, ">=": lambda x, k: x >= k,
                                               "<": lambda x, k: x < k}
_LETTER_SETS = tuple("".join(c) for r in (2, 3, 4) for c in itertools.combinations("aeiouy", r))
_WORD_PAIRS = (("Fizz", "Buzz"), ("Foo", "Bar"), ("Ping", "Pong"))
_WORDS = ("a", "an", "tree", "river", "code", "python", "sky", "mountain", "blue", "at", "sandbox",
          "ok", "lambda", "graph", "quiet", "x")


def _ind(body: str) -> str:
    return "\n".join("    " + line for line in body.splitlines())


FAMILIES: tuple[Family, ...] = (
    Family("add_constant", "add_constant", "x", tuple((k,) for k in range(2, 61)),
           lambda k: f"returns x plus {k}",
           lambda k: f"return x + {k}",
           lambda k: (lambda x: x + k),
           lambda d: (d.integer(-100, 100),), ((0,),)),
    Family("affine", "affine", "x", tuple(itertools.product(range(2, 10), range(-9, 16))),
           lambda a, b: f"returns {a} times x plus {b}" if b >= 0 else f"returns {a} times x minus {-b}",
           lambda a, b: f"return {a} * x + {b}" if b >= 0 else f"return {a} * x - {-b}",
           lambda a, b: (lambda x: a * x + b),
           lambda d: (d.integer(-50, 50),), ((0,),)),
    Family("repeat_string", "repeat_string", "s", tuple(itertools.product(range(2, 7), ("", "-", " ", ",", "+"))),
           lambda k, sep: f"returns s repeated {k} times" + (f", the copies separated by {sep!r}" if sep else ""),
           lambda k, sep: f"return {sep!r}.join([s] * {k})",
           lambda k, sep: (lambda s: sep.join([s] * k)),
           lambda d: (d.word(high=5),), (("",),)),
    Family("count_letters", "count_letters", "s", tuple(itertools.product(_LETTER_SETS, (False, True))),
           lambda chars, ci: f"returns how many characters of s are one of the letters {chars!r}"
           + (", upper or lower case" if ci else " (lower case only: 'A' does not count as 'a')"),
           lambda chars, ci: f"return sum(1 for c in {'s.lower()' if ci else 's'} if c in {chars!r})",
           lambda chars, ci: (lambda s: sum(1 for c in (s.lower() if ci else s) if c in chars)),
           lambda d: (d.word("abcdeiouyAEIOUYxz ", 0, 12),), (("",),)),
    Family("sum_where", "sum_where", "xs", tuple(itertools.product(_OPS, range(-10, 31))),
           lambda op, k: f"returns the sum of the numbers in the list xs that are {op} {k} (0 if there are none)",
           lambda op, k: f"return sum(x for x in xs if x {_OPS[op]} {k})",
           lambda op, k: (lambda xs: sum(x for x in xs if _CMP[_OPS[op]](x, k))),
           lambda d: (d.ints(d.integer(0, 8), -20, 40),), (([],),)),
    Family("fizz", "fizz", "n", tuple((a, b, w1, w2) for a, b in itertools.combinations(range(2, 10), 2)
                                      for w1, w2 in _WORD_PAIRS),
           lambda a, b, w1, w2: f"returns {w1 + w2!r} if n is divisible by both {a} and {b}, {w1!r} if only "
           f"by {a}, {w2!r} if only by {b}, and otherwise n as a string (e.g. '7')",
           lambda a, b, w1, w2: _ind(f"if n % {a} == 0 and n % {b} == 0:\n    return {w1 + w2!r}\n"
                                     f"if n % {a} == 0:\n    return {w1!r}\nif n % {b} == 0:\n    return {w2!r}\n"
                                     "return str(n)").strip(),
           _fizz,
           lambda d: (d.integer(1, 200),)),
    Family("clamp", "clamp", "x", tuple(itertools.product(range(-20, 1), range(1, 21))),
           lambda lo, hi: f"returns x limited to the range {lo} to {hi}: {lo} if x is below {lo}, "
           f"{hi} if x is above {hi}, x itself otherwise",
           lambda lo, hi: f"return max({lo}, min({hi}, x))",
           lambda lo, hi: (lambda x: max(lo, min(hi, x))),
           lambda d: (d.integer(-40, 40),), ((-100,), (100,))),
    Family("rotate", "rotate", "s", tuple(itertools.product(("left", "right"), range(1, 10))),
           lambda way, k: f"returns the string s rotated {way} by {k} characters, wrapping around "
           f"(by {k} modulo len(s) when s is shorter; the empty string stays empty)",
           lambda way, k: _ind("if not s:\n    return s\n"
                               f"k = {k if way == 'left' else -k} % len(s)\nreturn s[k:] + s[:k]").strip(),
           lambda way, k: _rotate(k if way == "left" else -k),
           lambda d: (d.word(high=12),), (("",),)),
    Family("count_multiples", "count_multiples", "xs", tuple(itertools.product((True, False), range(2, 13))),
           lambda yes, k: f"returns how many numbers in the list xs are {'' if yes else 'not '}divisible by {k}",
           lambda yes, k: f"return sum(1 for x in xs if x % {k} {'==' if yes else '!='} 0)",
           lambda yes, k: (lambda xs: sum(1 for x in xs if (x % k == 0) == yes)),
           lambda d: (d.ints(d.integer(0, 10), -30, 60),), (([],),)),
    Family("digit_sum", "digit_sum", "n", tuple((k,) for k in range(0, 21)),
           lambda k: f"returns the sum of the decimal digits of abs(n), plus {k}",
           lambda k: f"return sum(int(c) for c in str(abs(n))) + {k}",
           lambda k: (lambda n: sum(int(c) for c in str(abs(n))) + k),
           lambda d: (d.integer(-100000, 100000),), ((0,),)),
    Family("caesar", "caesar", "s", tuple((k,) for k in range(1, 26)),
           lambda k: f"returns s with every lower-case letter a-z moved {k} places forward in the alphabet "
           "(wrapping from z to a) and every other character unchanged",
           lambda k: f"return ''.join(chr((ord(c) - 97 + {k}) % 26 + 97) if 'a' <= c <= 'z' else c for c in s)",
           _caesar,
           lambda d: (d.word("abcxyz mnoqAZ!", 0, 12),), (("",),)),
    Family("filter_words", "filter_words", "words", tuple(itertools.product(("more than", "at most"), range(1, 9))),
           lambda how, k: f"returns, in their order, the words of the list words that have {how} {k} letters",
           lambda how, k: f"return [w for w in words if len(w) {'>' if how == 'more than' else '<='} {k}]",
           lambda how, k: (lambda words: [w for w in words if (len(w) > k) == (how == "more than")]),
           lambda d: ([d.choice(_WORDS) for _ in range(d.integer(0, 6))],), (([],),)),
)
FAMILY_BY_NAME = {f.name: f for f in FAMILIES}

Key = tuple[str, tuple[Any, ...]]


def key_text(key: Key) -> str:
    return f"{key[0]}{key[1]!r}"


def is_heldout(key: Key) -> bool:
    """Whether a problem belongs to the held-out class (a property of its key only)."""
    return _hash_int(f"rlvr.code.heldout:{key_text(key)}") % HELDOUT_MODULUS == 0


def _call(function: str, args: tuple[Any, ...]) -> str:
    return f"{function}({', '.join(repr(a) for a in args)})"


def make_problem(key: Key, problem_id: str) -> Problem:
    family = FAMILY_BY_NAME[key[0]]
    params = key[1]
    reference = family.reference(*params)
    draw = _Draw(f"rlvr.code.tests:{key_text(key)}")
    calls: list[tuple[Any, ...]] = list(family.edge_cases)
    for _ in range(100):  # distinct inputs, edge cases first
        if len(calls) >= TESTS_PER_PROBLEM:
            break
        args = family.inputs(draw)
        if args not in calls:
            calls.append(args)
    tests = [f"assert {_call(family.function, args)} == {reference(*args)!r}" for args in calls]
    example = calls[-1]
    statement = family.statement(*params)
    question = (f"Write a Python function `{family.function}({family.signature})` that {statement}.\n"
                f"For example, `{_call(family.function, example)}` returns `{reference(*example)!r}`.\n"
                f"Answer with a ```python code block that defines `{family.function}`.")
    solution = f"def {family.function}({family.signature}):\n    {family.solution(*params)}\n"
    return Problem(id=problem_id, task="code", question=question, ground_truth=solution,
                   compact=f"def {family.function}({family.signature}): {statement}",
                   columns={"tests": tests})


def _draw_key(seed: int, index: int) -> Key:
    """The ``index``-th training key of ``seed``: a family, then its parameters, outside the held-out class."""
    for attempt in itertools.count():
        salt = f"rlvr.code.train:{seed}:{index}:{attempt}"
        family = FAMILIES[_hash_int(salt + ":family") % len(FAMILIES)]
        key = (family.name, family.params[_hash_int(salt + ":params") % len(family.params)])
        if not is_heldout(key):
            return key
    raise AssertionError("unreachable")


@lru_cache(maxsize=1)
def heldout_keys() -> dict[str, tuple[Key, ...]]:
    """Every held-out key, by family."""
    return {f.name: tuple(k for k in ((f.name, p) for p in f.params) if is_heldout(k)) for f in FAMILIES}


def training_problems(n: int = DEFAULT_SYNTHETIC_PROMPTS, seed: int = 0) -> list[Problem]:
    """``n`` training problems (8-100,000, repeats possible), never from the held-out class."""
    check_count(n, "synthetic_prompts")
    return [make_problem(_draw_key(seed, i), f"code/train/{seed}/{i}") for i in range(n)]


def heldout_problems(n: int = DEFAULT_HELDOUT_N, seed: int = 0) -> list[Problem]:
    """``n`` distinct held-out problems, the families taking turns; the seed picks which."""
    by_family = heldout_keys()
    check_count(n, "held-out problems", low=1, high=sum(len(keys) for keys in by_family.values()))
    ranked = [sorted(keys, key=lambda k: _hash_int(f"rlvr.code.pick:{seed}:{key_text(k)}"))
              for keys in by_family.values()]
    order = [k for round_ in itertools.zip_longest(*ranked) for k in round_ if k is not None]
    return [make_problem(k, f"code/test/{key_text(k)}") for k in order[:n]]


class CodeTask:
    """Training prompts generated from a seed; the held-out problems as the ``test`` split."""

    name = "code"
    reward_function: RewardFunction = "code"

    def splits(self) -> tuple[Split, ...]:
        return ("train", "test")

    def prompts(self, n: int | None = None, seed: int = 0, split: Split = "train",
                shuffle: bool | None = None) -> list[Problem]:
        """Generated training problems, or the held-out ones (each already in a seeded order)."""
        if split == "test":
            return heldout_problems(DEFAULT_HELDOUT_N if n is None else n, seed)
        if split != "train":
            raise TaskError(f"Code has no {split!r} split; its splits: train, test")
        return training_problems(DEFAULT_SYNTHETIC_PROMPTS if n is None else n, seed)


# ---------------------------------------------------------------- the code reward

INSTRUCTION = ("Think step by step inside <think></think>, then give the code as one ```python block "
               "inside <answer></answer>.")
_sandbox_lock = threading.Lock()
_sandboxes: dict[int, Any] = {}  # process id -> its Sandbox (a forked process makes its own)


def _sandbox() -> Any:  # a rlvr.rewards.sandbox.Sandbox
    """This process's sandbox, started on first use and closed at exit."""
    from rlvr.rewards.sandbox import Sandbox

    with _sandbox_lock:
        box = _sandboxes.get(os.getpid())
        if box is None:
            box = _sandboxes[os.getpid()] = Sandbox()
            atexit.register(box.close)
        return box


def score_code(samples: Sequence[Sample]) -> list[RewardOutput]:
    """The code reward of a batch (run in parallel in the sandbox): the fraction of the row's tests
    the completion's last ```python block passes; strict = all of them. A limit hit or a blocked
    operation scores 0, its reason in the note; a row without usable tests is the reward's error."""
    from rlvr.rewards.code_tests import extract_code, parse_tests
    from rlvr.rewards.sandbox import TestRun

    box = _sandbox()
    tests = [parse_tests(s.columns.get("tests")) for s in samples]
    codes = [extract_code(s.completion) for s in samples]
    futures = [box.submit(code, t) if code is not None else None for code, t in zip(codes, tests, strict=True)]
    out = []
    for future, t, code in zip(futures, tests, codes, strict=True):
        run = future.result() if future is not None else TestRun(0, len(t), "no code block")
        note = run.reason or f"{run.passed} of {run.total} tests passed"
        out.append(RewardOutput(run.fraction, {"all_passed": float(run.all_passed)}, strict=run.all_passed,
                                extracted_answer=code, note=note))
    return out


REWARD = RewardDefinition(
    key="code",
    display_name="Code tests (sandboxed)",
    description="Runs the completion's last ```python block against the row's tests in a sandboxed process; "
                "rewards the fraction of tests passed (strict: all). Bundled synthetic function-writing tasks, "
                "or a dataset with a tests column.",
    needs_dataset=False,
    accepts_dataset=True,
    columns=("tests",),
    default_benchmark="code-heldout",
    benchmark_display_name="Code tasks held-out",
    instruction=INSTRUCTION,
    heldout_size=DEFAULT_HELDOUT_N,
    score_batch=score_code,
    problems=lambda dataset, data_roots: CodeTask(),
    timeout_seconds=10.0,  # the sandbox's own wall limit (5 s) and start-up, per completion
    order=3,
)
