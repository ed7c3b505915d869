"""Architecture and random initialisation of the project's own small Qwen2 models.

The development and CI machines reach no model hub, so the demo, the tests and the benchmarks run on
models built here: a Qwen2-architecture causal LM (the family vLLM, TRL and peft all support) with
the character tokenizer of :mod:`rlvr.tiny.tokenizer`. This module only writes a *randomly
initialised* model; :mod:`rlvr.tiny.build` adds the supervised warm-up that makes it a useful base.

Sizes keep ``head_dim = 64``, a head size the vLLM CPU attention kernels support.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from rlvr.tasks.render import COMPACT_STYLE, MODEL_MARKER_FILE, PROMPT_STYLE_KEY
from rlvr.tiny.tokenizer import ENDOFTEXT, IM_END, save_tokenizer


@dataclass(frozen=True)
class ModelSize:
    """Shape of one model variant (``head_dim = hidden_size / num_attention_heads``)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    max_position_embeddings: int = 4096


_TEST_SHAPE = ModelSize(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=1,
    num_key_value_heads=1,
    intermediate_size=128,
)

# ~2.4M parameters: the default model's shape, which rlvr-tiny-headroom shares
_DEFAULT_SHAPE = ModelSize(
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=512,
)

SIZES: dict[str, ModelSize] = {
    # builds and trains in seconds; for tests only, its outputs are noise
    "test": _TEST_SHAPE,
    # the "test" shape (its own entry so it builds under its own name), warmed up ten times longer:
    # it writes the answer format and stops, and is right on a few percent of the problems, so loop
    # and reward tests see real, non-zero scores; still built in seconds
    "small": _TEST_SHAPE,
    # the default shape with whole-number tokens and a warm-up built for RL headroom (build.RECIPES)
    "headroom": _DEFAULT_SHAPE,
    # the headroom model's shape and warm-up plus calculator tool calls on a minority (build.RECIPES)
    "tools": _DEFAULT_SHAPE,
    # ~2.4M parameters: the size docs/design.md's CPU facts measured GRPO on (0.34 s per step at batch 8 on 2 cores)
    "default": _DEFAULT_SHAPE,
    # ~38M parameters: big enough that generation throughput is compute-bound, still fits 2 cores
    "bench-large": ModelSize(
        hidden_size=512,
        num_hidden_layers=12,
        num_attention_heads=8,
        num_key_value_heads=4,
        intermediate_size=1536,
    ),
}

# The embedding rows are padded to a multiple of this so matmuls stay aligned; unused rows are
# never produced by the tokenizer (vLLM accepts a model vocab larger than the tokenizer's).
_VOCAB_MULTIPLE = 64


def _padded_vocab(tokenizer_len: int) -> int:
    return -(-tokenizer_len // _VOCAB_MULTIPLE) * _VOCAB_MULTIPLE


def model_config(size: str, tokenizer_len: int):  # -> transformers.Qwen2Config
    """The ``Qwen2Config`` for ``size``, with token ids taken from the character tokenizer."""
    from transformers import Qwen2Config

    from rlvr.tiny.tokenizer import build_vocab

    if size not in SIZES:
        raise ValueError(f"unknown tiny model size {size!r}; choose one of {sorted(SIZES)}")
    shape = SIZES[size]
    endoftext_id = build_vocab()[ENDOFTEXT]
    im_end_id = _special_id(IM_END)
    config = Qwen2Config(
        vocab_size=_padded_vocab(tokenizer_len),
        tie_word_embeddings=True,  # halves the parameters of a model whose vocab is tiny anyway
        bos_token_id=None,
        eos_token_id=im_end_id,
        pad_token_id=endoftext_id,
        dtype="float32",
        **asdict(shape),
    )
    # Read by rlvr.tasks.render_prompt: this model was trained on the compact prompt form.
    setattr(config, PROMPT_STYLE_KEY, COMPACT_STYLE)
    return config


def _special_id(token: str) -> int:
    from rlvr.tiny.tokenizer import build_tokenizer

    return int(build_tokenizer().convert_tokens_to_ids(token))


def count_parameters(model) -> int:  # model: torch.nn.Module
    """Unique parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def init_model(size: str, seed: int, tokenizer_len: int):  # -> Qwen2ForCausalLM
    """A randomly initialised fp32 model, identical for the same (size, seed)."""
    import torch
    from transformers import Qwen2ForCausalLM

    config = model_config(size, tokenizer_len)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config.eos_token_id = [config.eos_token_id, config.pad_token_id]
    model.generation_config.pad_token_id = config.pad_token_id
    model.generation_config.bos_token_id = None
    return model


def save_model(model, out_dir: str | Path, number_tokens: int = 0, tool_tags: bool = False) -> Path:
    """Save model + tokenizer in Hugging Face format (safetensors) and the prompt-style marker
    (``number_tokens`` and ``tool_tags``: the tokenizer's options, as the model was built with)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    save_tokenizer(out, model_max_length=model.config.max_position_embeddings, number_tokens=number_tokens,
                   tool_tags=tool_tags)
    # A plain file too, for readers that only have the directory (e.g. a rollout server's config).
    (out / MODEL_MARKER_FILE).write_text(json.dumps({PROMPT_STYLE_KEY: COMPACT_STYLE}, indent=2) + "\n")
    return out


def build_untrained_model(out_dir: str | Path, size: str = "test", seed: int = 0) -> Path:
    """Write a randomly initialised Qwen2 causal LM with the character tokenizer to ``out_dir``.

    Loadable by ``AutoModelForCausalLM``/``AutoTokenizer`` and by vLLM. Returns ``out_dir``.
    """
    from rlvr.tiny.tokenizer import build_tokenizer

    model = init_model(size, seed, len(build_tokenizer()))
    return save_model(model, out_dir)
