"""Several optimizer steps per generated batch (advanced.num_iterations, advanced.mini_batches), the
loss families beyond grpo/dapo/dr_grpo (gspo, cispo, sapo) and DAPO's overlong masking, through real
GRPO steps of the "test"-size tiny model in TRL.

What users rely on: with one optimizer step per batch the importance ratio is 1, so epsilon_high
changes nothing (bit for bit); with several it binds (some tokens are clipped, epsilon_high changes
the update); each loss family reaches TRL as TRL names it and trains differently; a step stays one
generation, one MetricEvent and one adapter version however many updates it makes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_trainer_job import _job, _scorer

from rlvr.services.trainer.job.config import job_config
from rlvr.services.trainer.job.engine import LOSS_ARGS, grpo_args
from rlvr.services.trainer.job.runner import JobDeps, run_job
from rlvr.v1 import common_pb2 as C

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/fixtures_trainer.py


def _run(tmp_path: Path, model: str, monkeypatch: pytest.MonkeyPatch, **overrides: Any) -> dict[str, Any]:
    """A two-step job: its adapter's tensors, MetricEvents, adapter versions published, TRL's optimizer
    steps, the rows of each loss call with their completion masks, and the trainer TRL ran."""
    from safetensors.torch import load_file
    from trl import GRPOTrainer

    seen: dict[str, Any] = {"calls": [], "trainer": None}
    compute_loss = GRPOTrainer._compute_loss

    def spy(self: Any, model_: Any, inputs: dict[str, Any]) -> Any:
        seen["trainer"] = self
        seen["calls"].append((inputs["completion_ids"].detach().clone(), inputs["completion_mask"].detach().clone()))
        return compute_loss(self, model_, inputs)

    monkeypatch.setattr(GRPOTrainer, "_compute_loss", spy)
    events: list[C.MetricEvent] = []
    versions: list[int] = []
    result = run_job(_job(tmp_path, model, max_steps=2, **overrides),
                     JobDeps(scorer=_scorer(), publish=events.append, on_step=lambda s, _t: versions.append(s)))
    assert result.status == "completed", result.error
    seen["optimizer_steps"] = seen["trainer"].state.global_step
    return {**seen, "events": events, "versions": versions,
            "adapter": load_file(str(Path(result.adapter_path) / "adapter_model.safetensors"))}


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_one_update_per_step_leaves_epsilon_high_inert_bit_for_bit(tmp_path: Path, tiny_model: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    low = _run(tmp_path / "a", tiny_model, monkeypatch, loss_type="grpo")
    high = _run(tmp_path / "b", tiny_model, monkeypatch, loss_type="grpo", epsilon_high=0.28)
    assert low["optimizer_steps"] == 2 and [e.step for e in low["events"]] == [1, 2]
    assert all(e.HasField("clip_fraction") and e.clip_fraction == 0.0 for e in low["events"] + high["events"])
    assert _same(low["adapter"], high["adapter"]), "epsilon_high changed a job whose ratio is 1"


def test_several_updates_per_step_make_the_clip_bind(tmp_path: Path, tiny_model: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    low = _run(tmp_path / "a", tiny_model, monkeypatch, loss_type="grpo", num_iterations=2, mini_batches=2)
    # each step: one generation of 8 completions, 2 passes x 2 mini-batches of 4 = 4 optimizer steps
    assert low["optimizer_steps"] == 8
    assert [c[0].shape[0] for c in low["calls"]] == [4] * 8
    first = low["calls"][:2]  # a pass's two mini-batches are the step's 8 completions, each once
    import torch

    rows = sorted(map(tuple, torch.cat([first[0][0], first[1][0]]).tolist()))
    again = sorted(map(tuple, torch.cat([low["calls"][2][0], low["calls"][3][0]]).tolist()))
    assert rows == again, "the second pass did not train on the same completions"
    # still one MetricEvent and one adapter version per step
    assert [e.step for e in low["events"]] == [1, 2] and low["versions"] == [1, 2]
    assert max(e.clip_fraction for e in low["events"]) > 0, "no token's ratio left the clip range"
    high = _run(tmp_path / "b", tiny_model, monkeypatch, loss_type="grpo", num_iterations=2, mini_batches=2,
                epsilon_high=0.28)
    assert not _same(low["adapter"], high["adapter"]), "epsilon_high changed nothing with 4 updates a step"
    for loss in ("gspo", "cispo", "sapo"):
        other = _run(tmp_path / loss, tiny_model, monkeypatch, loss_type=loss, num_iterations=2, mini_batches=2)
        trainer = other["trainer"]
        assert {k: getattr(trainer, k, getattr(trainer.args, k)) for k in LOSS_ARGS[loss]} == LOSS_ARGS[loss]
        assert not _same(low["adapter"], other["adapter"]), f"{loss} trained as grpo"
        clipped = [e.HasField("clip_fraction") for e in other["events"]]
        assert clipped == [loss != "sapo"] * 2  # sapo gates the ratio and clips nothing


def test_overlong_masking_leaves_the_cut_completions_out_of_the_loss(tmp_path: Path, tiny_model: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoTokenizer

    stop = AutoTokenizer.from_pretrained(tiny_model).eos_token_id
    for masked in (False, True):
        run = _run(tmp_path / str(masked), tiny_model, monkeypatch, max_completion_tokens=12,
                   mask_truncated_completions=masked)
        trained = {True: 0, False: 0}  # completions that stopped / were cut, each with its loss tokens
        cut = ended = 0
        for ids, mask in run["calls"]:
            for row, row_mask in zip(ids.tolist(), mask.tolist(), strict=True):
                stopped = stop in row
                ended, cut = ended + stopped, cut + (not stopped)
                trained[stopped] += sum(row_mask) > 0
        assert cut > 0 and ended > 0, f"{cut} cut and {ended} stopped at 12 tokens: the test shows nothing"
        assert trained[True] == ended  # a completion that stopped is always trained on
        assert trained[False] == (0 if masked else cut), "masking did not follow the option"


def test_grpo_args_count_a_steps_updates_in_trls_steps(tmp_path: Path) -> None:
    job = job_config("j", "rlvr-tiny-test", tmp_path, group_size=4, batch_size=16, num_iterations=3, mini_batches=2,
                     checkpoint_every=5, loss_type="cispo", mask_truncated_completions=True)
    args = grpo_args(job, total_steps=10, output_dir=tmp_path, use_cpu=True, micro_batch=4)
    assert (args.per_device_train_batch_size, args.steps_per_generation, args.gradient_accumulation_steps) == (4, 4, 2)
    assert (args.num_iterations, args.max_steps, args.logging_steps, args.save_steps) == (3, 60, 6, 30)
    assert (args.loss_type, args.epsilon_high, args.mask_truncated_completions) == ("cispo", 5.0, True)
    gspo = grpo_args(job_config("j", "rlvr-tiny-test", tmp_path, loss_type="gspo"), 4, tmp_path, True)
    assert (gspo.loss_type, gspo.importance_sampling_level, gspo.epsilon, gspo.epsilon_high) == (
        "grpo", "sequence", 3e-4, 4e-4)
    dapo = grpo_args(job_config("j", "rlvr-tiny-test", tmp_path, loss_type="dapo", epsilon_high=0.28), 4, tmp_path,
                     True)
    assert (dapo.loss_type, dapo.epsilon, dapo.epsilon_high, dapo.num_iterations, dapo.max_steps) == (
        "dapo", 0.2, 0.28, 1, 4)
    with pytest.raises(ValueError, match="does not divide"):
        grpo_args(job, total_steps=10, output_dir=tmp_path, use_cpu=True, micro_batch=3)


class LengthScorer:
    """Math Pairs' scores with an accuracy that depends on every character of the completion, so the
    tiny "test" model (never right at Math Pairs) gives held-out accuracies that tell adapters apart."""

    def __init__(self) -> None:
        self.inner = _scorer()

    def score(self, items: Any) -> Any:
        from dataclasses import replace

        return [replace(s, accuracy=(len(i.completion) % 7) / 6) for s, i in zip(self.inner.score(items), items,
                                                                                  strict=True)]

    def close(self) -> None:
        pass


def test_evaluation_while_training_scores_the_pushed_adapter_on_the_heldout_problems(tmp_path: Path,
                                                                                     tiny_model: str) -> None:
    """advanced.eval_every 2 in a 3-step job: the held-out accuracy at steps 2 and 3 (the last), none at
    step 1; step 3's is what the final adapter, loaded in peft, answers greedily on the reward's first
    eval_size held-out problems, scored by the job's scorer."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvr.services.trainer.job.scorers import LocalProblems
    from rlvr.tasks import render_prompt

    events: list[C.MetricEvent] = []
    scorer = LengthScorer()
    result = run_job(_job(tmp_path, tiny_model, max_steps=3, eval_every=2, eval_size=8),
                     JobDeps(scorer=scorer, publish=events.append))
    assert result.status == "completed", result.error
    assert [e.HasField("heldout_accuracy") for e in events] == [False, True, True]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32),
                                      result.adapter_path).eval()
    problems = LocalProblems().heldout("math_pairs", 8, "")
    texts = []
    for problem in problems:
        ids = tokenizer(render_prompt(tokenizer, problem), return_tensors="pt", add_special_tokens=False).input_ids
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=32, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        texts.append(tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
    from rlvr.peers.types import ScoreInput

    expected = sum(s.accuracy for s in scorer.score([ScoreInput.of(t, p) for t, p in zip(texts, problems,
                                                                                         strict=True)])) / 8
    assert events[2].heldout_accuracy == pytest.approx(expected)
    assert 0 < expected < 1  # the accuracy this scorer gives depends on the answers
