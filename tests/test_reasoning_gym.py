"""The reasoning_gym reward (rlvr/tasks/reasoning_gym_tasks.py): a real reasoning-gym task's prompts are
seeded, the held-out pool never reaches training, its own scorer grades through the registry the reward
service scores with, and a task name it does not have is refused at job validation, naming it."""

from __future__ import annotations

import pytest

from rlvr.common.errors import InvalidArgument
from rlvr.jobspec import resolve_spec
from rlvr.rewards import registry
from rlvr.services.reward.pool import ScoreItem, score_many
from rlvr.services.scheduler.datasets import check_dataset
from rlvr.tasks import TaskError, get_task
from rlvr.tasks.reasoning_gym_tasks import COLUMN, HELDOUT_SIZE, TASK_NAMES, ReasoningGymTask, _seeded
from rlvr.v1 import common_pb2

# Two one-digit terms: a few hundred questions in all, so the training stream meets held-out ones often.
SMALL = "chain_sum?min_terms=2&max_terms=2&min_digits=1&max_digits=1"

pytestmark = pytest.mark.usefixtures("checkout_entry_points")  # the reward through its entry point


def test_the_registry_offers_it_with_reasoning_gyms_own_task_list() -> None:
    from reasoning_gym.factory import DATASETS

    reward = registry.load_registry().get("reasoning_gym")
    assert reward.source == "built-in" and reward.needs_dataset and reward.columns == (COLUMN,)
    assert reward.dataset_names == TASK_NAMES == tuple(sorted(DATASETS)) and len(TASK_NAMES) >= 100
    assert "<answer></answer>" in reward.instruction


def test_prompts_are_seeded_and_reproducible() -> None:
    task = get_task("reasoning_gym", "chain_sum")
    first, again = task.prompts(n=16, seed=7), ReasoningGymTask("chain_sum").prompts(n=16, seed=7)
    assert [(p.question, p.ground_truth, p.columns) for p in first] == \
        [(p.question, p.ground_truth, p.columns) for p in again]
    assert [p.question for p in task.prompts(n=16, seed=8)] != [p.question for p in first]
    assert all(p.question.startswith("State the final answer") and p.ground_truth.lstrip("-").isdigit()
               for p in first)
    heldout = task.prompts(split="test")
    assert len(heldout) == HELDOUT_SIZE  # the default task never repeats a question in 200
    assert [p.question for p in task.prompts(n=10, seed=99, split="test")] == [p.question for p in heldout[:10]]


def test_training_never_sees_a_held_out_question() -> None:
    task = ReasoningGymTask(SMALL)
    heldout = {p.question for p in task.prompts(split="test")}
    assert 50 < len(heldout) < HELDOUT_SIZE  # a small task repeats questions: the pool keeps each once
    for seed in range(3):
        train = task.prompts(n=300, seed=seed)
        assert len(train) == 300 and not heldout & {p.question for p in train}
    # rejected rather than absent: the same seed's raw stream does hold held-out questions
    import reasoning_gym

    raw = reasoning_gym.create_dataset("chain_sum", min_terms=2, max_terms=2, min_digits=1, max_digits=1,
                                       seed=_seeded("rlvr.reasoning_gym.train:0"), size=300)
    assert heldout & {raw[i]["question"] for i in range(300)}


def _scored(problem, completion: str):  # noqa: ANN202 (a ScoreResult)
    item = ScoreItem(function="reasoning_gym", completion=completion, ground_truth=problem.ground_truth,
                     format_bonus=False, prompt=problem.question, columns=problem.columns)
    result = score_many([item])[0]
    assert not result.error, result.error
    return result


def _score(problem, completion: str) -> float:
    return _scored(problem, completion).accuracy


def test_its_own_scorer_grades_the_answer_as_every_reward_reads_one_through_the_registry() -> None:
    """The last <answer> block when there is one (a right number elsewhere cannot stand in for it),
    else the final answer wherever it stands; strict when the canonical place (the block, else the
    last non-empty line) alone is right."""
    problem = ReasoningGymTask("chain_sum").prompts(n=1, seed=3)[0]
    truth, wrong = problem.ground_truth, str(int(problem.ground_truth) + 1)
    assert _score(problem, f"<think>add them</think><answer>{truth}</answer>") == 1.0
    assert _scored(problem, f"<think>add them</think><answer>{truth}</answer>").strict
    assert _score(problem, f"<think>it is {truth}</think><answer>{wrong}</answer>") == 0.0
    prose = _scored(problem, f"Adding them step by step.\nThe final answer is {truth}.")
    assert (prose.accuracy, prose.strict, prose.extracted_answer) == (1.0, False, truth)
    bare = _scored(problem, f"Adding them step by step.\n{truth}")
    assert (bare.accuracy, bare.strict) == (1.0, True)
    assert _score(problem, f"The final answer is {wrong}.") == 0.0
    assert _score(problem, "I cannot tell.") == 0.0  # no number: the last line, which is no answer
    # Restating the question answers nothing: "is 4 + 5" reads as its last number, not the sum it makes.
    two = ReasoningGymTask(SMALL).prompts(n=8, seed=0, split="test")
    sum_ = next(p for p in two if "+" in p.question and p.question.split("+")[1].split("=")[0].strip()
                != p.ground_truth)
    echo = sum_.question.rsplit(":", 1)[-1].strip().rstrip("=").strip()
    assert _score(sum_, f"The final answer is {echo}.") == 0.0
    assert _score(sum_, f"{echo} = {sum_.ground_truth}. The final answer is {sum_.ground_truth}.") == 1.0
    # A task whose answer is no number reads the last line: the digits before it are no answer.
    word = ReasoningGymTask("spell_backward").prompts(n=1, seed=0)[0]
    assert _score(word, f"Reversed it in 2 steps:\n{word.ground_truth}") == 1.0
    options = ReasoningGymTask(SMALL).prompts(n=1, seed=0, split="test")[0]
    assert _score(options, f"<answer>{options.ground_truth}</answer>") == 1.0


def test_the_reward_services_pool_scores_it_within_the_default_time_limit() -> None:
    """In the reward service's worker processes (spawned: reasoning-gym not imported yet), each item
    under the service's default 0.5 s limit: the import (1-3 s) is the reward's warm-up, paid before
    the first item's clock starts, not a time-out of every first item. A completion with no answer scores 0."""
    from rlvr.services.reward.pool import ScoringPool

    problems = ReasoningGymTask("chain_sum").prompts(n=4, seed=5)
    items = [ScoreItem(function="reasoning_gym", completion=f"<answer>{p.ground_truth}</answer>" if i % 2 else
                       "no block", ground_truth=p.ground_truth, format_bonus=False, prompt=p.question,
                       columns=p.columns) for i, p in enumerate(problems)]
    pool = ScoringPool(workers=1)
    try:
        results = pool.score_batch(items, timeout_s=0.5)
    finally:
        pool.close()
    assert [(r.error, r.timed_out) for r in results] == [("", False)] * 4
    assert [r.accuracy for r in results] == [0.0, 1.0, 0.0, 1.0]


def test_an_unknown_task_is_refused_naming_it_and_the_tasks() -> None:
    with pytest.raises(TaskError, match=r"'chain_summ' is not a reasoning-gym task; its tasks: .*chain_sum"):
        get_task("reasoning_gym", "chain_summ")
    catalog = registry.load_registry().catalog()
    spec = common_pb2.JobSpec(base_model="tiny", reward=common_pb2.RewardConfig(key="reasoning_gym",
                                                                                  dataset="chain_summ?max_terms=3"))
    with pytest.raises(InvalidArgument) as refused:
        resolve_spec(spec, catalog=catalog)
    assert "reward.dataset: 'chain_summ?max_terms=3' is not a task of reasoning-gym task" in str(refused.value)
    assert "basic_arithmetic" in str(refused.value) and "zebra_puzzles" in str(refused.value)
    spec.reward.dataset = "chain_sum?max_terms=3"
    resolved = resolve_spec(spec, catalog=catalog)
    reward = resolved.spec.reward
    assert (reward.dataset, reward.dataset_split, reward.synthetic_prompts) == ("chain_sum?max_terms=3", "train", 256)
    check_dataset(reward, [], catalog)  # a task name is no data to read: nothing more to check, no hub asked
    spec.reward.dataset_split = "test"  # the held-out pool is not for training
    with pytest.raises(InvalidArgument, match=r"^reward.dataset_split: 'test': reasoning-gym task trains on its "
                                              r"'train' split only"):
        resolve_spec(spec, catalog=catalog)


def test_a_bad_option_names_the_task_and_the_error() -> None:
    with pytest.raises(TaskError, match=r"'chain_sum' with options \{'min_terms': 9, 'max_terms': 2\}"):
        ReasoningGymTask("chain_sum?min_terms=9&max_terms=2").prompts(n=8)
    with pytest.raises(TaskError, match="'seed' is set by rlvr"):
        ReasoningGymTask("chain_sum?seed=3")


def test_rlvr_rewards_lists_its_tasks(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from rlvr.clients.commands import jobs as jobs_cmd
    from rlvr.clients.commands import train as train_cmd
    from rlvr.peers.types import catalog_proto

    response = catalog_proto(registry.load_registry().catalog())

    class Scheduler:
        def list_reward_functions(self, request: object) -> object:
            return response

    monkeypatch.setattr(jobs_cmd, "scheduler_client", lambda args: Scheduler())
    assert train_cmd.cmd_rewards(argparse.Namespace(address=None)) == 0
    out = capsys.readouterr().out
    assert f"reasoning_gym  reasoning-gym task (--dataset names one of its {len(TASK_NAMES)} tasks" in out
    listed = out.split("tasks: ", 1)[1].split()
    assert "chain_sum," in listed and "zebra_puzzles" in listed


def test_listing_the_rewards_does_not_import_reasoning_gym() -> None:
    """Every process that loads the registry (each service, the CLI) lists this reward; reasoning-gym's
    import (1-3 s: sympy, matplotlib) waits for a task's problems or a score."""
    import subprocess
    import sys

    code = ("import sys; from rlvr.rewards.registry import load_registry; r = load_registry().get('reasoning_gym'); "
            "assert len(r.dataset_names) >= 100; print(sorted(m for m in sys.modules if m.startswith('reasoning_gym')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
    ReasoningGymTask("chain_sum").prompts(2)  # and it is there when used
    assert "reasoning_gym" in sys.modules
