"""Environments: the registry (built-ins and plugins through the entry-point group), tool schemas and
`run_tool`'s handling of every bad call, the three built-ins, ListEnvironments and `rlvr environments`,
and docs/environments.md's code, run as written."""

from __future__ import annotations

import asyncio
import re
import sys
import time
import tomllib
from pathlib import Path

import pytest
from cli_fakes import run, serving
from fixtures_rewards import write_distribution

from rlvr.environments import Environment, EpisodeRow, Reply, ToolCall, environment, registry, tool
from rlvr.environments.tools import ToolResult, run_tool, tool_map, tool_schemas
from rlvr.v1 import scheduler_pb2, scheduler_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "environments.md"

PLUGIN = '''
from rlvr.environments import Environment, Reply, environment, tool

@environment("echo", display_name="Echo", version="2.1", columns=("style",), max_turns=3)
class Echo(Environment):
    """Says back what it is told."""

    @tool
    def echo(self, text: str) -> str:
        """Returns the text.

        Args:
            text: what to say back
        """
        return text

NOT_AN_ENVIRONMENT = 3
'''

BROKEN = 'raise ImportError("needs rlvr_test_missing_lib")\n'


@pytest.fixture
def env_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A distribution with a good environment, a broken one, one that is not a declaration and one
    whose key is not its entry point's name; the registry reloaded with them, and without after."""
    root = write_distribution(tmp_path / "plugins", "rlvr-test-envs",
                              {"rlvr_test_envs": PLUGIN, "rlvr_test_envs_broken": BROKEN}, {})
    info = next(root.glob("*.dist-info"))
    (info / "entry_points.txt").write_text(
        f"[{registry.ENTRY_POINT_GROUP}]\n"
        "echo = rlvr_test_envs:Echo\n"
        "broken = rlvr_test_envs_broken:ENV\n"
        "not_declared = rlvr_test_envs:NOT_AN_ENVIRONMENT\n"
        "calculator = rlvr_test_envs:Echo\n")  # a key taken by a built-in (and not the declared one)
    monkeypatch.syspath_prepend(str(root))
    registry.clear_cache()
    yield root
    for module in ("rlvr_test_envs", "rlvr_test_envs_broken"):
        sys.modules.pop(module, None)
    registry.clear_cache()


# ---------------------------------------------------------------- the registry


def test_the_builtins_are_found_with_their_source() -> None:
    found = registry.discover()
    assert [i.key for i in found.infos()] == ["calculator", "calculator_agent", "code_run", "guess_number"]
    assert all(i.source == "built-in" for i in found.infos()) and not found.failed
    calc, guess, code = found.get("calculator"), found.get("guess_number"), found.get("code_run")
    assert (calc.tools, calc.max_turns, calc.benchmark) == (("calculate",), 4, "rlvr-math-pairs-heldout")
    assert "calculate tool" in calc.instruction
    assert (guess.tools, guess.max_turns, guess.columns) == ((), 8, ("secret",))
    assert (code.tools, code.columns) == (("run_tests",), ("tests",))
    with pytest.raises(registry.UnknownEnvironment, match="'nope' is not an environment; known: calculator, "):
        registry.get_environment("nope")


def test_the_builtin_list_is_pyprojects() -> None:
    """The fallback for an install that predates the entry points is the very table pyproject.toml has."""
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert table[registry.ENTRY_POINT_GROUP] == registry.BUILTINS
    assert table["rlvr.rewards"]["guess_number"] == "rlvr.tasks.guess_number:REWARD"


def test_a_plugin_loads_and_a_broken_one_is_listed_as_failed(env_plugins) -> None:
    loaded = registry.load_registry()
    echo = loaded.get("echo")
    assert (echo.source, echo.version, echo.tools, echo.columns, echo.max_turns) == \
        ("plugin rlvr-test-envs 0.1", "2.1", ("echo",), ("style",), 3)
    assert echo.description == "Says back what it is told."
    assert "ImportError: needs rlvr_test_missing_lib" in loaded.failed["broken"]
    assert "is a int, not an EnvironmentDefinition" in loaded.failed["not_declared"]
    assert "declares the environment key 'echo'; they must match" in loaded.failed["calculator"]
    assert loaded.get("calculator").source == "built-in"  # the built-in stays
    with pytest.raises(registry.UnavailableEnvironment, match="'broken' could not be loaded: plugin rlvr-test-envs"):
        loaded.get("broken")
    catalog = loaded.catalog()  # the declarations alone, what crosses to another process
    assert catalog.get("echo") == echo.info() and not hasattr(catalog.get("echo"), "factory")
    assert catalog.failed == loaded.failed


def test_a_declaration_is_checked_when_made() -> None:
    with pytest.raises(ValueError, match="no docstring"):
        @tool
        def bare(x: int) -> int:
            return x
    with pytest.raises(ValueError, match="'x' has no type hint.*'y' is not described"):
        @tool
        def half(x, y: int) -> int:
            """Half documented.

            Args:
                x: one
            """
    with pytest.raises(ValueError, match="key 'Bad' is not allowed.*max_turns 0 is out of range"):
        environment("Bad", max_turns=0)(Environment)


# ---------------------------------------------------------------- tools


class Tools(Environment):
    @tool
    def add(self, a: int, b: int = 1) -> int:
        """Adds two numbers.

        Args:
            a: the first
            b: the second
        """
        return a + b

    @tool
    async def slow(self, seconds: float) -> str:
        """Waits.

        Args:
            seconds: how long
        """
        await asyncio.sleep(seconds)
        return "done"

    @tool
    def hang(self, seconds: float) -> str:
        """Blocks its thread.

        Args:
            seconds: how long
        """
        time.sleep(seconds)
        return "late"

    @tool
    def boom(self) -> str:
        """Raises."""
        raise RuntimeError("the tool broke")

    @tool
    def odd(self, kind: str) -> object:
        """Returns something that is not text.

        Args:
            kind: which
        """
        return {"set": {1, 2}, "nan": float("nan"), "json": {"a": [1, 2.5, True, None]}, "float": 2.5}[kind]


def test_tool_schemas_come_from_the_hints_and_docstrings() -> None:
    schemas = {s["function"]["name"]: s for s in tool_schemas(Tools())}
    assert set(schemas) == {"add", "slow", "hang", "boom", "odd"}
    add = schemas["add"]
    assert add["type"] == "function" and add["function"]["description"] == "Adds two numbers."
    assert add["function"]["parameters"]["properties"] == {"a": {"type": "integer", "description": "the first"},
                                                           "b": {"type": "integer", "description": "the second"}}
    assert add["function"]["parameters"]["required"] == ["a"]
    from rlvr.environments.builtin.calculator import Calculator
    calc = tool_schemas(Calculator.make())[0]["function"]
    assert calc["name"] == "calculate" and calc["parameters"]["properties"]["expression"]["type"] == "string"


def _run(name: str, timeout: float = 2.0, **arguments: object) -> ToolResult:
    return asyncio.run(run_tool(tool_map(Tools()), ToolCall(name, arguments), timeout))


def test_run_tool_sync_async_and_json_results() -> None:
    added = _run("add", a=2, b=3)
    assert (added.content, added.error) == ("5", "") and 0 <= added.seconds < 1
    assert _run("slow", seconds=0.01).content == "done"
    assert _run("odd", kind="json").content == '{"a": [1, 2.5, true, null]}'
    assert _run("odd", kind="float").content == "2.5" and not _run("odd", kind="float").error


@pytest.mark.parametrize(("name", "arguments", "error"), [
    ("nope", {}, r"no tool named 'nope'; the tools: add, boom, hang, odd, slow"),
    ("add", {"a": 1, "c": 1}, r"bad arguments for add: .*unexpected keyword argument 'c'"),
    ("add", {}, r"bad arguments for add: missing a required argument: 'a'"),
    ("boom", {}, r"boom failed: RuntimeError: the tool broke"),
    ("slow", {"seconds": 5}, r"slow took longer than its time limit of 0.2 s"),
    ("hang", {"seconds": 3}, r"hang took longer than its time limit of 0.2 s"),
    ("odd", {"kind": "set"}, r"odd returned something that is not text: the result is a set, not a str, number, bool or JSON .*"),
    ("odd", {"kind": "nan"}, r"odd returned something that is not text: the result nan is not a finite number"),
])
def test_run_tool_turns_every_bad_call_into_an_error_observation(name: str, arguments: dict, error: str) -> None:
    started = time.monotonic()
    result = _run(name, timeout=0.2, **arguments)
    assert re.fullmatch(error, result.error), result.error
    assert result.content == f"error: {result.error}"
    assert time.monotonic() - started < 1.5  # a hanging thread is left behind, not waited for


def test_arguments_that_are_not_an_object_are_an_error() -> None:
    result = asyncio.run(run_tool(tool_map(Tools()), ToolCall("add", [1, 2]), 1.0))  # type: ignore[arg-type]
    assert result.error == "the arguments of add must be an object of named arguments, got list"


# ---------------------------------------------------------------- the built-ins


@pytest.mark.parametrize(("expression", "value"), [
    ("(3 + 4) * (5 + 6)", "77"), ("7 / 2", "3.5"), ("1/3", "0.3333333333"), ("-2.5 * 4", "-10"),
    ("0.1 + 0.2", "0.3"), ("  12  ", "12"),
])
def test_the_calculator_computes(expression: str, value: str) -> None:
    from rlvr.environments.builtin.calculator import evaluate

    assert evaluate(expression) == value


@pytest.mark.parametrize(("expression", "error"), [
    ("2 ** 10", "found Pow"), ("9 ** 9 ** 9", "found Pow"), ("x + 1", "found Name"),
    ("__import__('os').system('true')", "found Call"), ("(1).real", "found Attribute"), ("'a' * 3", "found Constant"),
    ("1 // 2", "found FloorDiv"), ("7 % 2", "found Mod"), ("1 / 0", "division by zero"),
    ("9" * 31, "larger than"), ("1e400", "larger than"), ("10000000000000000 * " * 3 + "1", "larger than"),
    ("1 +", "not an arithmetic expression"), ("1" * 201, "at most 200"), ("[1, 2]", "found List"),
    ("lambda: 1", "found Lambda"),
])
def test_the_calculator_refuses_anything_but_arithmetic(expression: str, error: str) -> None:
    from rlvr.environments.builtin.calculator import evaluate

    with pytest.raises(ValueError, match=re.escape(error)):
        evaluate(expression)


def test_the_calculator_tool_through_run_tool() -> None:
    env = registry.get_environment("calculator").make()
    assert env.reset(EpisodeRow("Add each adjacent pair of numbers, then multiply the sums: 3 4 5 6", "77")) is None
    ok = asyncio.run(run_tool(tool_map(env), ToolCall("calculate", {"expression": "7 * 11"}), 2.0))
    bad = asyncio.run(run_tool(tool_map(env), ToolCall("calculate", {"expression": "2**9999"}), 2.0))
    assert (ok.content, ok.error) == ("77", "")
    assert bad.content.startswith("error: calculate failed: ValueError: only numbers")
    assert env.step("<answer>77</answer>") == Reply(done=True) and env.reward() is None


def test_guess_number_plays_a_scripted_game_to_done() -> None:
    env = registry.get_environment("guess_number").make()
    rules = env.reset(EpisodeRow("I am thinking of a number", "37", columns={"secret": 37}))
    assert rules and "higher or lower" in rules
    replies = [env.step(t) for t in ("<answer>50</answer>", "no idea", "<think>25</think><answer>25</answer>",
                                     "I say 37.")]
    assert [r.done for r in replies] == [False, False, False, True]
    assert replies[0].text.startswith("Lower") and replies[2].text.startswith("Higher")
    assert "could not read a guess" in replies[1].text
    out = env.reward()
    assert (out.score, out.strict, out.extracted_answer) == (pytest.approx(0.85), True, "37")  # 4 guesses
    assert env.state() == {"secret": 37, "guesses": [50, None, 25, 37], "solved": True}

    lost = registry.get_environment("guess_number").make()
    lost.reset(EpisodeRow("", seed=7))
    from rlvr.tasks.guess_number import secret_of

    assert lost.state()["secret"] == secret_of(7) and 1 <= secret_of(7) <= 100
    wrong = 1 if secret_of(7) != 1 else 2
    assert not lost.step(f"<answer>{wrong}</answer>").done and lost.reward().score == 0.0


def test_the_guess_number_reward_makes_the_prompts() -> None:
    from rlvr.rewards import Sample
    from rlvr.tasks import task_of
    from rlvr.tasks.guess_number import REWARD

    task = task_of(REWARD)
    train, test = task.prompts(8, seed=1), task.prompts(split="test")
    assert len(train) == 8 and all(p.columns["secret"] == int(p.ground_truth) for p in train)
    assert sorted(p.columns["secret"] for p in test) == list(range(1, 101))
    assert task.prompts(8, seed=1) == train and task.prompts(8, seed=2) != train
    assert REWARD.score(Sample("<answer>42</answer>", "42")).score == 1.0
    assert REWARD.score(Sample("<answer>41</answer>", "42")).score == 0.0


def test_code_run_runs_the_visible_tests_in_the_sandbox() -> None:
    from rlvr.tasks.code import training_problems

    problem = training_problems(8, seed=0)[0]
    env = registry.get_environment("code_run").make()
    env.reset(EpisodeRow(problem.question, problem.ground_truth, columns=problem.columns))
    assert env.tests == problem.columns["tests"][:2]
    tools = tool_map(env)
    good = asyncio.run(run_tool(tools, ToolCall("run_tests", {"code": f"```python\n{problem.ground_truth}```"}), 30))
    assert good.content.startswith("2 of 2 tests passed\n"), good
    bad = asyncio.run(run_tool(tools, ToolCall("run_tests", {"code": "def nothing():\n    pass\n"}), 30))
    assert bad.content.startswith("0 of 2 tests passed"), bad
    hang = asyncio.run(run_tool(tools, ToolCall("run_tests", {"code": "while True:\n    pass\n"}), 30))
    assert hang.content.startswith("0 of 2 tests passed: ") and "limit" in hang.content, hang
    assert env.state()["runs"][:2] == ["2/2", "0/2"]
    three = registry.get_environment("code_run").make({"visible": "3"})
    three.reset(EpisodeRow("", columns={"tests": problem.columns["tests"], "visible_tests": ["assert 1 == 1"]}))
    assert three.tests == ["assert 1 == 1"]


# ---------------------------------------------------------------- ListEnvironments and the CLI


def test_list_environments_answers_the_registry() -> None:
    from rlvr.services.scheduler.server import SchedulerServicer

    response = asyncio.run(SchedulerServicer().ListEnvironments(scheduler_pb2.ListEnvironmentsRequest(), None))
    by_key = {e.key: e for e in response.environments}
    assert list(by_key) == ["calculator", "calculator_agent", "code_run", "guess_number"] and not response.unavailable
    calc = by_key["calculator"]
    assert (list(calc.tools), calc.max_turns, calc.source, calc.version, calc.default_benchmark) == \
        (["calculate"], 4, "built-in", "1", "rlvr-math-pairs-heldout")
    assert calc.tool_timeout_seconds == 2.0 and "calculate tool" in calc.instruction


class FakeScheduler(scheduler_pb2_grpc.SchedulerServiceServicer):
    def ListEnvironments(self, request, context):  # noqa: N802
        from rlvr.services.scheduler.environments import environments_proto

        catalog = registry.load_registry().catalog()
        return environments_proto(type(catalog)(catalog.environments, {"broken": "plugin x 1 (x:ENV): ImportError"}))


def test_the_cli_and_the_sdk_list_the_environments(capfd: pytest.CaptureFixture[str]) -> None:
    from rlvr.clients.sdk import ClientSettings, connect

    with serving(FakeScheduler()) as address:
        code, out, err = run(capfd, "environments", "--address", address)
        envs = connect(ClientSettings(scheduler_address=address)).scheduler.environments()
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("calculator        Calculator v1 (built-in; tools: calculate; max_turns 4)")
    assert any(line.startswith("guess_number      Guess the Number v1 (built-in; tools: no tools; max_turns 8; reads "
                               "secret)") for line in lines)
    assert lines[-1] == "broken            not loaded: plugin x 1 (x:ENV): ImportError"
    assert [e.key for e in envs] == ["calculator", "calculator_agent", "code_run", "guess_number"]
    assert isinstance(envs[0], scheduler_pb2.EnvironmentInfo)


def test_the_cli_says_when_the_scheduler_is_not_there(capfd: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capfd, "environments", "--address", "127.0.0.1:1")
    assert code == 1 and err.startswith("error: ")


# ---------------------------------------------------------------- docs/environments.md

BLOCKS = re.findall(r"```(\w+)\n(.*?)```", PAGE.read_text(), re.DOTALL) if PAGE.exists() else []


def test_the_pages_environment_plays_as_the_page_says() -> None:
    source = next(code for lang, code in BLOCKS if lang == "python")
    namespace: dict[str, object] = {}
    exec(compile(source, str(PAGE), "exec"), namespace)  # noqa: S102 (the page's own code)
    definition = namespace["WORDS"]
    from rlvr.environments import EnvironmentDefinition

    assert isinstance(definition, EnvironmentDefinition)
    assert (definition.key, definition.tools, definition.columns) == ("word_hunt", ("letter_count",), ("word",))
    env = definition.make({"max_misses": "2"})
    assert "letters" in (env.reset(EpisodeRow("Find the word.", columns={"word": "river"})) or "")
    counted = asyncio.run(run_tool(tool_map(env), ToolCall("letter_count", {"letter": "r"}), 1.0))
    assert counted.content == "2"
    assert env.step("<answer>rover</answer>") == Reply("No, not rover.")
    assert env.step("<answer>river</answer>").done and env.reward() == 1.0
    assert tool_schemas(env)[0]["function"]["parameters"]["required"] == ["letter"]
