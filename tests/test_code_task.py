"""The bundled Code task: every family's reference solution passes its own tests (train and
held-out, through the real sandbox), the splits never share a problem, draws are deterministic;
and the text side of the code reward (code blocks, the tests column)."""

from __future__ import annotations

import doctest
from collections.abc import Iterator

import pytest

from rlvr.rewards import code_tests
from rlvr.rewards.code_tests import extract_code, parse_tests, prepare_test
from rlvr.rewards.sandbox import Sandbox, score_completion
from rlvr.tasks import TaskError, prompt_messages
from rlvr.tasks import code as code_task
from rlvr.tasks.code import FAMILIES, CodeTask, heldout_problems, training_problems


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    with Sandbox() as sb:
        yield sb


def _family(question: str) -> str:
    return question.split("`")[1].split("(")[0]  # "Write a Python function `clamp(x)` ..." -> clamp


def test_every_reference_solution_passes_its_tests(sandbox: Sandbox) -> None:
    problems = heldout_problems(len([k for ks in code_task.heldout_keys().values() for k in ks]))
    problems += training_problems(400, seed=3)
    runs = sandbox.run_many([(p.ground_truth, p.columns["tests"]) for p in problems])
    failed = [(p.id, r) for p, r in zip(problems, runs, strict=True) if not r.all_passed]
    assert not failed
    assert {_family(p.question) for p in problems} == {f.function for f in FAMILIES}
    assert all(len(p.columns["tests"]) == code_task.TESTS_PER_PROBLEM for p in problems)


def test_a_wrong_solution_fails_and_a_completion_scores(sandbox: Sandbox) -> None:
    problem = heldout_problems(1)[0]
    wrong = problem.ground_truth.replace("return x +", "return 1 + x +")
    assert wrong != problem.ground_truth
    assert sandbox.run(wrong, problem.columns["tests"]).passed == 0
    completion = f"<think>easy</think><answer>\n```python\n{problem.ground_truth}```\n</answer>"
    assert score_completion(sandbox, completion, problem.columns["tests"]).all_passed


def test_each_family_has_training_and_heldout_problems() -> None:
    heldout = code_task.heldout_keys()
    for family in FAMILIES:
        keys = [(family.name, p) for p in family.params]
        assert 0 < len(heldout[family.name]) < len(keys), family.name
        assert len(set(keys)) == len(keys), family.name


def test_splits_never_share_a_problem() -> None:
    heldout = {p.question for p in heldout_problems(len([k for ks in code_task.heldout_keys().values() for k in ks]))}
    statements = {q.split("\n")[0] for q in heldout}
    for seed in range(4):
        for problem in training_problems(2000, seed):
            assert problem.question.split("\n")[0] not in statements


def test_draws_are_deterministic_per_seed() -> None:
    a = training_problems(64, seed=5)
    assert a == training_problems(64, seed=5)
    assert training_problems(8, seed=5) == a[:8]  # problem i does not depend on n
    assert [p.question for p in a] != [p.question for p in training_problems(64, seed=6)]
    assert heldout_problems(20, seed=1) == heldout_problems(20, seed=1)
    assert {p.id for p in heldout_problems(20, seed=1)} != {p.id for p in heldout_problems(20, seed=2)}
    first = heldout_problems(12)
    assert len({_family(p.question) for p in first}) == 12  # the families take turns


def test_task_protocol() -> None:
    task = CodeTask()
    assert (task.name, task.reward_function, task.splits()) == ("code", "code", ("train", "test"))
    assert len(task.prompts()) == 256 and len(task.prompts(split="test")) == code_task.DEFAULT_HELDOUT_N
    with pytest.raises(TaskError, match="Code has no 'validation' split; its splits: train, test"):
        task.prompts(split="validation")
    with pytest.raises(TaskError, match="synthetic_prompts must be between 8 and 100000"):
        task.prompts(7)
    with pytest.raises(TaskError, match="held-out problems must be between 1 and 193"):
        task.prompts(194, split="test")
    problem = task.prompts(8)[0]
    assert "```python" in problem.question and problem.task == "code"
    assert "<answer></answer>" in prompt_messages(problem)[0]["content"]


# --- the text side: code blocks and the tests column ------------------------------------------


def test_doctests() -> None:
    assert doctest.testmod(code_tests).failed == 0


@pytest.mark.parametrize(("completion", "code"), [
    ("```python\nx = 1\n```\ntext\n```python\nx = 2\n```", "x = 2"),
    ("```py\nx = 1\n```\n```bash\nrm -rf /\n```", "x = 1"),
    ("<answer>```python\ndef f():\n    return 1\n```</answer>", "def f():\n    return 1"),
    ("```Python3\n    x = 3\n```", "x = 3"),
    ("no block here", None),
    ("```python\nx = 1", None),  # unclosed
    ("```js\nlet x = 1\n```", None),
])
def test_extract_code(completion: str, code: str | None) -> None:
    assert extract_code(completion) == code


def test_parse_tests_forms() -> None:
    assert parse_tests(["assert f(1) == 2", " assert f(2) == 3 "]) == ["assert f(1) == 2", "assert f(2) == 3"]
    assert parse_tests('["assert f(1) == 2"]') == ["assert f(1) == 2"]
    source = "import math\nK = 2\nassert f(1) == K\ndef test_two():\n    assert f(2) == math.floor(2.5)\n"
    assert parse_tests(source) == ["import math\nK = 2\nassert f(1) == K",
                                   "import math\nK = 2\ndef test_two():\n    assert f(2) == math.floor(2.5)\ntest_two()"]


@pytest.mark.parametrize(("value", "message"), [
    (3, "tests: expected a list of test strings or one string of assert lines / test functions, got int"),
    ([], "tests: empty list"),
    ("", "tests: empty string"),
    (["assert f(1) == 2", 7], r"tests\[1\]: expected a string of Python"),
    (["assert f(1) =="], r"tests\[0\]: not valid Python: invalid syntax \(line 1\)"),
    ("x = 1\n", "tests: no assert statement or test_ function"),
    ("assert (", "tests: not valid Python"),
])
def test_parse_tests_refuses(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_tests(value)


def test_prepare_test_kinds() -> None:
    assert prepare_test("assert f(1) == 2").kind == "v"
    assert prepare_test("assert 'ab' == g('x')").expected == "ab"
    assert prepare_test("assert f(1) == 2, 'message'").source == "(f(1))"
    for general in ("assert f(1)", "assert f(1) > 0", "assert f(1) == g(2)", "assert 1 == 1", "x = f(1)\nassert x == 2"):
        assert prepare_test(general).kind == "a", general
