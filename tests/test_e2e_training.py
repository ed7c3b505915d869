"""RLVR training end to end on the real stack: embedded NATS, SQLite, the five services as child
processes (the rollout server on the real vLLM CPU engine), a job created through the public SDK.

The short variant (CI) trains a few steps on each generation backend and checks the mechanics the
issue names: every step's metrics stored exactly once, every step's completions produced by the
adapter version of the step before (the trainer fails the job otherwise, and the stored points
carry the version), the final adapter in PEFT format loading in `peft` and in vLLM (uploaded to the
rollout server under a new name and generating from it). How much the
model learns is measured, not tested: `bench/learning.py` (`--require-gain N` fails below N points).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures_stack import SMALL_MODEL as MODEL  # the shared stack's model

from rlvr.v1 import common_pb2 as C
from rlvr.v1 import rollout_pb2 as R
from rlvr.v1 import scheduler_pb2 as S

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def stack(small_stack) -> tuple[object, Path, object]:  # noqa: ANN001 (tests/fixtures_stack.py)
    shared = small_stack.get()
    return shared.client, shared.home, shared.running


def _spec(backend: int, steps: int) -> C.JobSpec:
    spec = C.JobSpec(name=f"e2e-{C.GenerationBackend.Name(backend).lower()}", base_model=MODEL)
    spec.reward.function = C.REWARD_FUNCTION_MATH_PAIRS
    spec.reward.synthetic_prompts = 64
    g = spec.grpo
    g.group_size, g.batch_size, g.max_completion_tokens = 4, 8, 32
    g.lora_rank, g.lora_alpha, g.learning_rate, g.max_steps = 4, 128, 1e-5, steps
    spec.advanced.loss_type = C.LOSS_TYPE_DAPO
    spec.advanced.generation_backend = backend
    return spec


def _train(client, backend: int, steps: int, spec: C.JobSpec | None = None) -> C.Job:  # noqa: ANN001 (the SDK facade)
    created = client.scheduler.create_job(S.CreateJobRequest(spec=spec or _spec(backend, steps)))
    job_id = created.job.id
    seen = [e.metric.step for e in client.scheduler.watch(job_id, timeout=600) if e.HasField("metric")]
    # The watch ends once the store holds the job's end, and (one ordered consumer) every step before it.
    job = client.scheduler.get_job(S.GetJobRequest(id=job_id))
    assert job.status == C.JOB_STATUS_COMPLETED, job.error
    assert job.current_step == steps
    assert sorted(set(seen)) == list(range(1, steps + 1))
    return job


def _stored_points(home: Path, job_id: str) -> list[object]:
    from rlvr.infra.store import Store

    with Store(f"sqlite:///{home / 'rlvr.db'}") as store:
        return store.metric_points(job_id)


def _check_points(home: Path, job: C.Job, steps: int) -> None:
    points = _stored_points(home, job.id)
    assert [p.step for p in points] == list(range(1, steps + 1))  # each step once, none missing
    # Step s samples from the adapter of step s-1 (0 = the base model): the version sync held.
    assert [p.adapter_version for p in points] == list(range(0, steps))
    for p in points:
        assert p.total_steps == steps and 0.0 <= p.accuracy <= 1.0 and p.completion_length_mean > 0
        assert p.generate_seconds > 0 and p.train_seconds > 0 and p.learning_rate == pytest.approx(1e-5)
    assert job.adapter.version == steps and Path(job.adapter.path, "adapter_model.safetensors").is_file()


def _loads_in_peft(adapter: Path) -> None:
    """The saved folder is a PEFT adapter of the spec's rank and alpha over every linear layer, and
    `PeftModel.from_pretrained` loads every tensor of it (tests/test_trainer_job.py checks that
    steps move the policy)."""
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from rlvr.models import resolve_model

    base = AutoModelForCausalLM.from_pretrained(resolve_model(MODEL), dtype=torch.float32)
    linear = {n for n, m in base.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"}
    model = PeftModel.from_pretrained(base, str(adapter))
    config = model.peft_config["default"]
    assert (config.r, config.lora_alpha) == (4, 128)
    saved = load_file(str(adapter / "adapter_model.safetensors"))
    assert {k.split(".lora_")[0].removeprefix("base_model.model.") for k in saved} == linear
    loaded = dict(model.named_parameters())
    for key, tensor in saved.items():
        name = key.replace(".lora_A.weight", ".lora_A.default.weight").replace(".lora_B.weight", ".lora_B.default.weight")
        assert torch.equal(loaded[name], tensor), key


def _generates_in_vllm(client, home: Path, adapter: Path, name: str) -> None:  # noqa: ANN001
    import json

    from rlvr.clients.sdk import connect

    info = client.rollout.get_info()
    assert info.backend == "vllm"
    # LoadAdapter is internal (rlvr.common.auth.SERVICE_ONLY): an operator pushes with the service token.
    service_token = next(t for t, role in json.loads((home / "tokens.json").read_text()).items() if role == "service")
    with connect(client.settings.model_copy(update={"token": service_token})) as operator:
        loaded = operator.rollout.load_adapter(name, 1, adapter)
    assert loaded.version == 1
    req = R.GenerateRequest(prompts=[R.Prompt(messages=R.ChatMessages(messages=[
        C.ChatMessage(role="user", content="What is (1+2)*(3+4)?")]))], n=2,
        sampling=C.SamplingParams(temperature=1.0, max_tokens=32, seed=1),
        adapter=C.AdapterSelector(name=name, version=1))
    completions = [c for r in client.rollout.generate(req) for c in r.completions]
    assert len(completions) == 2
    assert all((c.adapter_name, c.adapter_version) == (name, 1) for c in completions)


@pytest.mark.parametrize("backend", [C.GENERATION_BACKEND_VLLM, C.GENERATION_BACKEND_TRANSFORMERS],
                         ids=["vllm", "transformers"])
def test_a_job_trains_through_every_service(stack, backend: int) -> None:
    client, home, _ = stack
    steps = 3 if backend == C.GENERATION_BACKEND_VLLM else 2
    job = _train(client, backend, steps)
    _check_points(home, job, steps)
    adapter = Path(job.adapter.path)
    _loads_in_peft(adapter)
    _generates_in_vllm(client, home, adapter, f"e2e-check-{backend}")


@pytest.mark.slow  # make test-all (about 100 s: a vLLM engine restarted); make test keeps the recovery
# itself (test_trainer_multiproc_rollout: a rollout server killed and restarted empty mid-step, every
# rank bringing the adapter back) and the reaper (test_reaper)
def test_a_job_survives_its_rollout_server_killed(stack) -> None:
    """kill -9 of the rollout server mid-job (its main process alone: vLLM's engine processes must
    not outlive it, and do not, see rlvr.infra.reaper): the trainer waits
    for it, says so in the job's status events, and the restarted server serves the job's live
    adapter again (from its disk); the job ends COMPLETED with every step stored once and every
    step's completions from the version of the step before."""
    import time

    client, home, running = stack
    steps = 12
    spec = _spec(C.GENERATION_BACKEND_VLLM, steps)
    spec.name = "rollout-killed"
    job_id = client.scheduler.create_job(S.CreateJobRequest(spec=spec)).job.id
    deadline = time.monotonic() + 300
    while client.scheduler.get_job(S.GetJobRequest(id=job_id)).current_step < 2:
        assert time.monotonic() < deadline and client.scheduler.get_job(S.GetJobRequest(id=job_id)).status in (
            C.JOB_STATUS_QUEUED, C.JOB_STATUS_RUNNING)
        time.sleep(0.1)
    from rlvr.infra.reaper import children

    server = running.procs["rollout"].pid
    engine = children(server)  # vLLM's engine core, with its worker under it
    assert engine and any(children(p) for p in engine)
    engine += [w for p in engine for w in children(p)]
    assert running.restart("rollout", group=False)  # kill -9 of the server alone, started again, SERVING
    assert not [p for p in engine if Path(f"/proc/{p}").exists()], "vLLM's processes outlived their server"
    messages = [e.status.message for e in client.scheduler.watch(job_id, from_start=True, timeout=600)
                if e.HasField("status")]
    job = client.scheduler.get_job(S.GetJobRequest(id=job_id))
    assert job.status == C.JOB_STATUS_COMPLETED, job.error
    _check_points(home, job, steps)
    # Seen by anyone who watches the job: the wait for the server, then its return.
    assert any("is back after" in m and "rollout service" in m for m in messages), messages


SFT_DATA = "examples/sft/math-pairs"  # under the stack's data roots (its services' folder: the repository)


def test_sft_then_rlvr_through_every_service(stack, tmp_path: Path) -> None:
    """Supervised (SFT) on the bundled chats through the SDK: every step stored once with its token
    accuracy, the held-out loss at the eval steps, the adapter downloaded and loading in peft, the
    history exported with the SFT columns; then an RLVR job starts from that adapter (the two-step
    recipe of docs/sft.md), so does a loop of RLVR rounds, and a dataset without the columns SFT reads is
    refused at CreateJob."""
    import csv
    import json

    from rlvr.v1 import benchmark_pb2 as B

    client, home, _ = stack
    spec = C.JobSpec(name="e2e-sft", base_model=MODEL, method=C.TRAINING_METHOD_SFT, sft=C.SftConfig(
        dataset=SFT_DATA, max_steps=6, batch_size=8, max_seq_length=128, learning_rate=1e-3, lora_rank=4,
        lora_alpha=128))
    spec.advanced.eval_every = 3
    created = client.scheduler.create_job(S.CreateJobRequest(spec=spec))
    assert created.summary.method == "Supervised (SFT)" and created.summary.total_steps == 6
    job_id = created.job.id
    seen = [e.metric.step for e in client.scheduler.watch(job_id, timeout=600) if e.HasField("metric")]
    job = client.scheduler.get_job(S.GetJobRequest(id=job_id))
    assert job.status == C.JOB_STATUS_COMPLETED, job.error
    assert sorted(set(seen)) == list(range(1, 7)) and job.adapter.version == 6
    points = _stored_points(home, job_id)
    assert [p.step for p in points] == list(range(1, 7))
    assert all(p.token_accuracy is not None and p.tokens_per_second and p.loss > 0 for p in points)
    assert [p.step for p in points if p.heldout_loss is not None] == [3, 6]
    metrics = client.scheduler.get_job_metrics(S.GetJobMetricsRequest(job_id=job_id))
    assert [p.HasField("token_accuracy") for p in metrics.series] == [True] * 6
    assert metrics.tiles.best_accuracy == max(p.token_accuracy for p in points)

    files = client.scheduler.save_adapter(job_id, tmp_path / "adapter")
    assert {f.name for f in files} >= {"adapter_config.json", "adapter_model.safetensors"}
    _loads_in_peft(tmp_path / "adapter")
    exported = client.scheduler.export(job_id, "csv", tmp_path)
    rows = list(csv.DictReader(exported.open()))
    assert [r["step"] for r in rows] == [str(s) for s in range(1, 7)] and all(r["token_accuracy"] for r in rows)
    assert [r["step"] for r in rows if r["heldout_loss"]] == ["3", "6"]
    merged = client.scheduler.merge(job_id)  # Merge Model as for an RLVR job: base + the SFT adapter
    assert merged.done and merged.size_bytes > 0

    rlvr = _spec(C.GENERATION_BACKEND_TRANSFORMERS, 2)
    rlvr.name = "e2e-after-sft"
    rlvr.init_adapter.name = f"job-{job_id}"
    after = _train(client, C.GENERATION_BACKEND_TRANSFORMERS, 2, rlvr)
    assert after.spec.init_adapter.path == job.adapter.path

    # A loop of RLVR rounds from the SFT adapter (docs/loops.md): its baseline scores that adapter,
    # round 1 stacks on it (rank 4 + the round's 4), and the rank budget counts it.
    loop_job = _spec(C.GENERATION_BACKEND_TRANSFORMERS, 1)
    loop_job.name = ""
    loop_job.init_adapter.name = f"job-{job_id}"
    loop_spec = S.LoopSpec(name="e2e loop from sft", benchmark="rlvr-math-pairs-heldout", score_column="format",
                           target=90.0, benchmark_limit=16, max_rounds=1, give_up_after=1, job=loop_job)
    too_many = S.LoopSpec()
    too_many.CopyFrom(loop_spec)
    too_many.max_rounds = 16  # 4 + 16 x 4 = 68, over the rollout server's 64
    with pytest.raises(Exception) as refused_loop:
        client.scheduler.create_loop(S.CreateLoopRequest(spec=too_many, dry_run=True))
    assert "on the start adapter's rank 4 stack to a rank-68 adapter" in str(refused_loop.value)
    loop_id = client.scheduler.create_loop(S.CreateLoopRequest(spec=loop_spec)).loop.id
    updates = list(client.scheduler.watch_loop(S.WatchLoopRequest(id=loop_id), timeout=600))
    loop = client.scheduler.get_loop(S.GetLoopRequest(id=loop_id))
    assert loop.status in (S.LOOP_STATUS_TARGET_REACHED, S.LOOP_STATUS_ROUNDS_SPENT), updates[-1]
    assert any(f"scoring the start adapter job-{job_id}" in u.message for u in updates)
    baseline = client.benchmark.get_evaluation(B.GetEvaluationRequest(id=loop.baseline_evaluation_id))
    assert baseline.adapter_name == f"job-{job_id}"
    (r1,) = loop.rounds
    round_job = client.scheduler.get_job(S.GetJobRequest(id=r1.job_id))
    assert round_job.spec.init_adapter.name == f"job-{job_id}" and round_job.spec.init_adapter.path == job.adapter.path
    assert json.loads(Path(r1.adapter.path, "adapter_config.json").read_text())["r"] == 8

    bad = C.JobSpec(method=C.TRAINING_METHOD_SFT, base_model=MODEL,
                    sft=C.SftConfig(dataset="rlvr/data/gsm8k/test.jsonl"))
    with pytest.raises(Exception) as refused:
        client.scheduler.create_job(S.CreateJobRequest(spec=bad, dry_run=True))
    assert "which method SFT trains on" in str(refused.value)


HEAD_DATA = "examples/head/math-verdicts"  # under the stack's data roots, as SFT_DATA


def test_a_head_trains_and_then_scores_an_rlvr_job_as_its_reward(stack, tmp_path: Path) -> None:
    """Head on the bundled Math Pairs verdicts through the SDK: every step stored once, the held-out
    accuracy, macro F1 and F1 per class at the eval steps and the last, the Head Metrics card, the
    adapter downloaded with its description, the history exported with the Head columns, Merge
    Model writing a sequence-classification checkpoint; then an RLVR job names it as a reward term
    (head_<job id>, scored by the reward service with no restart), an evaluation is scored by it (its
    benchmark head_<job id> on a dataset) while its adapter is refused as the model evaluated, and
    data a head cannot learn is refused at CreateJob naming the column (docs/head.md)."""
    import csv
    import json

    from rlvr.heads import read_head
    from rlvr.v1 import benchmark_pb2 as B

    client, home, _ = stack
    spec = C.JobSpec(name="e2e-head", base_model=MODEL, method=C.TRAINING_METHOD_HEAD, head=C.HeadConfig(
        dataset=HEAD_DATA, max_steps=6, batch_size=8, max_seq_length=96, learning_rate=1e-3, lora_rank=4))
    spec.advanced.eval_every = 4
    created = client.scheduler.create_job(S.CreateJobRequest(spec=spec))
    assert created.summary.method == "Head" and created.summary.total_steps == 6
    assert created.summary.settings["head.task"] == "classification"
    job_id = created.job.id
    seen = [e.metric.step for e in client.scheduler.watch(job_id, timeout=600) if e.HasField("metric")]
    job = client.scheduler.get_job(S.GetJobRequest(id=job_id))
    assert job.status == C.JOB_STATUS_COMPLETED, job.error
    assert sorted(set(seen)) == list(range(1, 7)) and job.adapter.version == 6
    points = _stored_points(home, job_id)
    assert [p.step for p in points] == list(range(1, 7)) and all(p.loss > 0 and p.tokens_per_second for p in points)
    evaluated = [p for p in points if p.heldout_accuracy is not None]
    assert [p.step for p in evaluated] == [4, 6]  # eval_every, and always the last
    assert all(0 <= p.heldout_f1 <= 1 and set(json.loads(p.class_f1)) == {"correct", "wrong"} for p in evaluated)
    metrics = client.scheduler.get_job_metrics(S.GetJobMetricsRequest(job_id=job_id))
    assert metrics.head and not metrics.supervised
    assert metrics.tiles.best_accuracy == max(p.heldout_accuracy for p in evaluated)

    files = client.scheduler.save_adapter(job_id, tmp_path / "adapter")
    assert {f.name for f in files} >= {"adapter_config.json", "adapter_model.safetensors"}
    info = read_head(tmp_path / "adapter")
    assert info is not None and info.classes == ("correct", "wrong") and info.reward_label == "correct"
    rows = list(csv.DictReader(client.scheduler.export(job_id, "csv", tmp_path).open()))
    assert [r["step"] for r in rows if r["heldout_f1"]] == ["4", "6"] and "correct" in rows[-1]["class_f1"]
    merged = client.scheduler.merge(job_id)
    assert merged.done and merged.size_bytes > 0

    rlvr = _spec(C.GENERATION_BACKEND_TRANSFORMERS, 2)
    rlvr.name = "e2e-head-reward"
    rlvr.reward.terms.extend([C.RewardTerm(key="math_pairs", weight=1.0), C.RewardTerm(key=f"head_{job_id}",
                                                                                       weight=0.5)])
    rlvr.reward.ClearField("function")
    after = _train(client, C.GENERATION_BACKEND_TRANSFORMERS, 2, rlvr)
    scored = _stored_points(home, after.id)
    assert all(0 < json.loads(p.reward_components)[f"head_{job_id}"] < 1 for p in scored)
    assert all(p.reward_errors == 0 for p in scored)

    # An evaluation scored by the head: its benchmark head_<id> on a dataset of prompts, each answer
    # the probability of the head's reward class; the head is no model to evaluate.
    asked = B.RunEvaluationRequest(benchmark=f"head_{job_id}", dataset="examples/reward_plugin/data/test.jsonl",
                                   limit=4, sampling=C.SamplingParams(max_tokens=32))
    run = client.benchmark.run_evaluation(asked)
    list(client.benchmark.watch_evaluation(B.WatchEvaluationRequest(id=run.id)))
    judged = client.benchmark.get_evaluation(B.GetEvaluationRequest(id=run.id))
    assert judged.status == B.EVALUATION_STATUS_COMPLETED, judged.error
    answers = client.benchmark.get_evaluation_results(B.GetEvaluationResultsRequest(id=run.id)).results
    assert len(answers) == 4 and all(0 < a.reward < 1 for a in answers)
    assert judged.scores.accuracy == pytest.approx(sum(a.accuracy for a in answers) / 4)
    with pytest.raises(Exception) as evaluated_head:
        client.benchmark.run_evaluation(B.RunEvaluationRequest(
            benchmark="rlvr-math-pairs-heldout", limit=2, adapter=C.AdapterSelector(name="head-as-policy"),
            adapter_path=job.adapter.path))
    assert "is a Head job's adapter" in str(evaluated_head.value) and f"head_{job_id}" in str(evaluated_head.value)

    on_head = _spec(C.GENERATION_BACKEND_TRANSFORMERS, 2)
    on_head.init_adapter.name = f"job-{job_id}"  # a head is no policy to train on
    with pytest.raises(Exception) as stacked:
        client.scheduler.create_job(S.CreateJobRequest(spec=on_head, dry_run=True))
    assert f"job {job_id} is a Head job" in str(stacked.value) and f"head_{job_id}" in str(stacked.value)
    bad = C.JobSpec(method=C.TRAINING_METHOD_HEAD, base_model=MODEL, head=C.HeadConfig(dataset=HEAD_DATA,
                                                                                       label_column="score"))
    with pytest.raises(Exception) as refused:
        client.scheduler.create_job(S.CreateJobRequest(spec=bad, dry_run=True))
    assert "head.label_column: " in str(refused.value) and "'score' column, which method HEAD reads" in str(refused.value)
