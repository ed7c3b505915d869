"""Tasks: Math Pairs determinism and held-out disjointness, GSM8K, boxed datasets and their errors,
and prompt rendering in both prompt forms."""

from __future__ import annotations

import doctest
import itertools
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from rlvr.rewards.scoring import score
from rlvr.tasks import (
    BoxedTask,
    GSM8KTask,
    Problem,
    TaskError,
    get_task,
    gsm8k,
    heldout_split,
    ignored_dataset_warning,
    prompt_messages,
    prompt_style,
    render_prompt,
)
from rlvr.tasks import math_pairs as mp
from rlvr.tasks.sources import peek_columns

ROOT = Path(__file__).resolve().parent.parent

# --- Math Pairs ----------------------------------------------------------------------------------


def test_math_pairs_is_deterministic_and_prefix_stable() -> None:
    a = mp.training_problems(256, seed=7)
    assert a == mp.training_problems(256, seed=7)
    assert mp.training_problems(8, seed=7) == a[:8]  # prompt i does not depend on n
    assert [p.question for p in a] != [p.question for p in mp.training_problems(256, seed=8)]
    assert len({p.id for p in a}) == 256


@pytest.mark.parametrize("n", [7, 100_001, 0, -1])
def test_synthetic_prompts_range(n: int) -> None:
    with pytest.raises(TaskError, match="synthetic_prompts must be between 8 and 100000"):
        mp.training_problems(n)


def test_default_and_extremes() -> None:
    assert len(get_task("math_pairs").prompts()) == 256
    assert len(mp.training_problems(8)) == 8


def test_math_pairs_answers_and_worked_solutions_score_correct() -> None:
    for problem in mp.training_problems(50, seed=1) + mp.heldout_problems(50):
        numbers = mp.parse_numbers(problem.question)
        assert mp.parse_numbers(problem.compact or "") == numbers
        a, b, c, d = numbers
        assert problem.ground_truth == str((a + b) * (c + d))
        result = score("math_pairs", mp.worked_solution(numbers), problem.ground_truth)
        assert (result.accuracy, result.format, result.strict) == (1.0, 1.0, True)


def test_heldout_class_is_a_function_of_the_canonical_key() -> None:
    """The proof of disjointness: rewrites that keep the answer never cross the partition."""
    values = range(mp.MIN_VALUE, mp.MAX_VALUE + 1)
    by_key: dict[mp.CanonicalKey, set[bool]] = {}
    for numbers in itertools.product(values, repeat=4):
        by_key.setdefault(mp.canonical_key(numbers), set()).add(mp.is_heldout(numbers))
        a, b, c, d = numbers
        for rewrite in [(b, a, c, d), (a, b, d, c), (c, d, a, b)]:
            assert mp.canonical_key(rewrite) == mp.canonical_key(numbers)
    assert all(len(classes) == 1 for classes in by_key.values())
    heldout_keys = sum(classes == {True} for classes in by_key.values())
    assert 0.1 < heldout_keys / len(by_key) < 0.3  # about one key in five


def test_training_never_emits_heldout_for_any_seed() -> None:
    heldout = {mp.canonical_key(n) for n in mp.all_heldout()}
    for seed in [0, 1, 2, 42, 2**31 - 1, -5, 10**12]:
        for problem in mp.training_problems(2_000, seed=seed):
            assert mp.canonical_key(mp.parse_numbers(problem.question)) not in heldout


def test_heldout_set() -> None:
    task = get_task("math_pairs")
    bench = task.prompts(split="test")
    assert len(bench) == mp.DEFAULT_HELDOUT_N == len({p.question for p in bench})
    assert all(mp.is_heldout(mp.parse_numbers(p.question)) for p in bench)
    assert bench == task.prompts(split="test", seed=0)
    assert bench[:10] != task.prompts(split="test", seed=1)[:10]
    with pytest.raises(TaskError, match="held-out problems must be between 1 and"):
        mp.heldout_problems(len(mp.all_heldout()) + 1)


@pytest.mark.parametrize("module", [mp, gsm8k])
def test_doctests(module: types.ModuleType) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


# --- GSM8K ---------------------------------------------------------------------------------------


def test_gsm8k_bundled() -> None:
    task = GSM8KTask()
    train, test = task.prompts(), task.prompts(split="test")
    assert (len(train), len(test)) == (7473, 1319)
    assert test[0].ground_truth == "18" and test[0].question.startswith("Janet")
    assert all("," not in p.ground_truth for p in train + test)
    assert "1450000" in {p.ground_truth for p in test}  # was "#### 1,450,000"
    assert task.prompts(5, split="test") == test[:5]  # benchmarks keep file order
    assert task.prompts(5, seed=1) != task.prompts(5, seed=2)
    assert GSM8KTask("openai/gsm8k").prompts(3, split="test") == test[:3]  # the built-in copy


def test_gsm8k_local_file(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    rows = [{"question": "1+1?", "answer": "2\n#### 2"}, {"question": "big?", "answer": "#### 8,000"}]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    task = GSM8KTask(str(path), data_roots=[tmp_path])
    problems = task.prompts(shuffle=False)  # a single file is the one split "train"; file order
    assert [p.ground_truth for p in problems] == ["2", "8000"] and task.splits() == ("train",)
    with pytest.raises(TaskError, match="has no 'test' split; its splits: train"):
        task.prompts(split="test")
    with pytest.raises(TaskError, match="outside the allowed data roots"):
        GSM8KTask(str(path), data_roots=[tmp_path / "elsewhere"]).prompts()


def test_hub_name_offline_is_a_clear_error() -> None:
    code = (
        "from rlvr.tasks import GSM8KTask, TaskError\n"
        "try:\n    GSM8KTask('someone/gsm8k-variant').prompts(8)\n"
        "except TaskError as e:\n    print('TaskError:', e)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "TaskError: hub dataset 'someone/gsm8k-variant' could not be loaded" in out.stdout, out.stderr


# --- Boxed-answer datasets -----------------------------------------------------------------------

BOXED_ROWS = [
    {"prompt": "What is 1/2 + 1/4?", "ground_truth": "\\frac{3}{4}"},
    {"prompt": "2+2?", "ground_truth": "4"},
]


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_boxed_local_formats(tmp_path: Path, suffix: str) -> None:
    import pandas as pd

    path = tmp_path / f"data{suffix}"
    frame = pd.DataFrame(BOXED_ROWS)
    if suffix == ".jsonl":
        frame.to_json(path, orient="records", lines=True)
    elif suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path)
    problems = BoxedTask(str(path), data_roots=[tmp_path]).prompts(shuffle=False)
    assert [(p.question, p.ground_truth, p.task) for p in problems] == [
        ("What is 1/2 + 1/4?", "\\frac{3}{4}", "boxed"),
        ("2+2?", "4", "boxed"),
    ]


def test_a_local_folder_holds_one_file_per_split(tmp_path: Path) -> None:
    folder = tmp_path / "boxed-set"
    folder.mkdir()
    _jsonl(folder / "train.jsonl", BOXED_ROWS)
    _jsonl(folder / "test.jsonl", BOXED_ROWS[1:])
    (folder / "notes.txt").write_text("not a split")
    task = BoxedTask(str(folder), [tmp_path])
    assert task.splits() == ("test", "train") and heldout_split(task.splits(), str(folder)) == "test"
    assert [p.ground_truth for p in task.prompts(split="test")] == ["4"]
    assert len(task.prompts(split="train")) == 2
    with pytest.raises(TaskError, match="has no 'validation' split; its splits: test, train"):
        task.prompts(split="validation")
    assert peek_columns(str(folder), "test", [tmp_path]) == ["prompt", "ground_truth"]
    assert heldout_split(("train",), "one.jsonl") == "train"  # a single file: its only split
    with pytest.raises(TaskError, match="no 'test' split; name one of dev, train"):
        heldout_split(("dev", "train"), "x")


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_peek_columns_reads_only_the_head(tmp_path: Path, suffix: str) -> None:
    import pandas as pd

    path = tmp_path / f"data{suffix}"
    frame = pd.DataFrame([{"prompt": "p", "answer": "1"}] * 3)
    if suffix == ".jsonl":
        frame.to_json(path, orient="records", lines=True)
    elif suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path)
    assert peek_columns(str(path), "train", [tmp_path]) == ["prompt", "answer"]
    with pytest.raises(TaskError, match="outside the allowed data roots"):
        peek_columns(str(path), "train", [tmp_path / "other"])


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_boxed_missing_column_lists_columns(tmp_path: Path) -> None:
    source = _jsonl(tmp_path / "d.jsonl", [{"question": "q", "answer": "1"}])
    with pytest.raises(TaskError) as info:
        BoxedTask(source, [tmp_path]).prompts()
    message = str(info.value)
    assert "no 'prompt', 'ground_truth' column" in message and "['question', 'answer']" in message


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("", "could not be read|is empty"),
        ("{not json\n", "could not be read"),
        (json.dumps({"prompt": "q", "ground_truth": None}) + "\n", "row 0: empty 'ground_truth'"),
        (json.dumps({"prompt": "  ", "ground_truth": "1"}) + "\n", "row 0: empty 'prompt'"),
    ],
    ids=["empty", "garbage", "null-truth", "blank-prompt"],
)
def test_boxed_bad_files(tmp_path: Path, content: str, match: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(content)
    with pytest.raises(TaskError, match=match):
        BoxedTask(str(path), [tmp_path]).prompts()


def test_boxed_paths_outside_roots(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    secret = _jsonl(outside / "d.jsonl", BOXED_ROWS)
    (root / "link.jsonl").symlink_to(secret)
    for source in [secret, str(root / ".." / "outside" / "d.jsonl"), str(root / "link.jsonl")]:
        with pytest.raises(TaskError, match="outside the allowed data roots"):
            BoxedTask(source, [root]).prompts()
    with pytest.raises(TaskError, match="no data roots are configured"):
        BoxedTask(secret).prompts()
    with pytest.raises(TaskError, match="does not exist"):
        BoxedTask(str(root / "missing.jsonl"), [root]).prompts()
    (root / "d.txt").write_text("x")
    with pytest.raises(TaskError, match="unsupported type"):
        BoxedTask(str(root / "d.txt"), [root]).prompts()


def test_boxed_needs_a_dataset() -> None:
    with pytest.raises(TaskError, match="needs a dataset"):
        get_task("boxed")
    with pytest.raises(TaskError, match="neither a data file"):
        BoxedTask("not a name!").prompts()


def test_boxed_conversational_prompts(tmp_path: Path) -> None:
    rows = [
        {
            "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
            "ground_truth": 4,
        }
    ]
    problem = BoxedTask(_jsonl(tmp_path / "c.jsonl", rows), [tmp_path]).prompts()[0]
    assert problem.ground_truth == "4" and problem.messages is not None
    messages = prompt_messages(problem)
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[1]["content"].startswith("2+2?\n\n") and "\\boxed" in messages[1]["content"]


# --- Rendering and task selection ----------------------------------------------------------------


class _PlainTokenizer:
    """A base-model tokenizer: no chat template, no declared style."""

    chat_template = None
    init_kwargs: dict = {}
    name_or_path = ""


def test_render_styles() -> None:
    from rlvr.tiny.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    problem = mp.heldout_problems(1)[0]
    assert prompt_style(tokenizer) == "compact"
    compact = render_prompt(tokenizer, problem)
    assert compact == f"<|im_start|>user\n{problem.compact}<|im_end|>\n<|im_start|>assistant\n"
    full = render_prompt(tokenizer, problem, style="full")
    assert problem.question in full and "<think></think>" in full and "<answer></answer>" in full
    plain = render_prompt(_PlainTokenizer(), problem)
    assert plain.startswith(problem.question) and plain.endswith("<answer></answer>.\n")


def test_style_from_model_directory(tmp_path: Path) -> None:
    tokenizer = _PlainTokenizer()
    tokenizer.name_or_path = str(tmp_path)
    assert prompt_style(tokenizer) == "full"
    (tmp_path / "rlvr_model.json").write_text(json.dumps({"rlvr_prompt_style": "compact"}))
    assert prompt_style(tokenizer) == "compact"


def test_gsm8k_full_prompt_asks_for_a_number() -> None:
    problem = Problem(id="x", task="gsm8k", question="How many?", ground_truth="3")
    (message,) = prompt_messages(problem)
    assert message["content"] == (
        "How many?\n\nThink step by step inside <think></think>, then give only the final number "
        "inside <answer></answer>."
    )


def test_get_task_and_warnings() -> None:
    assert get_task("math_pairs", dataset="ignored.jsonl").name == "math_pairs"
    assert get_task("gsm8k", dataset="ignored.jsonl").prompts(1, split="test")[0].ground_truth == "18"
    with pytest.raises(TaskError, match="unknown reward function 'nope'"):
        get_task("nope")
    assert "ignored" in (ignored_dataset_warning("math_pairs", "d.jsonl") or "")
    assert "ignored" in (ignored_dataset_warning("gsm8k", "d.jsonl") or "")
    assert ignored_dataset_warning("boxed", "d.jsonl") is None
    assert ignored_dataset_warning("gsm8k", None) is None
