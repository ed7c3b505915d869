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
