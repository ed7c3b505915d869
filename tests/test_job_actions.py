"""The job Actions over the real stack: a scheduler and a trainer service (in this process, over
real gRPC), the trainer's job and merge in their own processes, a real embedded NATS and SQLite.

One real 2-step job on rlvr-tiny-test (transformers backend) is trained once for the module; then
its adapter is downloaded through the SDK and loaded with peft, merged into the base model (with
progress, and a second merge answered from the record), the merged checkpoint downloaded and
compared with base + adapter on greedy generation, the history exported as CSV and JSONL and read
back, and every action refused clearly for an unknown job and for a job without an adapter.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from rlvr.adapters import ADAPTER_FILES
from rlvr.clients.sdk import RlvrError, SchedulerClient
from rlvr.infra.schema import JobRow, LoopRow, RoundRow
from rlvr.infra.store import Store
from rlvr.jobspec import resolve_spec
from rlvr.services.common.server import ServiceRunner
from rlvr.services.scheduler.convert import spec_to_json
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import scheduler_pb2 as S

MODEL = "rlvr-tiny-test"


@dataclass
class Stack:
    client: SchedulerClient
    store: Store  # a second handle on the scheduler's SQLite file
    root: Path    # the artifact root the scheduler and the trainer share
    job: C.Job    # the trained job, COMPLETED
    base_path: str


def _spec() -> C.JobSpec:
    spec = C.JobSpec(name="actions-test", base_model=MODEL)
    spec.reward.synthetic_prompts = 16
    g = spec.grpo
    g.group_size, g.batch_size, g.max_completion_tokens, g.max_steps = 4, 8, 32, 2
    g.lora_rank, g.lora_alpha, g.learning_rate = 4, 128, 1e-5
    spec.advanced.generation_backend = C.GENERATION_BACKEND_TRANSFORMERS
    spec.advanced.loss_type = C.LOSS_TYPE_DAPO
    return spec


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def stack(nats_server, tmp_path_factory: pytest.TempPathFactory):
    from rlvr.models import resolve_model
    from rlvr.services.scheduler.server import build_service as build_scheduler
    from rlvr.services.scheduler.settings import SchedulerSettings
    from rlvr.services.trainer.server import build_service as build_trainer
    from rlvr.services.trainer.settings import TrainerSettings

    base_path = await asyncio.to_thread(resolve_model, MODEL)
    home = tmp_path_factory.mktemp("actions")
    root = home / "artifacts"
    trainer_settings = TrainerSettings(port=0, artifact_root=root, nats_url=nats_server.url, scorer="local",
                                       torch_threads=1, worker_name="actions-trainer")
    async with ServiceRunner(build_trainer(trainer_settings), trainer_settings) as trainer:
        settings = SchedulerSettings(port=0, database_url=f"sqlite:///{home / 'db.sqlite'}",
                                     nats_url=nats_server.url, artifact_root=root,
                                     trainer_addresses=[trainer.address])
        async with ServiceRunner(build_scheduler(settings), settings) as scheduler:
            client = SchedulerClient(scheduler.address)
            store = Store(settings.database_url)
            created = await asyncio.to_thread(client.create_job, S.CreateJobRequest(spec=_spec()))
            job_id = created.job.id
            # The watch ends once the store holds the job's end, and with it every step.
            await asyncio.to_thread(lambda: list(client.watch(job_id, timeout=240)))
            job = await asyncio.to_thread(client.get_job, S.GetJobRequest(id=job_id))
            assert job.status == C.JOB_STATUS_COMPLETED, job.error
            assert len(store.metric_points(job_id)) == job.current_step
            assert job.adapter.version == 2 and job.current_step == 2
            yield Stack(client=client, store=store, root=root, job=job, base_path=base_path)
            client.close()
            store.close()


def _code(error: pytest.ExceptionInfo[RlvrError]) -> str:
    return error.value.code.name


async def test_download_adapter_loads_with_peft(stack: Stack, tmp_path: Path) -> None:
    written = await asyncio.to_thread(stack.client.save_adapter, stack.job.id, tmp_path / "adapter")
    assert [p.name for p in written] == list(ADAPTER_FILES)
    for name in ADAPTER_FILES:
        assert (tmp_path / "adapter" / name).read_bytes() == (Path(stack.job.adapter.path) / name).read_bytes()

    def load() -> None:
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(stack.base_path),
                                          str(tmp_path / "adapter"))
        assert model.peft_config["default"].r == 4

    await asyncio.to_thread(load)


async def test_merge_download_and_compare_with_base_plus_adapter(stack: Stack, tmp_path: Path) -> None:
    seen: list[S.MergeModelProgress] = []
    done = await asyncio.to_thread(stack.client.merge, stack.job.id, on_progress=seen.append)
    assert done.done and done.stage == "done" and done.size_bytes > 0
    assert Path(done.path) == (stack.root / "merged" / f"job-{stack.job.id}-v2").resolve()
    assert [p.stage for p in seen][:2] == ["starting", "loading"] and seen[-1] == done
    fractions = [p.fraction for p in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and not any(p.done for p in seen[:-1])
    (artifact,) = stack.store.artifacts(stack.job.id, "merged")
    assert (artifact.path, artifact.size_bytes) == (done.path, done.size_bytes)

    started = time.monotonic()  # a second merge answers from the record
    again = await asyncio.to_thread(lambda: list(stack.client.merge_model(S.MergeModelRequest(job_id=stack.job.id))))
    assert time.monotonic() - started < 3
    assert len(again) == 1 and again[0].done and again[0].path == done.path
    assert len(stack.store.artifacts(stack.job.id, "merged")) == 1

    out = tmp_path / "merged"
    files = await asyncio.to_thread(stack.client.save_merged_model, stack.job.id, out)
    assert {"config.json", "model.safetensors"} <= {p.name for p in files}
    assert sum(p.stat().st_size for p in files) == done.size_bytes
    adapter = tmp_path / "adapter"
    await asyncio.to_thread(stack.client.save_adapter, stack.job.id, adapter)
    await asyncio.to_thread(_compare_greedy, stack.base_path, out, adapter)

    # The 2-step run on the untrained test model earns no reward, so its LoRA B matrices are
    # still zero and the merge above equals the base model. The same path with a trained-looking
    # adapter (B filled in) shows the merge folds the update in exactly.
    perturbed = stack.root / "jobs" / f"perturbed-{stack.job.id}" / "adapter"  # the trainer's root only
    await asyncio.to_thread(_perturb_adapter, Path(stack.job.adapter.path), perturbed)
    row = stack.store.add_job(JobRow(name="perturbed", status="COMPLETED", spec_json=stack.store.get_job(
        stack.job.id).spec_json, adapter_name="p", adapter_version=7, adapter_path=str(perturbed)))
    merged = await asyncio.to_thread(stack.client.merge, row.id)
    assert Path(merged.path).name == f"job-{row.id}-v7"
    out = tmp_path / "merged-perturbed"
    await asyncio.to_thread(stack.client.save_merged_model, row.id, out)
    await asyncio.to_thread(_compare_greedy, stack.base_path, out, perturbed, True)


async def test_a_merge_in_another_dtype_is_a_checkpoint_of_its_own(stack: Stack, tmp_path: Path) -> None:
    """MergeModel's dtype: bf16 writes a bf16 checkpoint beside the base-dtype one (its own folder and
    record), a download names the dtype it wants, and a dtype not offered is refused naming those that are."""
    import json

    from safetensors import safe_open

    job_id = stack.job.id
    merged = await asyncio.to_thread(stack.client.merge, job_id, dtype="bf16")
    assert Path(merged.path).name == f"job-{job_id}-v2-bf16"
    again = await asyncio.to_thread(lambda: list(stack.client.merge_model(S.MergeModelRequest(job_id=job_id,
                                                                                               dtype="bf16"))))
    assert len(again) == 1 and again[0].path == merged.path  # answered from its record
    paths = {Path(a.path).name for a in stack.store.artifacts(job_id, "merged")}
    assert {f"job-{job_id}-v2", f"job-{job_id}-v2-bf16"} <= paths
    # "" (what a client that names no dtype sends): the base-dtype merge, though the bf16 one is newer.
    for dtype, want in (("bf16", "bfloat16"), ("auto", "float32"), ("", "float32")):  # the test model is float32
        out = tmp_path / (dtype or "unnamed")
        await asyncio.to_thread(lambda d=dtype, o=out: stack.client.save_merged_model(job_id, o, dtype=d))
        config = json.loads((out / "config.json").read_text())
        assert config.get("dtype", config.get("torch_dtype")) == want, config
        with safe_open(str(out / "model.safetensors"), "pt") as f:
            assert {str(f.get_slice(k).get_dtype()) for k in f.keys()} == {"BF16" if dtype == "bf16" else "F32"}  # noqa: SIM118
    with pytest.raises(RlvrError) as bad:
        await asyncio.to_thread(stack.client.merge, job_id, dtype="int8")
    assert _code(bad) == "INVALID_ARGUMENT"
    assert bad.value.details.startswith("dtype: 'int8' is not a dtype to merge in; use 'auto', 'fp32', 'bf16', 'fp16'")


def _perturb_adapter(src: Path, dest: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    dest.parent.mkdir(parents=True)
    shutil.copytree(src, dest)
    tensors = load_file(str(dest / "adapter_model.safetensors"))
    generator = torch.Generator().manual_seed(0)
    for name, tensor in tensors.items():
        if "lora_B" in name:
            tensors[name] = torch.randn(tensor.shape, generator=generator) * 0.005
    save_file(tensors, str(dest / "adapter_model.safetensors"), metadata={"format": "pt"})


def _compare_greedy(base_path: str, merged_dir: Path, adapter_dir: Path, changed: bool = False) -> None:
    """Greedy token ids of the merged checkpoint == those of base + adapter (peft), on a few
    held-out prompts; with `changed`, the adapter must also move the model off its base."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvr.tasks import math_pairs as mp
    from rlvr.tasks.render import render_prompt

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(str(merged_dir))
    tokenizer.padding_side = "left"
    merged = AutoModelForCausalLM.from_pretrained(str(merged_dir)).eval()
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_path), str(adapter_dir)).eval()
    prompts = [render_prompt(tokenizer, p) for p in mp.heldout_problems(4, seed=1)]
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    args = {"max_new_tokens": 24, "do_sample": False, "pad_token_id": tokenizer.pad_token_id}
    with torch.inference_mode():
        ids_merged = merged.generate(**batch, **args)
        ids_adapted = adapted.generate(**batch, **args)
        logits_merged = merged(**batch).logits
        logits_adapted = adapted(**batch).logits
        with adapted.disable_adapter():
            logits_base = adapted(**batch).logits
    assert torch.equal(ids_merged, ids_adapted)
    assert torch.allclose(logits_merged, logits_adapted, atol=1e-4)
    if changed:
        assert (logits_merged - logits_base).abs().max() > 1e-2


async def test_export_history_round_trips(stack: Stack, tmp_path: Path) -> None:
    points = stack.store.metric_points(stack.job.id)
    assert [p.step for p in points] == [1, 2]
    columns = [f.name for f in C.MetricEvent.DESCRIPTOR.fields]

    # parse: the format's text -> value; a map column (reward_components) is JSON text in CSV, an object in JSONL
    def check(row: dict[str, object], point, parse, as_object: bool) -> None:
        assert row["job_id"] == stack.job.id
        for name in columns:
            if name in ("job_id", "time"):
                continue
            expected = getattr(point, name)
            if name == "reward_components":
                assert point.components(), "the job's reward must be in its components"
                expected = point.components() if as_object else point.reward_components
            if name == "class_f1":  # a Head job's map column: an RLVR job's is empty
                expected = point.class_scores() if as_object else point.class_f1
            assert parse(row[name], expected) == expected, name

    path = await asyncio.to_thread(stack.client.export, stack.job.id, "csv", tmp_path)
    assert path.name == f"job-{stack.job.id}-history.csv"
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    assert list(rows[0]) == columns and len(rows) == len(points)
    for row, point in zip(rows, points, strict=True):
        check(row, point, lambda text, want: None if text == "" and not isinstance(want, str) else type(want)(text),
              False)

    response = await asyncio.to_thread(stack.client.export_history,
                                       S.ExportHistoryRequest(job_id=stack.job.id, format=S.EXPORT_FORMAT_JSONL))
    assert response.content_type == "application/x-ndjson" and response.rows == 2
    path = await asyncio.to_thread(stack.client.export, stack.job.id, "jsonl", tmp_path / "h.jsonl")
    assert path.read_bytes() == response.content
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [list(line) for line in lines] == [columns, columns]
    for line, point in zip(lines, points, strict=True):
        check(line, point, lambda value, want: value, True)


async def test_actions_refuse_unknown_jobs_and_jobs_without_an_adapter(stack: Stack, tmp_path: Path) -> None:
    c = stack.client
    calls = {
        "GetJobMetrics": lambda j: c.get_job_metrics(S.GetJobMetricsRequest(job_id=j)),
        "DownloadAdapter": lambda j: c.save_adapter(j, tmp_path / "a"),
        "MergeModel": lambda j: c.merge(j),
        "DownloadMergedModel": lambda j: c.save_merged_model(j, tmp_path / "m"),
        "ExportHistory": lambda j: c.export_history(S.ExportHistoryRequest(job_id=j)),
    }
    for name, call in calls.items():
        with pytest.raises(RlvrError) as unknown:
            await asyncio.to_thread(call, "nosuchjob42")
        assert _code(unknown) == "NOT_FOUND" and "nosuchjob42" in unknown.value.details, name
        with pytest.raises(RlvrError) as empty_id:
            await asyncio.to_thread(call, "")
        assert _code(empty_id) == "INVALID_ARGUMENT" and "job_id" in empty_id.value.details, name

    # A job cancelled while queued: no adapter, no step.
    bare = stack.store.add_job(JobRow(name="bare", status="CANCELLED"))
    for name in ("DownloadAdapter", "MergeModel"):
        with pytest.raises(RlvrError) as no_adapter:
            await asyncio.to_thread(calls[name], bare.id)
        assert _code(no_adapter) == "FAILED_PRECONDITION", name
        assert no_adapter.value.details == f"job {bare.id} has no adapter yet: it ended (CANCELLED) before its first step finished"
    with pytest.raises(RlvrError) as not_merged:
        await asyncio.to_thread(calls["DownloadMergedModel"], bare.id)
    assert _code(not_merged) == "FAILED_PRECONDITION" and "run MergeModel first" in not_merged.value.details
    metrics = await asyncio.to_thread(calls["GetJobMetrics"], bare.id)
    assert not metrics.has_steps and "CANCELLED" in metrics.message
    empty = await asyncio.to_thread(calls["ExportHistory"], bare.id)
    assert empty.rows == 0 and empty.content.decode().count("\n") == 1  # the header alone
    assert not (tmp_path / "a").exists() or not any((tmp_path / "a").iterdir())

    # An adapter recorded but gone from disk: the error says so, and keeps the server's path to its log.
    gone = tmp_path / "deleted-adapter"
    lost = stack.store.add_job(JobRow(name="lost", status="COMPLETED", adapter_name="x", adapter_version=1,
                                      adapter_path=str(gone)))
    with pytest.raises(RlvrError) as missing:
        await asyncio.to_thread(calls["DownloadAdapter"], lost.id)
    assert _code(missing) == "FAILED_PRECONDITION" and f"adapter folder of job {lost.id} is missing" in missing.value.details
    assert str(tmp_path) not in missing.value.details

    # An adapter on disk, never merged: DownloadMergedModel says to merge first.
    copy = tmp_path / "adapter-copy"
    shutil.copytree(stack.job.adapter.path, copy)
    unmerged = stack.store.add_job(JobRow(name="unmerged", status="COMPLETED", adapter_name="y", adapter_version=1,
                                          adapter_path=str(copy)))
    with pytest.raises(RlvrError) as first:
        await asyncio.to_thread(calls["DownloadMergedModel"], unmerged.id)
    assert _code(first) == "FAILED_PRECONDITION"
    assert first.value.details == f"job {unmerged.id} has no merged model yet; run MergeModel first"


async def test_delete_job_removes_its_rows_and_files_and_refuses_a_job_in_use(
        stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    """Last in this module: it deletes the trained job (merged by the tests above)."""
    from rlvr.clients.cli import main as cli

    c, job_id = stack.client, stack.job.id
    job_dir = stack.root / "jobs" / job_id
    merged = stack.store.artifacts(job_id, "merged")
    assert job_dir.is_dir() and merged and all(Path(a.path).is_dir() for a in merged)
    assert stack.store.metric_points(job_id)

    def delete(j: str) -> S.DeleteJobResponse:
        return c.delete_job(S.DeleteJobRequest(id=j))

    for bad, code, words in (("", "INVALID_ARGUMENT", "id: required"), ("nosuchjob42", "NOT_FOUND", "nosuchjob42")):
        with pytest.raises(RlvrError) as refused:
            await asyncio.to_thread(delete, bad)
        assert _code(refused) == code and words in refused.value.details

    # Not ended yet: cancel first. (RUNNING on no worker: the dispatcher leaves it alone.)
    running = stack.store.add_job(JobRow(name="running", status="RUNNING"))
    with pytest.raises(RlvrError) as refused:
        await asyncio.to_thread(delete, running.id)
    assert _code(refused) == "FAILED_PRECONDITION"
    assert refused.value.details == (f"job {running.id} is RUNNING; cancel it first (rlvr jobs cancel {running.id}), "
                                     "then delete it")

    # A job that starts from this job's adapter and has not ended.
    spec = _spec()
    spec.init_adapter.name = stack.job.adapter.name
    stacked = stack.store.add_job(JobRow(name="stacked", status="RUNNING",
                                         spec_json=spec_to_json(resolve_spec(spec).spec)))
    with pytest.raises(RlvrError) as refused:
        await asyncio.to_thread(delete, job_id)
    assert _code(refused) == "FAILED_PRECONDITION" and f"job {stacked.id} (RUNNING) starts from" in refused.value.details
    stack.store.update_job(stacked.id, status="CANCELLED")

    # A round of a loop that has not ended (the row alone: the running loop manager never sees it).
    loop = stack.store.add_loop(LoopRow(name="open", status="TRAINING"))
    stack.store.add_round(RoundRow(loop_id=loop.id, index=1, job_id=job_id, status="SCORED"))
    with pytest.raises(RlvrError) as refused:
        await asyncio.to_thread(delete, job_id)
    assert _code(refused) == "FAILED_PRECONDITION"
    assert f"round 1 of loop {loop.id}, which is TRAINING; stop the loop first" in refused.value.details
    assert job_dir.is_dir() and stack.store.get_job(job_id) is not None  # nothing deleted by a refusal

    # Once the loop has ended the job goes; the round stays, without its job.
    stack.store.update_loop(loop.id, status="STOPPED")
    assert await asyncio.to_thread(cli, ["jobs", "delete", job_id, "--address", c.address]) == 0
    assert f"job {job_id} deleted" in capsys.readouterr().out
    assert not job_dir.exists() and not any(Path(a.path).exists() for a in merged)
    assert not list((stack.root / "merged").glob(f"job-{job_id}-*"))
    assert stack.store.get_job(job_id) is None and stack.store.metric_points(job_id) == []
    assert stack.store.artifacts(job_id) == [] and stack.store.get_round(loop.id, 1).job_id is None
    with pytest.raises(RlvrError) as gone:
        await asyncio.to_thread(c.get_job, S.GetJobRequest(id=job_id))
    assert _code(gone) == "NOT_FOUND"
    for row in stack.store.list_jobs():  # rows made by hand above without a spec, which no job has
        if row.spec_json == "{}":
            stack.store.delete_job(row.id)
    listed = await asyncio.to_thread(c.list_jobs, S.ListJobsRequest(limit=500))
    assert job_id not in {j.id for j in listed.jobs} and listed.total == len(listed.jobs)
    with pytest.raises(RlvrError) as again:  # a second delete: the job is unknown now
        await asyncio.to_thread(delete, job_id)
    assert _code(again) == "NOT_FOUND"
    assert await asyncio.to_thread(cli, ["jobs", "delete", job_id, "--address", c.address]) == 1
    assert "error: NOT_FOUND" in capsys.readouterr().err
