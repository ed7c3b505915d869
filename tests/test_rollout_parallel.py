"""vLLM's tensor and data parallelism in the rollout server (tensor_parallel_size,
data_parallel_size): what cannot run here is refused at start with one line naming the setting,
before any engine is built; what can runs (the real vLLM CPU engine, marked slow: minutes to start
on 2 shared cores).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from rlvr.common.settings import SettingsError, load_settings
from rlvr.services.common.server import StartupError
from rlvr.services.rollout.settings import RolloutSettings


def _settings(tmp_path: Path, model: str, **fields: Any) -> RolloutSettings:
    return RolloutSettings(port=0, model=model, adapter_root=tmp_path / "adapters", max_model_len=512,
                           memory_fraction=0.1, **fields)


async def _start(settings: RolloutSettings) -> None:
    from rlvr.services.rollout.server import RolloutServicer

    servicer = RolloutServicer(settings)
    try:
        await servicer.start()
    finally:
        await servicer.stop()


def two_head_model(tiny_model: str, folder: Path) -> str:
    """The test-size tiny model with two attention heads (random weights): one head cannot be sharded."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    shutil.copytree(tiny_model, folder)
    config = AutoConfig.from_pretrained(folder)
    config.num_attention_heads = config.num_key_value_heads = 2
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return str(folder)


def test_sizes_are_settings_with_ranges() -> None:
    got = load_settings(RolloutSettings, ["--tensor-parallel-size", "2", "--data-parallel-size", "3"])
    assert (got.tensor_parallel_size, got.data_parallel_size) == (2, 3)
    assert (RolloutSettings().tensor_parallel_size, RolloutSettings().data_parallel_size) == (1, 1)
    with pytest.raises(SettingsError, match=r"^setting tensor_parallel_size \(--tensor-parallel-size / "
                                            r"RLVR_ROLLOUT_TENSOR_PARALLEL_SIZE\) = '0': .*greater than or equal to 1"):
        load_settings(RolloutSettings, ["--tensor-parallel-size", "0"])


async def test_what_cannot_run_is_refused_at_start(tmp_path: Path, tiny_model: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    with pytest.raises(StartupError, match=r"^setting data_parallel_size \(--data-parallel-size / "
                                           r"RLVR_ROLLOUT_DATA_PARALLEL_SIZE\) = 2: the transformers backend runs one "):
        await _start(_settings(tmp_path, tiny_model, backend="transformers", data_parallel_size=2))
    with pytest.raises(StartupError, match=r"^setting tensor_parallel_size .* = 2: the model's 1 attention heads "
                                           r"do not divide by it$"):
        await _start(_settings(tmp_path, tiny_model, backend="vllm", tensor_parallel_size=2))
    two = two_head_model(tiny_model, tmp_path / "two-heads")
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0})  # a one-core host
    with pytest.raises(StartupError, match=r"^setting tensor_parallel_size .* = 2: tensor_parallel_size x "
                                           r"data_parallel_size = 2 engine processes on a CPU host need a core each; "
                                           r"this process may use 1$"):
        await _start(_settings(tmp_path, two, backend="vllm", tensor_parallel_size=2))
    assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ  # nothing was started, nothing bound


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("sizes", [(2, 1), (1, 2)], ids=["tensor", "data"])
async def test_a_parallel_engine_generates_what_one_engine_does(tmp_path: Path, tiny_model: str,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 sizes: tuple[int, int]) -> None:
    from rlvr.clients.sdk import RolloutClient
    from rlvr.peers.types import BASE_MODEL, Sampling, generate_request, token_prompt
    from rlvr.services.common.server import ServiceRunner
    from rlvr.services.rollout.server import build_service

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two engine processes need two cores")
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "")  # unset for the server, and unset again after
    model = two_head_model(tiny_model, tmp_path / "two-heads")
    request = generate_request([token_prompt([5, 6, 7]), token_prompt([8, 9])],
                               Sampling(temperature=1.0, max_tokens=32, seed=4, group_size=2), BASE_MODEL)

    def completions(address: str) -> list[tuple[int, int, list[int]]]:
        with RolloutClient(address) as client:
            return sorted((c.prompt_index, c.sample_index, list(c.token_ids))
                          for r in client.generate(request) for c in r.completions)

    tokens = []
    for tp, dp in ((1, 1), sizes):
        settings = _settings(tmp_path / f"{tp}x{dp}", model, backend="vllm", tensor_parallel_size=tp,
                             data_parallel_size=dp, enforce_eager=True)
        async with ServiceRunner(build_service(settings), settings) as runner:
            tokens.append(await asyncio.to_thread(completions, runner.address))
    assert len(tokens[0]) == 4 and tokens[1] == tokens[0]
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"].count("|") == 1  # one core group per engine process
