"""Stacking adapters (services/trainer/job/stacking.py): base + s1 B1 A1 + s2 B2 A2 written as ONE PEFT adapter.

The pure part is checked on random tensors (the combined update equals the sum of the two, every
feature that cannot be stacked is refused by name). The rest uses real models: the trainer's own
policy for a stacked job (`policy.load_policy`: the init adapter merged into the base, a fresh peft
adapter on top, both with random non-zero B) against `PeftModel.from_pretrained(base, combined)`
written by the trainer's save path; and the combined adapter served by the rollout core (the
transformers fallback, and the real vLLM engine) against peft, reusing test_rollout_core's fixtures.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

# The rollout core's own fixtures and helpers: the same engine start and peft reference as its tests.
from test_rollout_core import core, greedy, make_lora, model_dir, reference_greedy, upload  # noqa: F401

from rlvr.adapters import base_linear_shapes
from rlvr.services.rollout.adapter_registry import check_adapter_files
from rlvr.services.trainer.job import artifacts, stacking
from rlvr.services.trainer.job.config import job_config
from rlvr.services.trainer.job.policy import load_policy, read_init_adapter
from rlvr.services.trainer.job.stacking import Adapter, StackingError

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/fixtures_trainer.py

# Max |logit difference| between the stacked policy and the published adapter, in float32. They
# differ by float32 rounding only (other groupings of the same products): 1.7e-5 measured here on
# rlvr-tiny-test with adapters that move the logits by about 3, and 1.5e-5 already between the
# published adapter and the two adapters applied side by side by peft (neither merged). The unit
# tests above show the combined update itself equals the sum to 1e-6.
LOGIT_TOLERANCE = 5e-5


# ------------------------------------------------------------------------------------------- no model
SHAPES = {  # module -> (in_features, out_features), names as in a Qwen2 model
    f"model.layers.{i}.{m}": shape
    for i in range(2)
    for m, shape in {"self_attn.q_proj": (16, 16), "self_attn.k_proj": (16, 8), "self_attn.v_proj": (16, 8),
                     "mlp.down_proj": (24, 16)}.items()
}


def _adapter(seed: int, r: int, alpha: float, modules: list[str] | None = None, **config: Any) -> Adapter:
    """A random LoRA (B != 0) in PEFT's saved form; `rank_pattern` sizes the tensors like peft does."""
    generator = torch.Generator().manual_seed(seed)
    modules = modules or sorted(SHAPES)
    cfg = {"peft_type": "LORA", "r": r, "lora_alpha": alpha, "target_modules": sorted({m.rsplit(".", 1)[-1] for m in modules}),
           "bias": "none", "use_rslora": False, "rank_pattern": {}, "alpha_pattern": {}, "task_type": "CAUSAL_LM",
           "base_model_name_or_path": f"base-{seed}"} | config
    tensors = {}
    for module in modules:
        rank, _ = stacking.module_scaling(cfg, module)
        n_in, n_out = SHAPES[module]
        tensors[f"base_model.model.{module}.lora_A.weight"] = torch.randn(rank, n_in, generator=generator)
        tensors[f"base_model.model.{module}.lora_B.weight"] = torch.randn(n_out, rank, generator=generator)
    return Adapter(cfg, tensors)


def _assert_sum(combined: Adapter, *parts: Adapter) -> None:
    want: dict[str, torch.Tensor] = {}
    for part in parts:
        for module, delta in stacking.delta_weights(part).items():
            want[module] = want.get(module, 0) + delta
    got = stacking.delta_weights(combined)
    assert set(got) == set(want)
    for module, delta in want.items():
        torch.testing.assert_close(got[module], delta, rtol=1e-6, atol=1e-6, msg=module)


def test_combined_update_is_the_sum_of_both() -> None:
    first = _adapter(1, r=4, alpha=16, use_rslora=True)
    second = _adapter(2, r=8, alpha=8, rank_pattern={"q_proj": 2}, alpha_pattern={"v_proj": 5})
    assert stacking.module_scaling(first.config, "model.layers.0.mlp.down_proj") == (4, 8.0)  # 16 / sqrt(4)
    assert stacking.module_scaling(second.config, "model.layers.1.self_attn.q_proj") == (2, 4.0)
    assert stacking.module_scaling(second.config, "model.layers.1.self_attn.v_proj") == (8, 5 / 8)
    combined = stacking.combine(first, second)
    _assert_sum(combined, first, second)
    config = combined.config
    # One rank everywhere, scaling 1: q_proj (4 + 2) is zero-padded to 4 + 8.
    assert (config["r"], config["lora_alpha"], config["use_rslora"]) == (12, 12, False)
    assert config["rank_pattern"] == {} and config["alpha_pattern"] == {}
    assert config["base_model_name_or_path"] == "base-2"  # the second (the trained) adapter's config
    q = "base_model.model.model.layers.0.self_attn.q_proj"
    assert combined.tensors[f"{q}.lora_A.weight"].shape == (12, 16)
    assert torch.equal(combined.tensors[f"{q}.lora_A.weight"][:4], first.tensors[f"{q}.lora_A.weight"])
    assert not combined.tensors[f"{q}.lora_A.weight"][6:].any() and not combined.tensors[f"{q}.lora_B.weight"][:, 6:].any()
    assert torch.allclose(combined.tensors[f"{q}.lora_B.weight"][:, :4], first.tensors[f"{q}.lora_B.weight"] * 8)


def test_stacking_three_times_keeps_adding() -> None:
    parts = [_adapter(seed, r=2, alpha=seed + 1) for seed in (1, 2, 3)]
    combined = stacking.combine(stacking.combine(parts[0], parts[1]), parts[2])
    assert (combined.rank, combined.config["lora_alpha"]) == (6, 6)
    _assert_sum(combined, *parts)


def test_modules_of_one_adapter_get_only_its_block() -> None:
    qv = [m for m in SHAPES if m.endswith(("q_proj", "v_proj"))]
    qk = [m for m in SHAPES if m.endswith(("q_proj", "k_proj"))]
    first, second = _adapter(1, r=4, alpha=8, modules=qv), _adapter(2, r=2, alpha=2, modules=qk)
    combined = stacking.combine(first, second)
    _assert_sum(combined, first, second)
    assert combined.config["target_modules"] == ["k_proj", "q_proj", "v_proj"]
    assert combined.rank == 6
    k = "base_model.model.model.layers.0.self_attn.k_proj"
    assert not combined.tensors[f"{k}.lora_A.weight"][2:].any()  # k_proj: the second adapter's 2 rows, then 0


def test_combined_adapter_passes_the_rollout_servers_checks(tmp_path: Path) -> None:
    combined = stacking.combine(_adapter(1, r=4, alpha=16, use_rslora=True),
                                _adapter(2, r=4, alpha=8, rank_pattern={"down_proj": 2}))
    stacking.write_adapter(combined, tmp_path)
    assert check_adapter_files(upload(tmp_path), SHAPES, max_lora_rank=8) == 8
    again = stacking.read_adapter(tmp_path)
    assert again.config == combined.config
    assert all(torch.equal(again.tensors[k], v) for k, v in combined.tensors.items())


def _with(adapter: Adapter, **config: Any) -> Adapter:
    return Adapter(adapter.config | config, adapter.tensors)


def _drop(adapter: Adapter, suffix: str) -> Adapter:
    return Adapter(adapter.config, {k: v for k, v in adapter.tensors.items() if not k.endswith(suffix)})


def _extra(adapter: Adapter, key: str) -> Adapter:
    return Adapter(adapter.config, adapter.tensors | {key: torch.zeros(2, 2)})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: _with(a, use_dora=True), "uses DoRA"),
        (lambda a: _with(a, bias="lora_only"), "trains biases"),
        (lambda a: _with(a, lora_bias=True), "uses a LoRA bias"),
        (lambda a: _with(a, modules_to_save=["lm_head"]), "modules_to_save"),
        (lambda a: _with(a, trainable_token_indices=[1, 2]), "trainable tokens"),
        (lambda a: _with(a, fan_in_fan_out=True), "fan_in_fan_out"),
        (lambda a: _with(a, peft_type="IA3"), "not a LoRA adapter"),
        (lambda a: _with(a, init_lora_weights="pissa_niter_4"), "rewrites the base weights"),
        (lambda a: _with(a, target_modules=".*q_proj"), "one is a regex"),
        (lambda a: _with(a, layers_to_transform=[0]), "differ in layers_to_transform"),
        (lambda a: _with(a, r=8), "config gives it rank 8"),
        (lambda a: _drop(a, "layers.0.self_attn.q_proj.lora_B.weight"), "lora_A but not both"),
        (lambda a: _extra(a, "base_model.model.model.embed_tokens.lora_embedding_A"), "not a LoRA A/B weight"),
        (lambda a: _extra(a, "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector"),
         "not a LoRA A/B weight"),
    ],
)
def test_what_cannot_be_stacked_is_refused_by_name(change: Any, message: str) -> None:
    with pytest.raises(StackingError, match=message):
        stacking.combine(_adapter(1, r=4, alpha=8), change(_adapter(2, r=4, alpha=8)))


def test_adapters_of_different_models_are_refused() -> None:
    other = _adapter(2, r=4, alpha=8)
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    other.tensors[key] = torch.randn(4, 32)
    with pytest.raises(StackingError, match="different shapes .* different base models"):
        stacking.combine(_adapter(1, r=4, alpha=8), other)


def test_a_folder_without_safetensors_is_refused(tmp_path: Path) -> None:
    (tmp_path / "adapter_config.json").write_text("{}")
    (tmp_path / "adapter_model.bin").write_bytes(b"pickle")
    with pytest.raises(StackingError, match="no adapter_model.safetensors"):
        stacking.read_adapter(tmp_path)


# ------------------------------------------------------------------------------------------ real models


def random_lora(base: str | Path, out: Path, seed: int, std: float = 0.3, **config: Any) -> Path:
    """A PEFT LoRA on every linear layer with seeded random non-zero B, saved as peft saves it."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                           LoraConfig(target_modules="all-linear", task_type="CAUSAL_LM", **config))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=std)
    model.save_pretrained(out)
    return out


def _randomize_b(model: Any, seed: int, std: float = 0.3) -> None:
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name and ".default." in name:
                param.normal_(std=std)


def _peft(base: str, adapter: Path) -> Any:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), str(adapter)).eval()


def prompt_ids(tokenizer: Any) -> torch.Tensor:
    from rlvr.tasks import get_task, render_prompt

    problems = get_task("math_pairs").prompts(8, seed=0, split="train")[:3]
    ids = [tokenizer(render_prompt(tokenizer, p), add_special_tokens=False)["input_ids"] for p in problems]
    width = min(len(i) for i in ids)
    return torch.tensor([i[:width] for i in ids])


def _greedy(model: Any, ids: torch.Tensor) -> list[list[int]]:
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                             pad_token_id=0, eos_token_id=None)
    return out[:, ids.shape[1]:].tolist()


def max_logit_difference(a: Any, b: Any, ids: torch.Tensor) -> float:
    with torch.no_grad():
        return (a(input_ids=ids).logits - b(input_ids=ids).logits).abs().max().item()


def assert_same_policy(policy: Any, published: Any, ids: torch.Tensor) -> None:
    """Identical greedy tokens, and logits (on the prompts and those tokens) within LOGIT_TOLERANCE."""
    tokens = _greedy(policy, ids)
    assert _greedy(published, ids) == tokens
    full = torch.cat([ids, torch.tensor(tokens)], dim=1)
    assert max_logit_difference(policy, published, full) <= LOGIT_TOLERANCE


@pytest.mark.parametrize(
    "init_config",
    [dict(r=4, lora_alpha=16, use_rslora=True),
     dict(r=4, lora_alpha=16, rank_pattern={"q_proj": 2}, alpha_pattern={"down_proj": 3})],
    ids=["rslora", "patterns"],
)
def test_published_adapter_is_the_stacked_policy(tmp_path: Path, tiny_model: str, init_config: dict) -> None:
    """base + init (merged) + a fresh adapter with random B, exactly as the trainer builds and
    saves it, equals PeftModel.from_pretrained(base, published) on the original base."""
    init_dir = random_lora(tiny_model, tmp_path / "init", seed=1, **init_config)
    job = job_config(job_id="stack", base_model=tiny_model, artifact_root=tmp_path, lora_rank=8, lora_alpha=4,
                    init_adapter_path=str(init_dir))
    init = read_init_adapter(job)
    policy, tokenizer = load_policy(job, tiny_model, "cpu")
    _randomize_b(policy, seed=2)
    policy.eval()
    out = artifacts.save_adapter(policy, tmp_path / "published", stack_on=init)

    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["use_rslora"]) == (12, 12, False)
    assert check_adapter_files(upload(out), base_linear_shapes(tiny_model), max_lora_rank=12) == 12
    published = _peft(tiny_model, out)
    ids = prompt_ids(tokenizer)
    assert_same_policy(policy, published, ids)
    # Both parts matter: neither the init adapter alone nor the new one alone is that policy.
    assert _greedy(_peft(tiny_model, init_dir), ids) != _greedy(policy, ids)
    with policy.disable_adapter():  # the merged base: base + init
        assert _greedy(policy, ids) != _greedy(published, ids)


# ------------------------------------------------------------------------------------------ rollout
# The vLLM case starts an engine of its own (about 40 s of a 2-core host), for the one test: it runs
# in `make test-all`; the transformers case keeps the combined adapter's serving in `make test`.
@pytest.mark.parametrize("core", ["transformers", pytest.param("vllm", marks=[pytest.mark.vllm, pytest.mark.slow])],
                         indirect=True)
async def test_rollout_engine_serves_the_combined_adapter_as_peft_does(core, model_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    """On both rollout backends (`core` runs the real vLLM engine under the vllm mark): the
    combined adapter is one LoRA module there and generates peft's greedy tokens."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    first = make_lora(model_dir, tmp_path / "first", seed=21, r=4)
    second = make_lora(model_dir, tmp_path / "second", seed=22, r=4)
    config = json.loads((second / "adapter_config.json").read_text())  # another scaling: rsLoRA, alpha 3
    (second / "adapter_config.json").write_text(json.dumps(config | {"use_rslora": True, "lora_alpha": 3}))
    combined = stacking.combine(stacking.read_adapter(first), stacking.read_adapter(second))
    assert combined.rank == 8 and math.isclose(stacking.module_scaling(combined.config, "x")[1], 1.0)
    stacking.write_adapter(combined, tmp_path / "combined")

    prompt = core.render_chat([{"role": "user", "content": "What is 12+7?"}])
    await core.load_adapter("stacked", 1, upload(tmp_path / "combined"))
    served = (await greedy(core, prompt, "stacked")).completions[0]
    assert (served.adapter_name, served.adapter_version) == ("stacked", 1)
    assert served.token_ids == reference_greedy(model_dir, tmp_path / "combined", prompt, 24)
    # ... which is the stacked policy: `first` merged into the base, `second` as a peft adapter.
    merged = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), str(first)).merge_and_unload()
    stacked = PeftModel.from_pretrained(merged, str(second)).eval()
    ids = torch.tensor([prompt])
    assert _greedy(stacked, ids)[0][: len(served.token_ids)] == served.token_ids
    assert served.token_ids != reference_greedy(model_dir, first, prompt, 24)
