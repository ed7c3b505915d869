"""`run_job` in-process on the "test"-size tiny model: a few real GRPO steps through TRL.

What users rely on (TRL's own LoRA tests check the same): the adapter changes, the base weights do
not, every step yields a complete MetricEvent, the final adapter and the checkpoints load with
`peft.PeftModel.from_pretrained`. The vllm-backend flow (adapter pushed after every step, every
completion's version checked) runs against an in-memory twin of the rollout service that samples
from the policy itself and stamps the version it was last sent, so a lost update is observable.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rlvr.peers.types import AdapterTag, Sampling, Score, ScoreInput
from rlvr.services.trainer.job import runner
from rlvr.services.trainer.job.config import JobConfig, job_config
from rlvr.services.trainer.job.rollouts import LocalGenerator, RolloutBatch
from rlvr.services.trainer.job.runner import JobDeps, run_job
from rlvr.services.trainer.job.scorers import LocalScorer, ScoreSettings
from rlvr.v1 import common_pb2 as C

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/fixtures_trainer.py

# MetricEvent's episode metrics: a job with an environment's only (unset at a single-answer step)
EPISODE_METRICS = {"turns_mean", "turns_max", "tool_calls", "tool_errors", "tool_seconds", "observation_tokens_mean",
                   "episode_tokens_mean", "truncated_episodes", "failed_episodes",
                   "episode_splits"}
# a Supervised (SFT) or Head job's only
SFT_METRICS = {"token_accuracy", "tokens_per_second", "heldout_loss", "heldout_f1", "class_f1"}
METRIC_FIELDS = {f.name for f in C.MetricEvent.DESCRIPTOR.fields} - {"kl"} - EPISODE_METRICS - SFT_METRICS  # kl: kl_beta > 0




class ShapedScorer(LocalScorer):
    """The real Math Pairs scorer plus a small length term: the "test" model is rarely right, and
    GRPO only moves the adapter when rewards differ within a group."""

    def score(self, items: Sequence[ScoreInput]) -> list[Score]:
        base = super().score(items)
        return [Score(s.reward + len(i.completion) / 100, s.accuracy, s.format) for s, i in zip(base, items, strict=True)]


def _job(tmp_path: Path, model: str, **overrides: Any) -> JobConfig:
    options: dict[str, Any] = dict(
        job_id="t1", base_model=model, artifact_root=tmp_path, group_size=4, batch_size=8,
        max_completion_tokens=32, lora_rank=4, lora_alpha=64, learning_rate=1e-3, max_steps=3,
        loss_type="dapo", generation_backend="transformers", synthetic_prompts=16,
    )
    options.update(overrides)
    return job_config(**options)


def _scorer() -> ShapedScorer:
    return ShapedScorer(ScoreSettings("math_pairs"))


def _lora_state(model: Any) -> dict[str, Any]:
    return {k: v.detach().clone() for k, v in model.state_dict().items() if "lora_" in k}


def test_grpo_steps_train_the_adapter_only(tmp_path: Path, tiny_model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    captured = _capture_policy(monkeypatch)
    events: list[C.MetricEvent] = []
    steps: list[tuple[int, int]] = []
    job = _job(tmp_path, tiny_model, checkpoint_every=2)
    result = run_job(job, JobDeps(scorer=_scorer(), publish=events.append, on_step=lambda s, t: steps.append((s, t))))

    assert result.status == "completed", result.error
    assert (result.steps_done, result.total_steps, result.adapter_version) == (3, 3, 3)
    assert steps == [(1, 3), (2, 3), (3, 3)]
    assert [e.step for e in events] == [1, 2, 3] and all(e.total_steps == 3 for e in events)
    for event in events:
        present = {f.name for f, _ in event.ListFields()}
        # zero (unset on the wire) on a synchronous step: adapter_version at step 1, policy_lag always
        # The in-process generator reports no sampling logprobs (it samples from the policy itself):
        # no logprob gap, no correction.
        # heldout_accuracy: only at the steps a job with advanced.eval_every evaluates
        assert METRIC_FIELDS - present <= {"adapter_version", "accuracy", "format", "clipped_ratio", "policy_lag",
                                           "heldout_accuracy",
                                           "reward_components", "reward_errors", "logprob_gap", "logprob_gap_max",
                                           "sampler_correction"}, event  # this scorer gives none
        assert event.HasField("entropy") and not event.HasField("kl")
        assert event.step_seconds >= event.generate_seconds + event.score_seconds + event.train_seconds > 0
        assert 0 < event.completion_length_mean <= event.completion_length_max <= 32
        assert event.learning_rate == pytest.approx(1e-3)
    # In-process generation samples from the current policy: version = previous step.
    assert [e.adapter_version for e in events] == [0, 1, 2]

    model = captured["model"]
    after = _lora_state(model)
    assert any(not torch.equal(after[k], v) for k, v in captured["initial_lora"].items()), "adapter unchanged"
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).state_dict()
    trained_base = {k.replace("base_model.model.", "").replace(".base_layer", ""): v
                    for k, v in model.state_dict().items() if "lora_" not in k}
    assert set(base) <= set(trained_base)
    assert all(torch.equal(base[k], trained_base[k]) for k in base), "base weights changed"

    adapter = Path(result.adapter_path)
    assert sorted(p.name for p in adapter.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert (tmp_path / "jobs" / "t1" / "checkpoints" / "step-2" / "adapter_model.safetensors").is_file()
    assert not (tmp_path / "jobs" / "t1" / "checkpoints" / "step-3").exists()
    for path in (adapter, tmp_path / "jobs" / "t1" / "checkpoints" / "step-2"):
        loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), str(path))
        assert any("lora_B" in k and v.abs().sum() > 0 for k, v in loaded.state_dict().items())
    final = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), str(adapter))
    final_lora = {k.replace(".default", ""): v for k, v in final.state_dict().items() if "lora_" in k}
    assert all(torch.equal(final_lora[k.replace(".default", "")], v) for k, v in after.items())


class RolloutTwin:
    """An in-memory rollout service: samples from the policy in-process and stamps every completion
    with the adapter it holds. `drop_version` makes it silently ignore one upload."""

    def __init__(self, model_path: str, served_model: str | None = None, drop_version: int | None = None,
                 max_lora_rank: int = 64) -> None:
        self.address = "twin"
        self.model_path = model_path
        self.served_model = served_model or model_path
        self.max_lora_rank = max_lora_rank
        self.live = AdapterTag("", 0)
        self.uploads: list[AdapterTag] = []
        self.drop_version = drop_version
        self._local: LocalGenerator | None = None

    def bind(self, model: Any) -> None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self._local = LocalGenerator(tokenizer, [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id])
        self._local.bind(model)

    def info(self) -> Any:
        return SimpleNamespace(model=self.served_model, max_lora_rank=self.max_lora_rank)

    def forget(self, name: str) -> None:
        pass

    def generate(self, prompts: Sequence[list[int]], sampling: Sampling, expected: AdapterTag) -> RolloutBatch:
        from rlvr.services.trainer.job.rollouts import check_versions

        assert self._local is not None
        batch = self._local.generate(prompts, sampling, expected)
        check_versions([self.live] * len(batch.completion_ids), expected, step=-1)
        return batch

    def publish_adapter(self, directory: Path, tag: AdapterTag) -> None:
        assert (directory / "adapter_model.safetensors").is_file()
        self.uploads.append(tag)
        if tag.version != self.drop_version:
            self.live = tag

    def close(self) -> None:
        pass


def test_vllm_backend_pushes_every_version_and_checks_it(tmp_path: Path, tiny_model: str) -> None:
    twin = RolloutTwin(tiny_model)
    events: list[C.MetricEvent] = []
    job = _job(tmp_path, tiny_model, generation_backend="vllm")
    result = run_job(job, JobDeps(scorer=_scorer(), publish=events.append, generator=twin))
    assert result.status == "completed", result.error
    assert twin.uploads == [AdapterTag("job-t1", v) for v in (1, 2, 3)]
    assert [e.adapter_version for e in events] == [0, 1, 2]
    assert all(e.sync_seconds > 0 for e in events)


def test_a_lost_adapter_update_fails_the_job_loudly(tmp_path: Path, tiny_model: str) -> None:
    twin = RolloutTwin(tiny_model, drop_version=2)
    events: list[C.MetricEvent] = []
    result = run_job(_job(tmp_path, tiny_model, generation_backend="vllm", max_steps=4),
                     JobDeps(scorer=_scorer(), publish=events.append, generator=twin))
    assert result.status == "failed"
    assert "adapter sync failed" in result.error and "job-t1 v1" in result.error and "expected job-t1 v2" in result.error
    assert "\n" not in result.error
    # Two steps finished before step 3 saw the stale version; their adapter is kept.
    assert [e.step for e in events] == [1, 2] and result.steps_done == 2 and result.adapter_path


def test_rollout_serving_another_base_model_is_refused(tmp_path: Path, tiny_model: str) -> None:
    twin = RolloutTwin(tiny_model, served_model="Qwen/Qwen2.5-0.5B-Instruct")
    result = run_job(_job(tmp_path, tiny_model, generation_backend="vllm"),
                     JobDeps(scorer=_scorer(), publish=lambda e: None, generator=twin))
    assert result.status == "failed" and "serves 'Qwen/Qwen2.5-0.5B-Instruct'" in result.error
    assert result.steps_done == 0 and not result.adapter_path


def test_cancel_between_steps_keeps_the_last_adapter(tmp_path: Path, tiny_model: str) -> None:
    cancel = threading.Event()
    events: list[C.MetricEvent] = []
    deps = JobDeps(scorer=_scorer(), publish=events.append, cancel=cancel, on_step=lambda s, t: cancel.set())
    result = run_job(_job(tmp_path, tiny_model, max_steps=50), deps)
    assert result.status == "cancelled" and result.error == ""
    assert result.steps_done == 1 and len(events) == 1
    assert Path(result.adapter_path, "adapter_model.safetensors").is_file()


@pytest.mark.parametrize("quantization", ["4bit", "8bit"])
def test_quantized_base_trains_or_fails_with_failed_precondition(
    tmp_path: Path, tiny_model: str, quantization: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The policy trained is the quantized base under the LoRA (bitsandbytes layers holding packed
    weights), or the job fails naming the field; a trainer that ignored quantization fails both."""
    import bitsandbytes as bnb
    import torch

    captured = _capture_policy(monkeypatch)
    result = run_job(_job(tmp_path, tiny_model, quantization=quantization, max_steps=1),
                     JobDeps(scorer=_scorer(), publish=lambda e: None))
    if result.status == "failed":  # a host whose bitsandbytes cannot run it: said at once, never full precision
        assert result.error.startswith("advanced.quantization:") and result.steps_done == 0, result.error
        assert "model" not in captured  # refused before any model was loaded
        return
    assert result.status == "completed" and result.steps_done == 1, result.error
    layer, stored = {"4bit": (bnb.nn.Linear4bit, torch.uint8), "8bit": (bnb.nn.Linear8bitLt, torch.int8)}[quantization]
    bases = {n: m for n, m in captured["model"].named_modules() if n.endswith(".base_layer")}
    assert bases and all(type(m) is layer for m in bases.values()), {type(m).__name__ for m in bases.values()}
    assert {m.weight.dtype for m in bases.values()} == {stored}  # packed nf4 / int8, not float weights
    if quantization == "4bit":
        assert all(m.weight.quant_state.quant_type == "nf4" for m in bases.values())


class LogprobTwin(RolloutTwin):
    """A RolloutTwin that reports an engine dtype and sampling logprobs: the policy's own log-
    probabilities of the tokens it sampled (after temperature), plus `shift` on every token."""

    def __init__(self, model_path: str, dtype: str, shift: float = 0.0) -> None:
        super().__init__(model_path)
        self.dtype, self.shift = dtype, shift
        self._model: Any = None

    def bind(self, model: Any) -> None:
        super().bind(model)
        self._model = model

    def info(self) -> Any:
        return SimpleNamespace(model=self.served_model, max_lora_rank=self.max_lora_rank, dtype=self.dtype)

    def generate(self, prompts: Sequence[list[int]], sampling: Sampling, expected: AdapterTag) -> RolloutBatch:
        import torch

        batch = super().generate(prompts, sampling, expected)
        logprobs = []
        with torch.no_grad():
            for prompt, completion in zip(batch.prompt_ids, batch.completion_ids, strict=True):
                ids = torch.tensor([prompt + completion])
                logits = self._model(input_ids=ids).logits[0, len(prompt) - 1:-1].float() / sampling.temperature
                own = torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]
                logprobs.append([float(x) + self.shift for x in own])
        return replace(batch, logprobs=logprobs)


@pytest.mark.parametrize(("dtype", "shift", "correction", "iterations"), [
    ("float32", 0.0, "", 1), ("float32", 0.25, "", 1), ("bfloat16", 0.0, "precision", 1), ("float32", 0.25, "", 2)])
def test_every_step_reports_the_sampler_trainer_logprob_gap_and_any_correction(
    tmp_path: Path, tiny_model: str, dtype: str, shift: float, correction: str, iterations: int
) -> None:
    """MetricEvent.logprob_gap is the mean |log p_trainer - log p_sampler| over the trained tokens
    (a sampler off by `shift` on every token shows `shift`); a rollout engine of another dtype than
    advanced.precision turns TRL's truncated importance sampling on, named in sampler_correction.
    With two passes over each batch (advanced.num_iterations) the gap comes from TRL's old-logprob
    pass at generation, the generating policy, and reads the same."""
    twin = LogprobTwin(tiny_model, dtype, shift)
    events: list[C.MetricEvent] = []
    result = run_job(_job(tmp_path, tiny_model, generation_backend="vllm", max_steps=2, num_iterations=iterations),
                     JobDeps(scorer=_scorer(), publish=events.append, generator=twin))
    assert result.status == "completed", result.error
    assert [e.sampler_correction for e in events] == [correction] * 2
    for e in events:
        assert e.HasField("logprob_gap") and e.logprob_gap == pytest.approx(shift, abs=1e-3)
        assert e.logprob_gap_max >= e.logprob_gap


def test_a_quantized_job_sampled_unquantized_is_corrected(tmp_path: Path, tiny_model: str) -> None:
    """A 4-bit base trained while the rollout engine samples the full-precision base: the job applies
    the correction and says so (docs/gpu.md: measured, the nf4 gap is 5x bf16's)."""
    twin = LogprobTwin(tiny_model, "float32")
    events: list[C.MetricEvent] = []
    result = run_job(_job(tmp_path, tiny_model, generation_backend="vllm", quantization="4bit", max_steps=1),
                     JobDeps(scorer=_scorer(), publish=events.append, generator=twin))
    if result.status == "failed":
        assert result.error.startswith("advanced.quantization:"), result.error
        return
    assert result.status == "completed", result.error
    assert [e.sampler_correction for e in events] == ["quantization"] and events[0].HasField("logprob_gap")


def test_a_job_sampling_with_reshaping_controls_is_corrected_and_says_so(tmp_path: Path, tiny_model: str) -> None:
    """top_k (or top_p, min_p, a repetition penalty) draws from another distribution than the tempered
    policy the loss scores: with a vLLM backend the job applies TRL's correction and names it."""
    twin = LogprobTwin(tiny_model, "float32")
    events: list[C.MetricEvent] = []
    result = run_job(_job(tmp_path, tiny_model, generation_backend="vllm", top_k=20, max_steps=1),
                     JobDeps(scorer=_scorer(), publish=events.append, generator=twin))
    assert result.status == "completed", result.error
    assert [e.sampler_correction for e in events] == ["sampling"] and events[0].HasField("logprob_gap")


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo"])
def test_other_losses_with_kl_report_kl(tmp_path: Path, tiny_model: str, loss_type: str) -> None:
    events: list[C.MetricEvent] = []
    result = run_job(_job(tmp_path, tiny_model, loss_type=loss_type, kl_beta=0.04, max_steps=2),
                     JobDeps(scorer=_scorer(), publish=events.append))
    assert result.status == "completed", result.error
    assert all(e.HasField("kl") and e.kl >= 0 for e in events) and len(events) == 2
    # TRL's frozen reference copy of the adapter ("ref") is not saved with it.
    assert sorted(p.name for p in Path(result.adapter_path).iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors"]


def _capture_policy(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Keeps the model `load_policy` builds, the very policy the job trains ("model"), and its LoRA
    weights before any step ("initial_lora")."""
    captured: dict[str, Any] = {}
    load_policy = runner.load_policy

    def capture(*args: Any, **kwargs: Any) -> Any:
        model, tokenizer = load_policy(*args, **kwargs)
        captured["model"], captured["initial_lora"] = model, _lora_state(model)
        return model, tokenizer

    monkeypatch.setattr(runner, "load_policy", capture)
    return captured


def test_a_stacked_job_publishes_init_plus_new_as_one_adapter(
    tmp_path: Path, tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """init_adapter = a frozen adapter to stack on (common.proto): every published version is init
    and the fresh adapter as ONE adapter on the original base, and it is the policy the job trained."""
    import torch
    from peft import PeftModel
    from test_stacking import LOGIT_TOLERANCE, max_logit_difference, prompt_ids, random_lora
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvr.services.trainer.job import stacking

    init_dir = random_lora(tiny_model, tmp_path / "init", seed=5, r=8, lora_alpha=4)  # B != 0
    init = stacking.read_adapter(init_dir)
    captured = _capture_policy(monkeypatch)
    twin = RolloutTwin(tiny_model)
    events: list[C.MetricEvent] = []
    job = _job(tmp_path, tiny_model, job_id="t2", generation_backend="vllm", max_steps=2, kl_beta=0.04,
               init_adapter_path=str(init_dir), checkpoint_every=1)
    result = run_job(job, JobDeps(scorer=_scorer(), publish=events.append, generator=twin))
    assert result.status == "completed", result.error
    # The init adapter goes live under its own name before step 1; the job's versions count steps.
    assert twin.uploads == [AdapterTag("job-t2-init", 1), AdapterTag("job-t2", 1), AdapterTag("job-t2", 2)]
    assert [e.adapter_version for e in events] == [0, 1]
    # The KL reference is base + init, the policy step 1 samples from: no divergence yet.
    assert events[0].kl == pytest.approx(0.0, abs=1e-6)

    published = stacking.read_adapter(result.adapter_path)
    config = published.config
    assert (config["r"], config["lora_alpha"], config["use_rslora"], config["rank_pattern"]) == (12, 12, False, {})
    # Its first 8 ranks are the init adapter, untouched (scaling 4/8 folded into B); the rest is new.
    new_b = []
    for key, a in init.tensors.items():
        if key.endswith("lora_A.weight"):
            assert torch.equal(published.tensors[key][:8], a)
        else:
            torch.testing.assert_close(published.tensors[key][:, :8], a * 0.5, rtol=0, atol=0)
            new_b.append(published.tensors[key][:, 8:])
    assert any(b.abs().sum() > 0 for b in new_b), "the fresh adapter did not move: the check below is weaker"
    on_disk = stacking.read_adapter(init_dir).tensors  # the init adapter itself stays as it was
    assert all(torch.equal(on_disk[k], v) for k, v in init.tensors.items())

    # Loaded on the original base, it is the trainer's own policy (the merged base + the new LoRA).
    policy = captured["model"].eval()
    assert "ref" in policy.peft_config  # TRL's frozen reference copy (kl_beta > 0) is not published
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), result.adapter_path).eval()
    ids = prompt_ids(AutoTokenizer.from_pretrained(tiny_model))
    assert max_logit_difference(policy, loaded, ids) <= LOGIT_TOLERANCE
    step1 = tmp_path / "jobs" / "t2" / "checkpoints" / "step-1" / "adapter_config.json"
    assert json.loads(step1.read_text())["r"] == 12  # checkpoints copy the combined adapter too


def test_a_stacked_adapter_over_the_rollout_servers_max_rank_fails_before_training(
    tmp_path: Path, tiny_model: str
) -> None:
    from test_stacking import random_lora

    init_dir = random_lora(tiny_model, tmp_path / "init", seed=5, r=8, lora_alpha=8)
    twin = RolloutTwin(tiny_model, max_lora_rank=8)
    job = _job(tmp_path, tiny_model, generation_backend="vllm", init_adapter_path=str(init_dir))
    result = run_job(job, JobDeps(scorer=_scorer(), publish=lambda e: None, generator=twin))
    assert result.status == "failed" and result.steps_done == 0 and twin.uploads == []
    assert result.error.startswith("init_adapter: the published adapter's rank 12"), result.error
    assert "max_lora_rank 8" in result.error


def test_an_init_adapter_that_cannot_be_stacked_fails_at_once(tmp_path: Path, tiny_model: str) -> None:
    from test_stacking import random_lora

    init_dir = random_lora(tiny_model, tmp_path / "init", seed=5, r=4, lora_alpha=8)
    config = json.loads((init_dir / "adapter_config.json").read_text())
    (init_dir / "adapter_config.json").write_text(json.dumps(config | {"use_dora": True}))
    result = run_job(_job(tmp_path, tiny_model, init_adapter_path=str(init_dir)),
                     JobDeps(scorer=_scorer(), publish=lambda e: None))
    assert result.status == "failed" and result.steps_done == 0
    assert result.error.startswith("init_adapter:") and "uses DoRA" in result.error, result.error


@pytest.mark.parametrize("quantization", ["4bit", "8bit"])
def test_a_stacked_job_on_a_quantized_base_trains_over_exactly_base_plus_init(
    tmp_path: Path, tiny_model: str, quantization: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A quantized base is not merged into (peft requantizes: lossy, see runner.load_policy); the
    init adapter is added beside its layers, so the policy is Q(W) + init + new, which is the
    published adapter on the quantized base."""
    import torch
    from peft import PeftModel
    from test_stacking import LOGIT_TOLERANCE, max_logit_difference, prompt_ids, random_lora
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvr.services.trainer.job import stacking
    from rlvr.services.trainer.job.quantization import bnb_config

    init_dir = random_lora(tiny_model, tmp_path / "init", seed=5, r=4, lora_alpha=8)
    captured = _capture_policy(monkeypatch)
    result = run_job(_job(tmp_path, tiny_model, quantization=quantization, max_steps=1, init_adapter_path=str(init_dir)),
                     JobDeps(scorer=_scorer(), publish=lambda e: None))
    if result.status == "failed":  # a host whose bitsandbytes cannot run it: said at once
        assert result.error.startswith("advanced.quantization:") and result.steps_done == 0
        return
    assert result.status == "completed", result.error
    policy = captured["model"].eval()
    published = stacking.read_adapter(result.adapter_path)
    want = stacking.combine(stacking.read_adapter(init_dir), stacking.from_peft_model(policy))
    assert published.config["r"] == 8 and published.tensors.keys() == want.tensors.keys()
    assert all(torch.equal(published.tensors[k], v) for k, v in want.tensors.items())

    def on_quantized_base(adapter: Path) -> Any:
        base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, device_map="cpu",
                                                    quantization_config=bnb_config(quantization))
        return PeftModel.from_pretrained(base, str(adapter)).eval()

    ids = prompt_ids(AutoTokenizer.from_pretrained(tiny_model))
    with policy.disable_adapter():  # the frozen part, and the KL reference: exactly Q(W) + init
        assert max_logit_difference(policy, on_quantized_base(init_dir), ids) <= LOGIT_TOLERANCE
    # TRL keeps a quantized model's LoRA weights in bfloat16 (the QLoRA recipe), so the trainer computes
    # the new adapter's product in bf16 (3e-4 off in the logits here); compare in float32, as loaded.
    assert any(p.dtype == torch.bfloat16 for p in policy.parameters() if p.requires_grad)
    for param in policy.parameters():
        if param.dtype == torch.bfloat16:
            param.data = param.data.float()
    # int8 also quantizes activations, so float32 rounding-level input changes move its logits by up
    # to 7e-4 (measured: the same between two peft adapters side by side and their combination).
    # A CPU with AVX512-BF16 runs bitsandbytes' 4-bit matmul in bfloat16 (its fused CPU kernel casts
    # the input), so two models that differ only in how they hold the same adapter differ by up to
    # 4e-4 there (measured; without the adapter's part 0.75, so 2e-3 still tells them apart).
    import bitsandbytes.functional as bnbf

    bf16_kernel = quantization == "4bit" and bnbf.has_avx512bf16()
    tolerance = LOGIT_TOLERANCE if quantization == "4bit" and not bf16_kernel else 2e-3
    assert max_logit_difference(policy, on_quantized_base(Path(result.adapter_path)), ids) <= tolerance


class ShortIsGood:
    """A reward the "test" model can learn in a few steps: shorter text is better."""

    def score(self, items: Sequence[ScoreInput]) -> list[Score]:
        return [Score(-len(i.completion) / 50, 0.0, 0.0) for i in items]

    def close(self) -> None:
        pass


def test_steps_move_the_policy_towards_higher_reward(tmp_path: Path, tiny_model: str) -> None:
    """The sign of the update, not just its existence: the reward rises over a dozen steps."""
    events: list[C.MetricEvent] = []
    job = _job(tmp_path, tiny_model, batch_size=32, group_size=8, max_steps=12, synthetic_prompts=64)
    result = run_job(job, JobDeps(scorer=ShortIsGood(), publish=events.append))
    assert result.status == "completed", result.error
    first = sum(e.reward_mean for e in events[:3]) / 3
    last = sum(e.reward_mean for e in events[-3:]) / 3
    assert last > first + 0.1, [round(e.reward_mean, 2) for e in events]


class EvenTruthsOnly(LocalScorer):
    """A spread of rewards (by length) only for problems whose answer is even; every completion of
    any other problem earns 0, so its group carries no signal."""

    def __init__(self) -> None:
        super().__init__(ScoreSettings("math_pairs"))
        self.calls: list[int] = []

    def score(self, items: Sequence[ScoreInput]) -> list[Score]:
        self.calls.append(len(items))
        return [Score(len(i.completion) / 100 if int(i.ground_truth) % 2 == 0 else 0.0, 0.0, 0.0) for i in items]


@pytest.mark.parametrize("mode", ["off", "on", "ambiguous"])
def test_dynamic_sampling_trains_on_groups_with_signal_scoring_each_completion_once(
    tmp_path: Path, tiny_model: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With dynamic sampling the kept groups have a reward spread; in every mode each generated
    completion is scored exactly once (the rewards TRL trains with are the rollout's own scores,
    row for row). "ambiguous": a training set that asks questions with two answers (no dynamic
    sampling), whose rows are scored against their own answers."""
    from rlvr.services.trainer.job.engine import GrpoEngine

    trained: list[list[str]] = []  # the ground truths of the rows each step trains on
    rewards: list[tuple[list[float], list[float]]] = []  # (what TRL got, the scorer's rule on the same rows)
    original = GrpoEngine._reward

    def spy(self: GrpoEngine, completions: list[str], ground_truth: list[str], **kw: Any) -> list[float]:
        trained.append(list(ground_truth))
        got = original(self, completions, ground_truth, **kw)
        rule = [len(c) / 100 if int(t) % 2 == 0 else 0.0 for c, t in zip(completions, ground_truth, strict=True)]
        rewards.append((got, rule))
        return got

    generated: list[int] = []  # completions per generate call
    generate = LocalGenerator.generate

    def counted(self: LocalGenerator, prompts: Sequence[list[int]], sampling: Sampling,
                expected: AdapterTag) -> RolloutBatch:
        batch = generate(self, prompts, sampling, expected)
        generated.append(len(batch.completion_ids))
        return batch

    monkeypatch.setattr(GrpoEngine, "_reward", spy)
    monkeypatch.setattr(LocalGenerator, "generate", counted)
    ambiguous: list[int] = []  # rows made to repeat the row before's question (the patch below took effect)
    if mode == "ambiguous":  # every odd row asks the question of the row before with another answer
        rendered_with = runner.rendered_with

        def twice(tokenizer: Any, problems: Any, instruction: str | None) -> list[tuple[str, Any]]:
            rows = rendered_with(tokenizer, problems, instruction)
            ambiguous.append(len(rows) // 2)
            return [(rows[i - 1][0], replace(rows[i - 1][1], ground_truth=str(int(rows[i - 1][1].ground_truth) + 1)))
                    if i % 2 else row for i, row in enumerate(rows)]

        monkeypatch.setattr(runner, "rendered_with", twice)  # what run_job renders its training problems with
    scorer = EvenTruthsOnly()
    events: list[C.MetricEvent] = []
    job = _job(tmp_path, tiny_model, max_steps=4, synthetic_prompts=64, dynamic_sampling=mode == "on")
    result = run_job(job, JobDeps(scorer=scorer, publish=events.append))
    assert result.status == "completed", result.error
    assert len(trained) == 4 and all(len(rows) == job.batch_size for rows in trained)
    assert scorer.calls == generated, (scorer.calls, generated)  # each completion once, when generated
    assert all(got == rule for got, rule in rewards), rewards
    odd = [sum(int(t) % 2 for t in rows) for rows in trained]
    if mode == "on":
        assert odd == [0, 0, 0, 0], trained  # every kept group had a reward spread
        assert len(generated) > 4, generated  # some step drew further prompts (and scored only those)
    else:
        assert sum(odd) > 0, trained  # the control: without it, some steps train on signal-less groups
        assert generated == [job.batch_size] * 4
    assert [e.step for e in events] == [1, 2, 3, 4]
    assert (mode == "ambiguous") == bool(ambiguous and ambiguous[0] > 0)


def test_lora_init_gaussian_draws_a_from_n_0_1_over_r(tmp_path: Path, tiny_model: str) -> None:
    import torch

    def a_std(init: str) -> float:
        model, _ = runner.load_policy(_job(tmp_path, tiny_model, lora_rank=4, lora_init=init), tiny_model, "cpu")
        a = torch.cat([p.detach().flatten() for n, p in model.named_parameters() if "lora_A" in n])
        b = [p for n, p in model.named_parameters() if "lora_B" in n]
        assert all(torch.count_nonzero(p) == 0 for p in b)  # B = 0: step 1 samples from the base model
        return float(a.std())

    assert a_std("gaussian") == pytest.approx(1 / 4, rel=0.05)
    assert a_std("default") < 0.1  # kaiming-uniform: bound 1/sqrt(fan_in)


def _adapter_tensors(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(path / "adapter_model.safetensors"))


@pytest.mark.parametrize("extra", [{}, {"kl_beta": 0.05, "dynamic_sampling": True},
                                   {"kl_beta": 0.05, "micro_batch_size": 2, "num_iterations": 2, "mini_batches": 2}],
                         ids=["plain", "kl-dynamic", "kl-micro-batches-4-updates"])
def test_a_job_resumed_from_its_checkpoint_ends_with_the_uninterrupted_runs_adapter_bit_for_bit(
        tmp_path: Path, tiny_model: str, extra: dict[str, Any]) -> None:
    """Crash recovery (resume.resume_point): a run lost after its checkpoint resumes from it and
    ends where the uninterrupted run with the same seed does, tensor for tensor. 8 prompts, 4 a
    step: 2 steps an epoch, so the resume from step 3 starts inside the second epoch (the sampler's
    second order, a skipped batch, the RNG states restored mid-epoch) and runs into the third. With
    kl_beta the checkpoint also holds TRL's "ref" adapter; with dynamic sampling, our prompt draw; in
    micro-batches (engine.py `micro_batch_size`) TRL's loop skips a step's micro-batches on resume, and
    with 2 passes of 2 mini-batches (num_iterations, mini_batches) its 4 optimizer steps a step, whose
    checkpoint TRL names by its own count (checkpoint-12 for step 3)."""
    import torch

    options: dict[str, Any] = dict(synthetic_prompts=8, batch_size=8, group_size=2, max_steps=5, checkpoint_every=3,
                                   max_completion_tokens=16, **extra)
    whole_events: list[C.MetricEvent] = []
    whole = run_job(_job(tmp_path / "whole", tiny_model, **options),
                    JobDeps(scorer=_scorer(), publish=whole_events.append))
    assert whole.status == "completed", whole.error

    def lost(step: int, total: int) -> None:
        if step == 5:  # after checkpoint 3: steps 4 and 5 run again on resume
            raise RuntimeError("the trainer was lost")

    root = tmp_path / "resumed"
    first = run_job(_job(root, tiny_model, **options), JobDeps(scorer=_scorer(), publish=lambda e: None, on_step=lost))
    assert first.status == "failed" and "lost" in first.error
    checkpoints = sorted(p.name for p in (root / "jobs" / "t1" / "trl").glob("checkpoint-*"))
    updates = extra.get("num_iterations", 1) * extra.get("mini_batches", 1)
    assert checkpoints == [f"checkpoint-{3 * updates}"]

    events: list[C.MetricEvent] = []
    resumed = run_job(_job(root, tiny_model, resume=True, **options), JobDeps(scorer=_scorer(), publish=events.append))
    assert resumed.status == "completed", resumed.error
    assert (resumed.steps_done, resumed.adapter_version) == (5, 5)
    assert [e.step for e in events] == [4, 5]  # steps 1-3 were not run again
    for again, before in zip(events, whole_events[3:], strict=True):
        for name in ("loss", "reward_mean", "entropy", "completion_length_mean", "adapter_version", "kl"):
            assert getattr(again, name) == getattr(before, name), (again.step, name)

    expected, got = _adapter_tensors(Path(whole.adapter_path)), _adapter_tensors(Path(resumed.adapter_path))
    assert set(expected) == set(got)
    assert all(torch.equal(expected[k], got[k]) for k in expected)
    # The step-3 checkpoint alone would not do: the run did move after it.
    at_3 = _adapter_tensors(root / "jobs" / "t1" / "checkpoints" / "step-3")
    assert any(not torch.equal(at_3[k], got[k]) for k in got)


def test_a_resumed_vllm_backend_job_serves_its_checkpoint_first_and_publishes_no_stored_step(
        tmp_path: Path, tiny_model: str) -> None:
    """On resume the rollout server (restarted, or another one: it holds nothing of the job) gets
    the checkpoint's adapter as its version before any rollout, so the version check of the next
    step holds; the re-run steps the scheduler stores already are not published again."""
    from dataclasses import replace

    def lost(step: int, total: int) -> None:
        if step == 3:
            raise RuntimeError("the trainer was lost")

    job = _job(tmp_path, tiny_model, generation_backend="vllm", max_steps=4, checkpoint_every=2)
    first = run_job(job, JobDeps(scorer=_scorer(), publish=lambda e: None, generator=RolloutTwin(tiny_model),
                                 on_step=lost))
    assert first.status == "failed"
    # Resumed and stopped before its next step: it reports the checkpoint's adapter, whose files
    # are the job's adapter again (the lost run had written step 3's).
    import torch

    stopped = threading.Event()
    stopped.set()
    cancelled = run_job(replace(job, resume=True), JobDeps(scorer=_scorer(), publish=lambda e: None,
                                                           generator=RolloutTwin(tiny_model), cancel=stopped))
    assert (cancelled.status, cancelled.adapter_version) == ("cancelled", 2)
    at_2 = _adapter_tensors(tmp_path / "jobs" / "t1" / "checkpoints" / "step-2")
    reported = _adapter_tensors(Path(cancelled.adapter_path))
    assert all(torch.equal(at_2[k], reported[k]) for k in at_2)

    twin, events = RolloutTwin(tiny_model), []
    resumed = run_job(replace(job, resume=True, stored_steps=3),
                      JobDeps(scorer=_scorer(), publish=events.append, generator=twin))
    assert resumed.status == "completed", resumed.error
    assert twin.uploads == [AdapterTag("job-t1", v) for v in (2, 3, 4)]
    assert [(e.step, e.adapter_version) for e in events] == [(4, 3)]  # step 3 ran again, stored already
