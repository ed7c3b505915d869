"""reasoning-gym: 100+ procedural tasks, generated offline from a seed and scored by their own scorers.

The reward ``reasoning_gym`` takes its Dataset field as the name of a reasoning-gym task
(``chain_sum``, ``basic_arithmetic``, ...; ``reasoning_gym.factory.DATASETS`` is the list), with the
task's options after a ``?`` when wanted (``chain_sum?min_terms=2&max_terms=3``: each value is read
as JSON when it parses, else kept as a string, and passed to the task's config). Nothing is
downloaded: the package generates every problem from its seed.

Prompts and ground truth
    A problem's question is the task's own question; the reward's instruction asks for the answer
    inside ``<answer></answer>``, which is where reasoning-gym's scorers expect it
    (``reasoning_gym.utils.extract_answer``: the last block); a completion without a block is read
    for its final answer (`read_answer`: a number the completion writes, for a task whose answer is a
    number; else its last line), so accuracy means what it means everywhere ("correct final answers,
    wherever they stand") and a model that answers in prose has headroom. The row's ``reasoning_gym`` column
    holds the task spec and the whole entry (question, answer, metadata) as JSON text, which is all
    ``score_answer`` reads: the reward service scores from the sample alone.
Score
    The task's ``score_answer`` on the extracted answer, a number in [0, 1] (some tasks give partial
    credit, e.g. 0.05 for a wrong ARC grid); strict when the canonical place alone (the block, else
    the last non-empty line) scores 1.
Held-out, disjoint from training by construction
    The ``test`` split is a fixed pool: ``HELDOUT_SIZE`` entries of the task (with its options) from
    ``HELDOUT_SEED``, in that order, repeated questions dropped. A training split (``reward.synthetic_prompts``
    problems, default 256) is drawn from a seed derived from the job's seed, and every entry whose question text is in the held-out pool
    is rejected. Different seeds alone would not do: most reasoning-gym tasks seed entry ``i`` of seed ``s``
    with ``s + i``, so two seeds' streams overlap, and a small task (two one-digit terms) repeats
    questions anyway. What is compared is the question as the model reads it.

``reasoning_gym`` is imported on first use (a task's problems, a score), not when the registry loads
this module with the other built-ins: its import takes 1-3 s (sympy, matplotlib), which every
process that lists the rewards would pay. So the task names are written here, for the pinned
reasoning-gym (pyproject.toml); tests/test_reasoning_gym.py checks them against its
``reasoning_gym.factory.DATASETS``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any
from urllib.parse import parse_qsl

from rlvr.rewards.format import MAX_COMPLETION_CHARS
from rlvr.rewards.registry import DEFAULT_INSTRUCTION, RewardDefinition, RewardOutput, Sample
from rlvr.tasks.base import DEFAULT_SYNTHETIC_PROMPTS, Problem, Split, TaskError, check_count

KEY = "reasoning_gym"
COLUMN = "reasoning_gym"  # the row's task spec and entry, JSON text (a string survives the wire exactly)
# reasoning-gym 0.1.25's tasks (reasoning_gym.factory.DATASETS), sorted
TASK_NAMES: tuple[str, ...] = (
    'ab', 'acre', 'advanced_geometry', 'aiw', 'arc_1d', 'arc_agi', 'base_conversion',
    'basic_arithmetic', 'bf', 'binary_alternation', 'binary_matrix', 'bitwise_arithmetic', 'boxnet',
    'caesar_cipher', 'calendar_arithmetic', 'chain_sum', 'circuit_logic', 'codeio', 'coin_flip',
    'color_cube_rotation', 'complex_arithmetic', 'composite', 'count_bits', 'count_primes', 'countdown',
    'course_schedule', 'cryptarithm', 'decimal_arithmetic', 'decimal_chain_sum', 'dice',
    'emoji_mystery', 'family_relationships', 'figlet_font', 'fraction_simplification', 'futoshiki',
    'game_of_life', 'game_of_life_halting', 'gcd', 'graph_color', 'group_anagrams', 'gsm_symbolic',
    'intermediate_integration', 'isomorphic_strings', 'jugs', 'kakurasu', 'knight_swap',
    'knights_knaves', 'largest_island', 'lcm', 'leg_counting', 'letter_counting', 'letter_jumble',
    'list_functions', 'mahjong_puzzle', 'manipulate_matrix', 'maze', 'mini_sudoku', 'modulo_grid',
    'n_queens', 'needle_haystack', 'number_filtering', 'number_format', 'number_sequence',
    'number_sorting', 'palindrome_generation', 'palindrome_partitioning', 'path_star',
    'polynomial_equations', 'polynomial_multiplication', 'pool_matrix', 'power_function',
    'prime_factorization', 'products', 'propositional_logic', 'puzzle24', 'quantum_lock', 'ransom_note',
    'rearc', 'rectangle_count', 'rotate_matrix', 'rotten_oranges', 'rubiks_cube', 'rush_hour',
    'self_reference', 'sentence_reordering', 'shortest_path', 'simple_equations', 'simple_geometry',
    'simple_integration', 'sokoban', 'spell_backward', 'spiral_matrix', 'string_insertion',
    'string_manipulation', 'string_splitting', 'string_synthesis', 'sudoku', 'survo', 'syllogism',
    'time_intervals', 'tower_of_hanoi', 'tsumego', 'word_ladder', 'word_sequence_reversal',
    'word_sorting', 'zebra_puzzles',
)
HELDOUT_SEED = 20_251_207  # the held-out pool's seed, the same for every job and every model
HELDOUT_SIZE = 200
MAX_DRAWS_PER_PROBLEM = 20  # a task whose every question is held out fails instead of looping


def parse_spec(spec: str | None) -> tuple[str, dict[str, Any]]:
    """The task name and its options of a Dataset field value.

    >>> parse_spec("chain_sum?min_terms=2&max_terms=3&name=x")
    ('chain_sum', {'min_terms': 2, 'max_terms': 3, 'name': 'x'})
    """
    text = (spec or "").strip()
    if not text:
        raise TaskError(f"the reasoning_gym reward needs a task name in the Dataset field; its tasks: "
                        f"{', '.join(TASK_NAMES)}")
    name, _, query = text.partition("?")
    if name not in TASK_NAMES:
        raise TaskError(f"{name!r} is not a reasoning-gym task; its tasks: {', '.join(TASK_NAMES)}")
    options: dict[str, Any] = {}
    for option, raw in parse_qsl(query, keep_blank_values=True):
        if option in ("seed", "size"):
            raise TaskError(f"{text!r}: {option!r} is set by rlvr (the job's seed, the prompts asked for)")
        try:
            options[option] = json.loads(raw)
        except ValueError:
            options[option] = raw
    return name, options


def _seeded(label: str) -> int:
    # sha256, not hash(): the same in every process and Python
    return int.from_bytes(hashlib.sha256(label.encode()).digest()[:4], "big")


def _dataset(name: str, options: Mapping[str, Any], seed: int, size: int) -> Any:
    """reasoning-gym's dataset (entries are made on access, from ``seed`` + index)."""
    import reasoning_gym

    try:
        return reasoning_gym.create_dataset(name, seed=seed, size=size, **options)
    except Exception as e:  # a bad option: the config's own TypeError / AssertionError / ValueError
        raise TaskError(f"reasoning-gym task {name!r} with options {dict(options)}: {type(e).__name__}: {e}") from None


@lru_cache(maxsize=32)
def _heldout(spec: str) -> tuple[dict[str, Any], ...]:
    name, options = parse_spec(spec)
    dataset = _dataset(name, options, HELDOUT_SEED, HELDOUT_SIZE)
    seen: set[str] = set()
    pool = []
    for i in range(HELDOUT_SIZE):
        entry = dataset[i]
        if entry["question"] not in seen:
            seen.add(entry["question"])
            pool.append(entry)
    return tuple(pool)


def _problem(spec: str, entry: Mapping[str, Any], problem_id: str) -> Problem:
    answer = entry.get("answer")
    return Problem(id=problem_id, task=KEY, question=str(entry["question"]),
                   ground_truth="" if answer is None else str(answer),  # None: a task that checks any solution
                   columns={COLUMN: json.dumps({"spec": spec, "entry": entry}, sort_keys=True)})


class ReasoningGymTask:
    """One reasoning-gym task (with its options): seeded training problems and a fixed held-out pool."""

    reward_function = KEY

    def __init__(self, spec: str | None) -> None:
        self.name, self.options = parse_spec(spec)
        self.spec = (spec or "").strip()

    def splits(self) -> tuple[Split, ...]:
        return ("train", "test")

    def prompts(self, n: int | None = None, seed: int = 0, split: Split = "train",
                shuffle: bool | None = None) -> list[Problem]:
        """``n`` training problems of ``seed`` (repeats possible, none held out), or the first ``n`` of
        the held-out pool (its own order, whatever the seed: every model gets the same questions)."""
        if split == "test":
            pool = _heldout(self.spec)
            n = len(pool) if n is None else check_count(n, "held-out problems", low=1, high=len(pool))
            return [_problem(self.spec, e, f"{KEY}/{self.spec}/test/{i}") for i, e in enumerate(pool[:n])]
        if split != "train":
            raise TaskError(f"reasoning-gym task {self.spec!r} has no {split!r} split; its splits: train, test")
        n = check_count(DEFAULT_SYNTHETIC_PROMPTS if n is None else n, "synthetic_prompts", low=1)
        held = {e["question"] for e in _heldout(self.spec)}
        draws = n * MAX_DRAWS_PER_PROBLEM
        dataset = _dataset(self.name, self.options, _seeded(f"rlvr.reasoning_gym.train:{seed}"), min(draws, 2**31))
        problems: list[Problem] = []
        for i in range(draws):
            entry = dataset[i]
            if entry["question"] not in held:
                problems.append(_problem(self.spec, entry, f"{KEY}/{self.spec}/train/{seed}/{i}"))
                if len(problems) == n:
                    return problems
        raise TaskError(f"reasoning-gym task {self.spec!r}: only {len(problems)} of {n} training problems in "
                        f"{draws} draws are not held out; widen its options")


@lru_cache(maxsize=64)
def _scorer(spec: str) -> Any:
    """The task's ``score_answer``, of a dataset made with the options the problem was made with."""
    name, options = parse_spec(spec)
    return _dataset(name, options, 0, 1).score_answer


def warm_up() -> None:
    """reasoning-gym's import (1-3 s), before a scoring process's first completion's time limit starts."""
    import reasoning_gym  # noqa: F401
    import reasoning_gym.utils  # noqa: F401


def _numeric(answer: object) -> bool:
    try:
        float(str(answer).replace(",", "").strip())
    except ValueError:
        return False
    return True


def read_answer(completion: str, truth: object) -> tuple[str, str]:
    r"""The answer a completion gives, and its canonical place (what strict reads).

    The last ``<answer>`` block when there is one (both). Without one, for a task whose answer is a
    number, the final number as rlvr's other rewards read it (rlvr/rewards/answers.py: the last box
    or "final answer is N", else the last number), but only a number the completion writes: "the
    final answer is 4 + 5" restates a chain_sum question and answers nothing, so it reads as its last
    number, 5, rather than as the sum the statement's arithmetic comes to; for any other task (a
    word list, a time, a matrix) the last non-empty line, whose digits are no answer of their own.
    The canonical place without a block is the last non-empty line, an end-of-turn token dropped.

    >>> read_answer("7 - 2 = 5\nThe final answer is 5.", "5"), read_answer("The final answer is 4 + 5.", "9")
    (('5', 'The final answer is 5.'), ('5', 'The final answer is 4 + 5.'))
    >>> read_answer("Sorted in 2 steps:\napple, banana", "apple, banana")
    ('apple, banana', 'apple, banana')
    """
    from reasoning_gym.utils import extract_answer

    from rlvr.rewards.answers import final_answer, last_number
    from rlvr.rewards.scoring import canonical_answer

    block = extract_answer(completion)
    if block is not None:
        return block, block
    canonical = canonical_answer("gsm8k", completion) or ""  # the rule of every reward but boxed: the last line
    if not _numeric(truth):
        return canonical, canonical
    stated = final_answer(completion)
    if stated is not None and re.search(rf"(?<![\d.,]){re.escape(stated)}(?![\d])", completion):
        return stated, canonical
    return last_number(completion) or canonical, canonical


def score(sample: Sample) -> RewardOutput:
    """The task's own score of the completion's answer (`read_answer`); strict when its canonical
    place alone scores 1."""
    row = sample.columns.get(COLUMN)
    if not isinstance(row, str):
        raise ValueError(f"the sample has no {COLUMN!r} column (the reasoning_gym reward scores its own "
                         "problems, which carry it)")
    data = json.loads(row)
    answer, canonical = read_answer(sample.completion[-MAX_COMPLETION_CHARS:], data["entry"].get("answer"))
    if not answer:  # nothing to read (some scorers do not take an empty answer)
        return RewardOutput(score=0.0, extracted_answer="")
    scorer = _scorer(data["spec"])
    value = float(scorer(answer, data["entry"]))
    strict = value == 1.0 and (canonical == answer or float(scorer(canonical, data["entry"])) == 1.0)
    return RewardOutput(score=value, strict=strict, extracted_answer=answer)


REWARD = RewardDefinition(
    key=KEY,
    display_name="reasoning-gym task",
    description=f"{len(TASK_NAMES)} procedural tasks of reasoning-gym, generated offline from the seed: the "
                "Dataset field names the task (options after ?); each task's own scorer grades the answer.",
    needs_dataset=True,
    columns=(COLUMN,),
    dataset_names=TASK_NAMES,
    default_benchmark=KEY,
    benchmark_display_name="reasoning-gym held-out",
    instruction=DEFAULT_INSTRUCTION,
    heldout_size=HELDOUT_SIZE,
    score=score,
    warm_up=warm_up,
    problems=lambda dataset, data_roots: ReasoningGymTask(dataset),
    order=5,
)
