"""The reward registry: every reward found through one entry-point group, the built-ins included; a
broken plugin left out with its error; a job's rewards combined with weights; every fault of a reward
a score of 0 with a reason; and the job spec's reward fields checked against a catalog."""

from __future__ import annotations

import math

import pytest

from rlvr.common.errors import FailedPrecondition, InvalidArgument
from rlvr.jobspec import resolve_spec
from rlvr.rewards import RewardDefinition, RewardOutput, Sample, reward
from rlvr.rewards.combine import TermError, combine, normalize, score_samples
from rlvr.rewards.registry import BUILTIN_DISTRIBUTION, discover, load_registry
from rlvr.v1 import common_pb2 as C


def test_the_builtins_come_through_the_entry_point_group_in_the_specs_order(checkout_entry_points) -> None:
    from importlib import metadata

    registry = discover()
    ours = [e for e in metadata.entry_points(group="rlvr.rewards") if e.dist.metadata["Name"] == BUILTIN_DISTRIBUTION]
    assert {e.name for e in ours} == {"math_pairs", "gsm8k", "boxed", "code", "guess_number", "reasoning_gym"}
    infos = registry.infos()
    assert [i.key for i in infos] == ["math_pairs", "gsm8k", "boxed", "code", "guess_number", "reasoning_gym"]
    math_pairs = registry.get("math_pairs")
    assert (math_pairs.display_name, math_pairs.needs_dataset, math_pairs.benchmark, math_pairs.heldout_size) == \
        ("Math Pairs (synthetic)", False, "rlvr-math-pairs-heldout", 500)
    assert registry.get("boxed").needs_dataset and "\\boxed" in registry.get("boxed").instruction
    assert registry.get("gsm8k").splits == ("train", "test") and all(i.source == "built-in" for i in infos)


def test_plugins_load_and_a_broken_one_is_left_out_with_its_error(faulty_plugins) -> None:
    registry = load_registry()
    assert {"hangs", "raises", "nan", "length", "slow_async", "labelled"} <= set(registry.rewards)
    assert registry.get("hangs").source == "plugin rlvr-test-faulty 0.1"
    assert "ImportError: this plugin needs a library that is not installed" in registry.failed["broken"]
    assert "is a function, not a RewardDefinition" in registry.failed["not_declared"]
    assert "declares the reward key 'hangs'; they must match" in registry.failed["math_pairs_again"]
    with pytest.raises(LookupError, match="reward 'broken' could not be loaded: plugin rlvr-test-faulty"):
        registry.get("broken")
    with pytest.raises(LookupError, match="'nope' is not a reward; known: "):
        registry.get("nope")
    only = discover(allowed=["hangs"])  # the reward service's `plugins` setting
    assert "hangs" in only.rewards and "nan" not in only.rewards and "math_pairs" in only.rewards
    assert only.failed["nan"].startswith("not allowed by the reward service's settings (plugins: hangs)")


def test_a_reward_declaration_is_checked_when_made() -> None:
    with pytest.raises(ValueError) as err:
        RewardDefinition(key="Bad Key", display_name=" ", needs_dataset=False)
    text = str(err.value)
    assert "key 'Bad Key' is not allowed" in text and "give exactly one of score" in text
    assert "display_name is empty" in text and "must say where its prompts come from" in text

    @reward("my_check", columns=("label",))
    def my_check(sample: Sample) -> float:
        """Checks the label.

        More words."""
        return 1.0

    assert (my_check.key, my_check.display_name, my_check.description, my_check.columns) == \
        ("my_check", "My check", "Checks the label.", ("label",))
    assert my_check.needs_dataset and not my_check.is_async and my_check.benchmark == "my_check"


@pytest.mark.parametrize(("value", "expected"), [
    (1, RewardOutput(1.0)), (0.25, RewardOutput(0.25)),
    ({"accuracy": 1.0, "format": 0.0}, RewardOutput(0.5, {"accuracy": 1.0, "format": 0.0})),  # mean
    ({"score": 0.9, "part": 0.1}, RewardOutput(0.9, {"score": 0.9, "part": 0.1})),  # a named score wins
    (RewardOutput(1.0, strict=False), RewardOutput(1.0, strict=False)),
])
def test_what_a_reward_may_return(value: object, expected: RewardOutput) -> None:
    assert normalize(value) == expected


@pytest.mark.parametrize(("value", "message"), [
    (math.nan, "score nan is not in [0, 1]"), (1.5, "score 1.5 is not in [0, 1]"), (-0.1, "is not in [0, 1]"),
    ("yes", "score is str 'yes', not a number"), (True, "score is bool"), (None, "score is NoneType"),
    ({}, "no components returned"), ({"a": 2.0}, "component 'a' 2.0 is not in [0, 1]"),
    (RewardOutput(math.inf), "score inf is not in [0, 1]"),
])
def test_garbage_from_a_reward_is_refused_with_what_is_wrong(value: object, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message.replace("[", r"\[").replace("]", r"\]")):
        normalize(value)


def test_rewards_combine_with_their_weights_and_the_accuracy_term() -> None:
    right = "<think>t</think><answer>7</answer>"
    results = {"gsm8k": RewardOutput(1.0, strict=True, extracted_answer="7"), "length": RewardOutput(0.4, {"x": 0.5})}
    scored = combine([("gsm8k", 1.0), ("length", 0.5)], results, right, format_bonus=True, format_weight=0.1)
    assert scored.reward == pytest.approx(1.0 + 0.5 * 0.4 + 0.1) and scored.accuracy == 1.0 and scored.strict
    assert scored.components == {"gsm8k": 1.0, "length": 0.4, "length.x": 0.5} and scored.format == 1.0
    by_length = combine([("gsm8k", 1.0), ("length", 0.5)], results, right, accuracy_key="length")
    assert by_length.accuracy == 0.4 and not by_length.strict and by_length.extracted_answer is None
    failed = combine([("gsm8k", 1.0), ("length", 0.5)], {**results, "length": TermError("length: ValueError: x")}, right)
    assert (failed.reward, failed.accuracy, failed.format, failed.error) == (0.0, 0.0, 0.0, "length: ValueError: x")


def test_in_process_scoring_turns_every_fault_into_a_reason(faulty_plugins) -> None:
    registry = load_registry()
    samples = [Sample("BOOM"), Sample("fine")]
    raises = score_samples([(registry.get("raises"), 1.0)], samples)
    assert [r.error for r in raises] == ["raises: ValueError: the checker cannot parse this", ""]
    assert raises[1].accuracy == 1.0
    short = score_samples([(registry.get("short_batch"), 1.0)], samples)
    assert [r.error for r in short] == ["short_batch: ValueError: returned 1 scores for 2 completions"] * 2
    slow = score_samples([(registry.get("slow_async"), 1.0)], [Sample("7", "7")])
    assert slow[0].accuracy == 1.0  # an async reward, awaited
    labelled = score_samples([(registry.get("labelled"), 1.0)], [Sample("a", "x", columns={"label": "a"})])
    assert labelled[0].components == {"labelled": 1.0, "labelled.exact": 1.0, "labelled.score": 1.0}


def _spec(**reward: object) -> C.JobSpec:
    return C.JobSpec(reward=C.RewardConfig(**reward))


def test_a_jobs_reward_by_key_beside_the_enum() -> None:
    by_enum = resolve_spec(_spec(function=C.REWARD_FUNCTION_GSM8K)).spec.reward
    by_key = resolve_spec(_spec(key="gsm8k")).spec.reward
    assert by_enum == by_key and by_key.function == C.REWARD_FUNCTION_GSM8K and by_key.key == "gsm8k"
    assert [(t.key, t.weight) for t in by_key.terms] == [("gsm8k", 1.0)] and by_key.accuracy_key == "gsm8k"
    default = resolve_spec(C.JobSpec())
    assert default.spec.reward.key == "math_pairs" and default.summary.reward == "Math Pairs (synthetic)"
    with pytest.raises(InvalidArgument, match="reward.key: 'boxed' disagrees with reward.function"):
        resolve_spec(_spec(function=C.REWARD_FUNCTION_GSM8K, key="boxed"))
    with pytest.raises(InvalidArgument, match=r"reward.key: 'Not A Key' is not a reward key \(lower-case"):
        resolve_spec(_spec(key="Not A Key"))


def test_a_reward_the_catalog_lacks_or_could_not_load_is_refused(faulty_plugins) -> None:
    catalog = load_registry().catalog()
    with pytest.raises(InvalidArgument) as err:
        resolve_spec(_spec(key="nope", dataset="d.jsonl"), catalog=catalog)
    assert str(err.value).startswith("reward.key: 'nope' is not a reward the reward service has; known: math_pairs, "
                                     "gsm8k, boxed")
    with pytest.raises(FailedPrecondition, match="reward.key: reward 'broken' could not be loaded: .*ImportError"):
        resolve_spec(_spec(key="broken", dataset="d.jsonl"), catalog=catalog)
    # without a catalog (the trainer's re-check), a key this process lacks is left to the reward service
    assert resolve_spec(_spec(key="only_over_there", dataset="d.jsonl")).spec.reward.key == "only_over_there"
    with pytest.raises(InvalidArgument, match=r"reward.dataset: required for Labelled \(a Hugging Face .*, label columns"):
        resolve_spec(_spec(key="labelled"), catalog=catalog)


def test_a_combined_rewards_title_names_every_term_in_one_form() -> None:
    """The Training Summary's Reward: every term by its display name where the process knows them
    all, else every term by its key (a plugin or remote reward the scheduler lacks), never a mix."""
    from rlvr.jobspec import reward_title
    from rlvr.rewards.registry import Catalog

    builtins = load_registry().catalog().rewards
    catalog = Catalog({k: builtins[k] for k in ("gsm8k", "boxed")})
    known = C.RewardConfig(terms=[C.RewardTerm(key="gsm8k", weight=1.0), C.RewardTerm(key="boxed", weight=0.5)])
    assert reward_title(known, catalog) == "GSM8K accuracy + 0.5 x " + builtins["boxed"].display_name
    mixed = C.RewardConfig(terms=[C.RewardTerm(key="gsm8k", weight=1.0), C.RewardTerm(key="judge", weight=0.5),
                                  C.RewardTerm(key="boxed", weight=2.0)])
    assert reward_title(mixed, catalog) == "gsm8k + 0.5 x judge + 2 x boxed"
    assert reward_title(C.RewardConfig(key="judge"), catalog) == "judge"


def test_several_rewards_weights_keys_and_the_accuracy_key(faulty_plugins) -> None:
    catalog = load_registry().catalog()
    terms = [C.RewardTerm(key="gsm8k"), C.RewardTerm(key="length", weight=0.25)]
    resolved = resolve_spec(_spec(terms=terms, accuracy_key="length"), catalog=catalog)
    r = resolved.spec.reward
    assert (r.key, r.function, [(t.key, t.weight) for t in r.terms], r.accuracy_key) == \
        ("gsm8k", C.REWARD_FUNCTION_GSM8K, [("gsm8k", 1.0), ("length", 0.25)], "length")
    assert resolved.summary.reward == "GSM8K accuracy + 0.25 x Length"
    cases = [
        (dict(terms=[C.RewardTerm(key="gsm8k"), C.RewardTerm(key="gsm8k")]), "reward.terms[1].key: 'gsm8k' is named twice"),
        (dict(terms=[C.RewardTerm(key="gsm8k", weight=101.0)]), "reward.terms[0].weight: 101.0 is out of range; allowed: "
                                                                 "0 to 100"),
        (dict(terms=[C.RewardTerm(key="gsm8k", weight=0.0)]), "reward.terms: every weight is 0"),
        (dict(key="boxed", terms=[C.RewardTerm(key="gsm8k")]), "reward.key: 'boxed' is not reward.terms[0].key"),
        (dict(terms=terms, accuracy_key="nan"), "reward.accuracy_key: 'nan' is not a key of the job's rewards (gsm8k, "
                                                 "length)"),
        (dict(terms=[C.RewardTerm(key="math_pairs"), C.RewardTerm(key="labelled")]),
         "reward.terms[1].key: 'labelled' reads the column 'label', which Math Pairs (synthetic)'s own prompts"),
        (dict(terms=[C.RewardTerm(key="gsm8k"), C.RewardTerm(key="nope")]), "reward.terms[1].key: 'nope' is not a "
                                                                             "reward the reward service has"),
    ]
    for fields, message in cases:
        with pytest.raises(InvalidArgument) as err:
            resolve_spec(_spec(**fields), catalog=catalog)
        assert str(err.value).startswith(message), (fields, str(err.value))
