"""The tiny base model: tokenizer round trip after reload, loading with transformers, generation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rlvr.tiny import build_untrained_model  # noqa: E402
from rlvr.tiny.tokenizer import FORMAT_TAGS, IM_END, IM_START  # noqa: E402

ROUND_TRIP_TEXTS = [
    "12 + 34 = 46",
    "  two leading spaces, trailing  ",
    "line one\nline two\n\n\ttab",
    "<think>3+4=7\n7*2=14</think><answer>14</answer>",
    "UTF-8: é ü 中文 € — ∑",
    "\\boxed{\\frac{1}{2}} $8,000.50",
]


@pytest.fixture(scope="module")
def untrained_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_untrained_model(tmp_path_factory.mktemp("tiny") / "model", size="test", seed=0)


@pytest.fixture(scope="module")
def tokenizer(untrained_dir: Path):
    return transformers.AutoTokenizer.from_pretrained(str(untrained_dir))


def test_reload_is_qwen2_byte_level(tokenizer) -> None:
    # transformers 5.x reloads qwen2 tokenizers as Qwen2Tokenizer; ours must survive that unchanged
    assert type(tokenizer).__name__ == "Qwen2Tokenizer"
    assert len(tokenizer) < 300  # character-level: 256 bytes + a few specials and tags


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_round_trip_after_reload(tokenizer, text: str) -> None:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_ascii_is_one_token_per_character(tokenizer) -> None:
    text = "a b\nc 1,234"
    assert len(tokenizer(text, add_special_tokens=False)["input_ids"]) == len(text)


def test_tags_are_single_tokens_and_survive_skip_special(tokenizer) -> None:
    for tag in FORMAT_TAGS:
        ids = tokenizer(tag, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1, tag
        assert tokenizer.decode(ids, skip_special_tokens=True) == tag


def test_chat_template_uses_special_tokens(tokenizer) -> None:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "1 2 3 4"}], tokenize=False, add_generation_prompt=True
    )
    assert text == f"{IM_START}user\n1 2 3 4{IM_END}\n{IM_START}assistant\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids.count(tokenizer.convert_tokens_to_ids(IM_START)) == 2
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\n1 2 3 4\nassistant\n"
    assert tokenizer.eos_token == IM_END


def test_untrained_model_loads_and_generates(untrained_dir: Path, tokenizer) -> None:
    files = {p.name for p in untrained_dir.iterdir()}
    assert "model.safetensors" in files and not any(name.endswith(".bin") for name in files)
    config = json.loads((untrained_dir / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["rlvr_prompt_style"] == "compact"
    assert config["hidden_size"] // config["num_attention_heads"] == 64  # a vLLM CPU head size

    model = transformers.AutoModelForCausalLM.from_pretrained(str(untrained_dir))
    assert model.dtype == torch.float32
    assert model.config.vocab_size >= len(tokenizer)
    batch = tokenizer(["1 2", "3 4 5 6"], return_tensors="pt", padding=True)
    out = model.generate(**batch, max_new_tokens=5, do_sample=False)
    prompt_len = batch["input_ids"].shape[1]
    assert out.shape[0] == 2 and prompt_len < out.shape[1] <= prompt_len + 5
    assert all(isinstance(text, str) for text in tokenizer.batch_decode(out[:, prompt_len:]))


def test_untrained_build_is_deterministic(tmp_path: Path, untrained_dir: Path) -> None:
    again = build_untrained_model(tmp_path / "again", size="test", seed=0)
    other = build_untrained_model(tmp_path / "other", size="test", seed=1)
    assert (again / "model.safetensors").read_bytes() == (untrained_dir / "model.safetensors").read_bytes()
    assert (other / "model.safetensors").read_bytes() != (untrained_dir / "model.safetensors").read_bytes()


# --- the warmed-up model -------------------------------------------------------------------------

from rlvr.tiny import BuildReport, build_tiny_model, default_model_dir, evaluate_heldout  # noqa: E402
from rlvr.tiny.__main__ import main  # noqa: E402
from rlvr.tiny.build import RECIPES, WarmupRecipe, torch_threads  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> BuildReport:
    return build_tiny_model(tmp_path_factory.mktemp("built") / "tiny-test", size="test", eval_n=32)


def test_build_report(built: BuildReport) -> None:
    path = Path(built.path)
    assert (path / "model.safetensors").is_file() and not path.with_name(path.name + ".partial").exists()
    saved = json.loads((path / "rlvr_build.json").read_text())
    assert saved == {**built.__dict__}
    assert built.size == "test" and built.heldout_n == 32 and 0.0 <= built.heldout_accuracy <= 1.0
    assert built.params == 103_104 and built.build_seconds > 0 and built.recipe["steps"] == 20


def test_existing_build_is_reused_unless_forced(built: BuildReport) -> None:
    messages: list[str] = []
    assert build_tiny_model(built.path, size="test", eval_n=32, progress=messages.append) == built
    assert messages and "reusing" in messages[0]


def test_build_is_deterministic(built: BuildReport, tmp_path: Path) -> None:
    again = build_tiny_model(tmp_path / "again", size="test", eval_n=8)
    first = (Path(built.path) / "model.safetensors").read_bytes()
    assert (Path(again.path) / "model.safetensors").read_bytes() == first


def _band_recipe(**fields: object) -> WarmupRecipe:
    base = dict(steps=100, batch_size=16, learning_rate=3e-3, warmup_steps=5, extra_chunk=50,
                extra_learning_rate=1e-3)
    return WarmupRecipe(**{**base, **fields})  # type: ignore[arg-type]


def test_a_build_below_its_band_trains_on_until_it_is_inside(tmp_path: Path) -> None:
    """The test shape after 100 warm-up steps gets nothing right; with a band of 1-50% the build
    goes on in chunks of 50 steps until it does, and says so."""
    from rlvr.tiny.build import heldout_accuracy, warm_up_into_band
    from rlvr.tiny.model import init_model
    from rlvr.tiny.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    model = init_model("test", 0, len(tokenizer))
    messages: list[str] = []
    evaluations: list[float] = []

    def evaluate() -> tuple[float, int]:
        accuracy, n = heldout_accuracy(model, tokenizer, 100)
        evaluations.append(accuracy)
        return accuracy, n

    with torch_threads():  # one thread, as builds run (many times faster on a shared machine)
        loss, accuracy, n, steps = warm_up_into_band(model, tokenizer, _band_recipe(band=(0.01, 0.5), extra_steps=400),
                                                     0, messages.append, evaluate)
    assert evaluations[0] < 0.01 <= accuracy <= 0.5 and accuracy == evaluations[-1] and n == 100
    assert steps > 100 and (steps - 100) % 50 == 0 and len(evaluations) == 1 + (steps - 100) // 50
    assert any("below the band 1%-50%: 50 more steps" in m for m in messages)


def test_a_build_outside_its_band_fails_loudly() -> None:
    from rlvr.tiny.build import BuildOutOfBand, warm_up_into_band
    from rlvr.tiny.model import init_model
    from rlvr.tiny.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    model = init_model("test", 0, len(tokenizer))
    with torch_threads(), pytest.raises(BuildOutOfBand, match=r"ended at 0\.0% greedy held-out accuracy after 150 "
                                                              r"steps, outside its band 90%-100%"):
        warm_up_into_band(model, tokenizer, _band_recipe(band=(0.9, 1.0), extra_steps=50), 0, None, lambda: (0.0, 10))


def test_built_model_answers_in_the_tag_format(built: BuildReport) -> None:
    from rlvr.tasks import math_pairs, render_prompt

    tokenizer = transformers.AutoTokenizer.from_pretrained(built.path)
    model = transformers.AutoModelForCausalLM.from_pretrained(built.path)
    prompt = render_prompt(tokenizer, math_pairs.heldout_problems(1)[0])
    batch = tokenizer([prompt], return_tensors="pt", add_special_tokens=False)
    out = model.generate(**batch, max_new_tokens=40, do_sample=False)
    text = tokenizer.decode(out[0, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    assert text.startswith("<think>")  # a tag token, kept by skip_special_tokens=True


def test_evaluate_heldout_matches_report(built: BuildReport) -> None:
    assert evaluate_heldout(built.path, n=32) == (built.heldout_accuracy, 32)


def test_default_model_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RLVR_HOME", str(tmp_path))
    assert default_model_dir("rlvr-tiny") == tmp_path / "models" / "rlvr-tiny"
    monkeypatch.delenv("RLVR_HOME")
    assert default_model_dir("x") == Path.home() / ".cache" / "rlvr" / "models" / "x"


def test_cli_prints_the_report(built: BuildReport, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", "--size", "test", "--out", built.path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["path"] == built.path
    with pytest.raises(ValueError, match="not a tiny model size"):
        build_tiny_model(built.path, size="huge")


@pytest.mark.slow
def test_default_model_lands_in_its_band(tmp_path: Path) -> None:
    """The bundled model starts every machine's first demo from a known place: its band (minutes on
    2 cores). RL must have room to improve."""
    report = build_tiny_model(tmp_path / "tiny", size="default")
    low, high = RECIPES["default"].band
    assert report.params == 2_445_568 and report.steps >= RECIPES["default"].steps
    assert low <= report.heldout_accuracy <= high, report


# --- the headroom variant's parts: whole-number tokens, the glance share, the gate ------------------


def test_number_tokens_make_each_sum_and_product_one_token() -> None:
    from rlvr.tiny.tokenizer import build_tokenizer

    plain, numbers = build_tokenizer(), build_tokenizer(number_tokens=325)
    text = "<think>3+4=7 5+6=11 7*11=77</think><answer>77</answer>"
    ids = numbers(text, add_special_tokens=False)["input_ids"]
    assert numbers.convert_ids_to_tokens(ids)[11:18] == ["11", "Ġ", "7", "*", "11", "=", "77"]
    assert numbers.decode(ids) == text and len(ids) < len(plain(text, add_special_tokens=False)["input_ids"])
    # 10-324 are new (0-9 are characters already), after every other token: those ids are unchanged
    assert len(numbers) == len(plain) + 315
    assert numbers.convert_tokens_to_ids("<answer>") == plain.convert_tokens_to_ids("<answer>")


def test_a_glance_share_answers_that_share_of_the_examples_without_the_chain() -> None:
    from rlvr.tiny.build import _examples
    from rlvr.tiny.tokenizer import build_tokenizer

    tokenizer = build_tokenizer(number_tokens=325)
    input_ids, _ = _examples(tokenizer, 40, seed=0, direct_share=0.55)
    texts = [tokenizer.decode(row, skip_special_tokens=True) for row in input_ids]
    assert sum("<think>~" in t for t in texts) == 22 and sum("+" in t for t in texts) == 18


def test_later_recipe_fields_keep_the_cached_builds_valid() -> None:
    from rlvr.tiny.build import recipe_record

    assert set(recipe_record(RECIPES["default"])) == {"steps", "batch_size", "learning_rate", "warmup_steps", "band",
                                                      "extra_steps", "extra_chunk", "extra_learning_rate"}
    assert recipe_record(RECIPES["headroom"])["number_tokens"] == 325


def test_a_build_below_its_gate_fails_loudly() -> None:
    """An untrained model is never right, so pass@16 and maj@16 equal greedy: below any gate."""
    from rlvr.tiny.build import BuildFailedGate, check_gate
    from rlvr.tiny.model import init_model
    from rlvr.tiny.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    model = init_model("test", 0, len(tokenizer))
    with torch_threads(), pytest.raises(BuildFailedGate, match=r"pass@16 0\.0% \(\+0\.0 points over greedy 0\.0%\)"):
        check_gate(model, tokenizer, (0.30, 0.05), eval_n=4, progress=None)


@pytest.mark.slow
def test_headroom_model_passes_its_gate(tmp_path: Path) -> None:
    """rlvr-tiny-headroom's build measures its own held-out gate and fails below it (minutes on
    2 cores): pass@16 and maj@16 stand well above greedy, so GRPO has a global habit to fix."""
    report = build_tiny_model(tmp_path / "headroom", size="headroom")
    assert report.gate is not None and report.params == 2_527_488
    greedy, passed, maj = (float(report.gate[k]) for k in ("greedy", "pass_at_k", "maj_at_k"))  # type: ignore[arg-type]
    assert passed - greedy >= 0.30 and maj - greedy >= 0.05 and greedy == report.heldout_accuracy
