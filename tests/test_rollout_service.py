"""The rollout server as a user meets it: its own process, real gRPC on loopback, the SDK, on the
transformers backend and on the real vLLM engine (CPU build)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest
from test_bootstrap import _free_port, _wait_serving
from test_rollout_core import make_lora

from rlvr.clients.sdk import RlvrError, RolloutClient
from rlvr.tiny import build_untrained_model
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import rollout_pb2 as ro

QUESTION = [C.ChatMessage(role="user", content="What is 12+7?")]


@pytest.fixture(scope="module")
def rollout_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_untrained_model(tmp_path_factory.mktemp("tiny") / "model", size="test", seed=0)


@pytest.fixture(scope="module")
def adapters(rollout_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("loras")
    return {"v1": make_lora(rollout_model, root / "v1", seed=1), "v2": make_lora(rollout_model, root / "v2", seed=2),
            "big": make_lora(rollout_model, root / "big", seed=3, r=16)}


@pytest.fixture(scope="module", params=["transformers", pytest.param("vllm", marks=pytest.mark.vllm)])
def rollout(request: pytest.FixtureRequest, rollout_model: Path, tmp_path_factory: pytest.TempPathFactory):
    port = _free_port()
    log = tmp_path_factory.mktemp("log") / "rollout.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlvr.services.rollout.main", "--port", str(port), "--model", str(rollout_model),
             "--backend", request.param, "--max-lora-rank", "8", "--max-model-len", "512",
             "--adapter-root", str(tmp_path_factory.mktemp("adapters")), "--max-adapter-bytes", "262144",
             "--memory-fraction", "0.1"],
            stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_serving(f"127.0.0.1:{port}", timeout=240)
    except TimeoutError:
        proc.kill()
        pytest.fail(f"rollout did not start:\n{log.read_text()[-3000:]}")
    client = RolloutClient(f"127.0.0.1:{port}")
    yield client, request.param, str(rollout_model)
    proc.terminate()
    assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]


def _generate(client: RolloutClient, n: int = 1, max_tokens: int = 32, temperature: float = 0.0, seed: int | None = None,
              adapter: tuple[str, int] = ("", 0), prompts: int = 1) -> list[ro.Completion]:
    sampling = C.SamplingParams(temperature=temperature, max_tokens=max_tokens, top_p=1.0)
    if seed is not None:
        sampling.seed = seed
    request = ro.GenerateRequest(prompts=[ro.Prompt(messages=ro.ChatMessages(messages=QUESTION))] * prompts, n=n,
                                 sampling=sampling, adapter=C.AdapterSelector(name=adapter[0], version=adapter[1]))
    return [c for resp in client.generate(request) for c in resp.completions]


def test_info_and_shapes(rollout) -> None:
    client, backend, model = rollout
    info = client.get_info()
    assert info.backend == backend and info.model == model and info.max_lora_rank == 8
    # dtype auto on this CPU host: float32 (the engine matches an fp32 trainer), on the CPU
    assert (info.dtype, info.device) == ("float32", "cpu")
    out = _generate(client, n=3, prompts=2, temperature=1.0, seed=1)
    assert sorted((c.prompt_index, c.sample_index) for c in out) == [(p, s) for p in range(2) for s in range(3)]
    for c in out:
        assert len(c.logprobs) == len(c.token_ids) and all(lp <= 0 for lp in c.logprobs)
        assert c.prompt_token_ids and c.adapter_version == 0
        # an untrained model rarely stops by itself: a cut-off must say so
        assert c.finish_reason in (C.FINISH_REASON_STOP, C.FINISH_REASON_LENGTH)
        if len(c.token_ids) == 32:
            assert c.finish_reason == C.FINISH_REASON_LENGTH


def test_seeds_reproduce(rollout) -> None:
    client, _, _ = rollout
    a = [c.token_ids for c in _generate(client, n=2, temperature=1.0, seed=7)]
    b = [c.token_ids for c in _generate(client, n=2, temperature=1.0, seed=7)]
    c = [c.token_ids for c in _generate(client, n=2, temperature=1.0, seed=8)]
    assert a == b and a != c


def test_versions_go_live_and_bad_uploads_leave_them(rollout, adapters, tmp_path: Path) -> None:
    client, backend, _ = rollout
    name = f"job-{backend}"
    base = [c.token_ids for c in _generate(client)]
    info = client.load_adapter(name, 1, adapters["v1"], chunk_size=4096)  # many chunks
    assert (info.name, info.version, info.rank) == (name, 1, 4) and info.size_bytes > 4096
    v1 = _generate(client, adapter=(name, 0))
    assert v1[0].adapter_version == 1 and v1[0].adapter_name == name and [c.token_ids for c in v1] != base
    client.load_adapter(name, 2, adapters["v2"])
    v2 = _generate(client, adapter=(name, 0))
    assert v2[0].adapter_version == 2 and v2[0].token_ids != v1[0].token_ids

    def code(fn) -> grpc.StatusCode:
        with pytest.raises(RlvrError) as err:
            fn()
        return err.value.code

    assert code(lambda: client.load_adapter(name, 2, adapters["v1"])) == grpc.StatusCode.FAILED_PRECONDITION
    assert code(lambda: client.load_adapter(name, 1, adapters["v1"])) == grpc.StatusCode.FAILED_PRECONDITION
    assert code(lambda: client.load_adapter(name, 3, adapters["big"])) == grpc.StatusCode.INVALID_ARGUMENT  # rank 16 > 8
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "adapter_config.json").write_bytes((adapters["v1"] / "adapter_config.json").read_bytes())
    (corrupt / "adapter_model.safetensors").write_bytes(b"\x00" * 64)
    assert code(lambda: client.load_adapter(name, 3, corrupt)) == grpc.StatusCode.INVALID_ARGUMENT
    assert code(lambda: client.load_adapter("../evil", 1, adapters["v1"])) == grpc.StatusCode.INVALID_ARGUMENT
    # The live version is untouched: still 2, same output.
    again = _generate(client, adapter=(name, 0))
    assert again[0].adapter_version == 2 and again[0].token_ids == v2[0].token_ids
    assert code(lambda: _generate(client, adapter=(name, 1))) == grpc.StatusCode.NOT_FOUND  # stale: as the contract says
    assert code(lambda: _generate(client, adapter=("nobody", 0))) == grpc.StatusCode.NOT_FOUND
    listed = {a.name: a.version for a in client.list_adapters().adapters}
    assert listed[name] == 2
    assert client.unload_adapter(ro.UnloadAdapterRequest(name=name)).version == 2
    assert code(lambda: _generate(client, adapter=(name, 0))) == grpc.StatusCode.NOT_FOUND


def test_two_jobs_concurrently(rollout, adapters) -> None:
    client, backend, _ = rollout
    client.load_adapter(f"a-{backend}", 1, adapters["v1"])
    client.load_adapter(f"b-{backend}", 5, adapters["v2"])
    results: dict[str, list[ro.Completion]] = {}

    def run(name: str) -> None:
        results[name] = _generate(client, n=2, prompts=2, adapter=(name, 0))

    threads = [threading.Thread(target=run, args=(f"{k}-{backend}",)) for k in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert {c.adapter_version for c in results[f"a-{backend}"]} == {1}
    assert {c.adapter_version for c in results[f"b-{backend}"]} == {5}


def test_bad_requests(rollout) -> None:
    client, _, _ = rollout
    bad = [
        (ro.GenerateRequest(), "prompts"),
        (ro.GenerateRequest(prompts=[ro.Prompt(text="hi")], sampling=C.SamplingParams(max_tokens=4096)),
         "sampling.max_tokens"),
        (ro.GenerateRequest(prompts=[ro.Prompt(text="hi")], n=100), "n"),
        (ro.GenerateRequest(prompts=[ro.Prompt(text="hi")], sampling=C.SamplingParams(temperature=3)),
         "sampling.temperature"),
        (ro.GenerateRequest(prompts=[ro.Prompt(text="hi")], sampling=C.SamplingParams(top_k=1001)),
         "sampling.top_k: 1001 is out of range; allowed: 0-1000 (0 = off)"),
        (ro.GenerateRequest(prompts=[ro.Prompt(text="hi")], sampling=C.SamplingParams(min_p=1.5)),
         "sampling.min_p: 1.5 is out of range; allowed: [0, 1] (0 = off)"),
        (ro.GenerateRequest(prompts=[ro.Prompt(text="hi")], sampling=C.SamplingParams(repetition_penalty=-1)),
         "sampling.repetition_penalty: -1.0 is out of range; allowed: (0, 2] (0 = 1.0, off)"),
        (ro.GenerateRequest(prompts=[ro.Prompt(messages=ro.ChatMessages(messages=[
            C.ChatMessage(role="system", content="be brief"), C.ChatMessage(role="usr", content="hi"),
            C.ChatMessage(role="", content="?")]))]),
         "prompts[0].messages[1].role: 'usr'; prompts[0].messages[2].role: '' is not a chat role; use one of "
         "system, user, assistant, tool"),
    ]
    for request, field in bad:
        with pytest.raises(RlvrError) as err:
            list(client.generate(request))
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.details.startswith(field)
    with pytest.raises(RlvrError) as err:
        list(client.generate(ro.GenerateRequest(prompts=[ro.Prompt(text="hi")], model="Qwen/Qwen2.5-0.5B")))
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION and "restart" in err.value.details


def test_greedy_group_is_n_identical_completions(rollout) -> None:
    client, _, _ = rollout
    out = _generate(client, n=3, temperature=0.0)
    assert [c.sample_index for c in out] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out}) == 1
