"""``code_run``: for the code task (rlvr/tasks/code.py). A tool, ``run_tests``, runs candidate code
against the row's *visible* tests in rlvr's sandbox (rlvr/rewards/sandbox/, with its limits) and
returns the pass/fail report; the policy may try, read the report and try again, then answers. The
job's reward (``code``) scores the final answer on all the row's tests, most of which the policy
never saw run.

The visible tests: the row's ``visible_tests`` column when it has one, else the first ``visible`` of
its ``tests`` (a setting, default 2; the code task puts its edge cases first).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlvr.environments.base import Environment, EpisodeRow, environment, tool

VISIBLE_DEFAULT = 2
MAX_RUNS = 8  # run_tests calls an episode may make; later ones are refused (each costs a sandbox run)

INSTRUCTION = ("You may call the run_tests tool with your code to run it against some of the tests before "
               "answering. Think step by step inside <think></think>, then give the code as one ```python block "
               "inside <answer></answer>.")


def report(run: Any, tests: list[str]) -> str:
    """A sandbox `TestRun` as the model reads it: the count, then each test's outcome."""
    if run.reason:
        return f"0 of {run.total} tests passed: {run.reason}"
    lines = [f"{run.passed} of {run.total} tests passed"]
    lines += [f"{test}  # {detail}" for test, detail in zip(tests, run.details, strict=False)]
    return "\n".join(lines)


@environment(
    "code_run",
    display_name="Code with a test runner",
    version="1",
    columns=("tests",),
    instruction=INSTRUCTION,
    default_benchmark="code-heldout",
    max_turns=4,
    tool_timeout_seconds=15.0,
)
class CodeRun(Environment):
    """A run_tests tool that runs candidate code against the row's visible tests in rlvr's sandbox; the job's
    code reward scores the final answer on all the tests."""

    def __init__(self, visible: str | int = VISIBLE_DEFAULT) -> None:
        self.visible = int(visible)
        if self.visible < 1:
            raise ValueError(f"visible: at least 1 test must be visible, got {self.visible}")
        self.tests: list[str] = []
        self.runs: list[str] = []

    def reset(self, row: EpisodeRow) -> str | None:
        from rlvr.rewards.code_tests import parse_tests

        given = row.columns.get("visible_tests")
        self.tests = parse_tests(given) if given else parse_tests(row.columns.get("tests"))[:self.visible]
        return None

    @tool
    def run_tests(self, code: str) -> str:
        """Runs Python code against some of the problem's tests in a sandbox and reports which pass.

        Args:
            code: the Python source that defines the function (a ```python block or bare code)
        """
        from rlvr.rewards.code_tests import extract_code
        from rlvr.tasks.code import _sandbox

        if len(self.runs) >= MAX_RUNS:
            raise RuntimeError(f"run_tests may be called at most {MAX_RUNS} times an episode")
        source = extract_code(code) if "```" in code else code
        if not (source or "").strip():
            raise ValueError("no code to run")
        run = _sandbox().run(source, self.tests)
        self.runs.append(f"{run.passed}/{run.total}" + (f" ({run.reason})" if run.reason else ""))
        return report(run, self.tests)

    def state(self) -> Mapping[str, Any]:
        return {"visible_tests": list(self.tests), "runs": list(self.runs)}


ENVIRONMENT = CodeRun
