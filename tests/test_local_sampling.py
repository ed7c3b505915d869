"""The transformers backend's in-process sampler (rollouts.LocalGenerator, SeededSampler): one batched
`generate` call per step whose completions do not depend on how the step's batch is split across
processes, drawn from softmax(logits / temperature)."""

from __future__ import annotations

from typing import Any

import pytest

from rlvr.peers.types import BASE_MODEL, Sampling

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/fixtures_trainer.py

GROUP = 4
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def policy(tiny_model: str) -> tuple[Any, Any, list[int]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    eos = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id]
    return model, tokenizer, eos


def _prompts(tokenizer: Any) -> list[list[int]]:
    # Short prompts first and long ones last: each half of the batch is left-padded to another width
    # than the whole batch is, so the split changes every row's padding.
    texts = [f"{a}+{b}=" for a, b in [(1, 2), (3, 4), (12, 5), (7, 80)]]
    texts += [f"What is {a} + {b}? Answer in <answer></answer>." for a, b in [(123, 4567), (89, 10), (5, 6), (42, 4242)]]
    return [tokenizer(text)["input_ids"] for text in texts]


def _generate(policy: tuple[Any, Any, list[int]], prompts: list[list[int]], seed: int | None,
              offset: int = 0, temperature: float = 1.0, **controls: Any) -> Any:
    from rlvr.services.trainer.job.rollouts import LocalGenerator

    model, tokenizer, eos = policy
    generator = LocalGenerator(tokenizer, eos, prompt_offset=offset)
    generator.bind(model)
    sampling = Sampling(temperature=temperature, max_tokens=MAX_TOKENS, seed=seed, group_size=GROUP, **controls)
    return generator.generate(prompts, sampling, BASE_MODEL)


def test_a_seeded_batch_samples_the_same_completions_whole_split_or_one_prompt_at_a_time(
        policy: tuple[Any, Any, list[int]]) -> None:
    prompts = _prompts(policy[1])
    assert len({len(p) for p in prompts[:4]}) < len({len(p) for p in prompts}), "the halves pad differently"
    whole = _generate(policy, prompts, seed=11)
    halves = [_generate(policy, prompts[:4], seed=11), _generate(policy, prompts[4:], seed=11, offset=4)]
    singles = [_generate(policy, [p], seed=11, offset=i) for i, p in enumerate(prompts)]

    assert len(whole.completion_ids) == len(prompts) * GROUP
    assert whole.prompt_ids == [p for p in prompts for _ in range(GROUP)]
    assert whole.completion_ids == halves[0].completion_ids + halves[1].completion_ids
    assert whole.clipped == halves[0].clipped + halves[1].clipped
    assert whole.completion_ids == [c for batch in singles for c in batch.completion_ids]
    # Rows that stopped early (and were padded while others went on) are part of what agreed.
    assert any(not cut for cut in whole.clipped) and any(whole.clipped), whole.clipped
    # The rows of a group are different samples, not copies.
    assert len({tuple(c) for c in whole.completion_ids[:GROUP]}) > 1, whole.completion_ids[:GROUP]


def test_a_models_own_generation_config_does_not_bend_the_samples(policy: tuple[Any, Any, list[int]]) -> None:
    """A hub model's generation_config may carry a repetition penalty (Qwen2.5-Instruct: 1.05) or
    an n-gram ban; transformers applies such fields unless the call sets them. The loss scores the
    plain tempered softmax, so the sampler must not apply them: the completions are the same."""
    model, tokenizer, _ = policy
    prompts = _prompts(tokenizer)
    plain = _generate(policy, prompts, seed=11).completion_ids
    saved = model.generation_config
    bent = saved.__class__(**saved.to_dict())
    bent.repetition_penalty, bent.no_repeat_ngram_size, bent.min_new_tokens = 50.0, 1, MAX_TOKENS
    model.generation_config = bent
    try:
        assert _generate(policy, prompts, seed=11).completion_ids == plain
    finally:
        model.generation_config = saved


def test_other_seeds_or_offsets_sample_other_completions(policy: tuple[Any, Any, list[int]]) -> None:
    prompts = _prompts(policy[1])
    first = _generate(policy, prompts, seed=11).completion_ids
    assert _generate(policy, prompts, seed=11).completion_ids == first
    assert _generate(policy, prompts, seed=12).completion_ids != first
    # The second half sampled as if it were the first half of the step gets other completions.
    assert _generate(policy, prompts[4:], seed=11).completion_ids != first[4 * GROUP:]


def test_unseeded_sampling_follows_torchs_global_seed(policy: tuple[Any, Any, list[int]]) -> None:
    import torch

    prompts = _prompts(policy[1])
    torch.manual_seed(5)
    first = _generate(policy, prompts, seed=None).completion_ids
    second = _generate(policy, prompts, seed=None).completion_ids
    torch.manual_seed(5)
    assert _generate(policy, prompts, seed=None).completion_ids == first
    assert second != first


def test_zero_temperature_is_greedy(policy: tuple[Any, Any, list[int]]) -> None:
    prompts = _prompts(policy[1])
    batch = _generate(policy, prompts, seed=11, temperature=0.0)
    for i in range(len(prompts)):  # every row of a group the same, whatever the seed
        assert len({tuple(c) for c in batch.completion_ids[i * GROUP:(i + 1) * GROUP]}) == 1
    assert _generate(policy, prompts, seed=12, temperature=0.0).completion_ids == batch.completion_ids


def _draw_counts(logits: Any, temperature: float, steps: int, **controls: Any) -> Any:
    """How often SeededSampler picks each token of `logits` over `steps` decoding steps, each a batch of
    40 prompts x a group of 6 rows, fixed seeds (the prompts' indices)."""
    import torch

    from rlvr.services.trainer.job.rollouts import SeededSampler

    prompts, group = 40, 6
    sampler = SeededSampler(list(range(prompts)), Sampling(temperature=temperature, group_size=group, **controls),
                            torch.device("cpu"))
    scores = logits.repeat(prompts * group, 1)
    counts = torch.zeros(len(logits))
    for _ in range(steps):
        picked = torch.argmax(sampler(torch.zeros((prompts * group, 1), dtype=torch.long), scores.clone()), dim=-1)
        counts += torch.bincount(picked, minlength=len(logits)).float()
    return counts


@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.7])
def test_the_sampler_draws_from_softmax_of_logits_over_temperature(temperature: float) -> None:
    """Token frequencies over 48,000 draws of a fixed 5-token distribution (one token masked to -inf)
    against softmax(logits / T), fixed seeds: 0.01 is over 4 sigma for every token here, while the
    three temperatures' distributions are at least 0.10 apart on some token."""
    import torch


    logits = torch.tensor([0.0, 1.0, 2.0, 2.5, float("-inf")])
    counts = _draw_counts(logits, temperature, steps=200)
    frequencies = counts / counts.sum()
    expected = torch.softmax(logits / temperature, dim=-1)
    assert counts[-1] == 0  # a masked token is never drawn
    assert torch.allclose(frequencies, expected, atol=0.01), (frequencies, expected)
    for other in {0.5, 1.0, 1.7} - {temperature}:  # the bound tells the temperatures apart
        assert (torch.softmax(logits / other, dim=-1) - frequencies).abs().max() > 0.08


def test_top_k_1_samples_the_greedy_completions(policy: tuple[Any, Any, list[int]]) -> None:
    prompts = _prompts(policy[1])
    greedy = _generate(policy, prompts, seed=11, temperature=0.0).completion_ids
    assert _generate(policy, prompts, seed=11, temperature=1.5, top_k=1).completion_ids == greedy
    assert _generate(policy, prompts, seed=11, temperature=1.5).completion_ids != greedy


def test_the_repetition_penalty_reads_each_rows_own_tokens_as_transformers_and_vllm_do(
        policy: tuple[Any, Any, list[int]]) -> None:
    """Greedy with a penalty, the batch left-padded, against transformers' own RepetitionPenalty
    processor one unpadded prompt at a time (the rule vLLM's is: tests/test_rollout_core.py): the
    padding is not penalized, and the completions do change."""
    import torch

    model, tokenizer, eos = policy
    prompts = _prompts(tokenizer)
    penalized = _generate(policy, prompts, seed=11, temperature=0.0, repetition_penalty=1.8).completion_ids
    assert penalized != _generate(policy, prompts, seed=11, temperature=0.0).completion_ids
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            out = model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False,
                                 repetition_penalty=1.8, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
        reference = out[0, len(prompt):].tolist()
        stop = next((j for j, t in enumerate(reference) if t in eos), None)
        assert penalized[i * GROUP] == (reference if stop is None else reference[:stop + 1]), i


@pytest.mark.parametrize("controls", [{"top_k": 3}, {"top_p": 0.7}, {"min_p": 0.1}, {"top_k": 3, "top_p": 0.85}])
def test_the_sampler_draws_only_from_the_kept_tokens_in_their_proportions(controls: dict[str, Any]) -> None:
    """As above, with the sampling controls: the kept set and its renormalised mass computed here
    from the tempered probabilities (vLLM's rules: min_p, then top_k, then the top-p nucleus)."""
    import torch


    logits = torch.tensor([0.0, 1.0, 2.0, 2.5, float("-inf")])
    probs = torch.softmax(logits / 0.8, dim=-1)
    keep = probs >= controls.get("min_p", 0.0) * probs.max()
    if "top_k" in controls:
        keep &= probs >= probs.topk(controls["top_k"]).values[-1]
    kept = probs * keep / (probs * keep).sum()
    ordered, order = kept.sort(descending=True)
    keep[order] &= ordered.cumsum(0) - ordered < controls.get("top_p", 1.0)
    expected = kept * keep / (kept * keep).sum()
    counts = _draw_counts(logits, 0.8, steps=100, **controls)
    assert bool((counts[~keep] == 0).all()), (counts, keep)
    assert torch.allclose(counts / counts.sum(), expected, atol=0.015), (counts / counts.sum(), expected)
