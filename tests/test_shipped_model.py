"""The demo's base model ships built (rlvr/tiny/shipped.py): its name resolves to the package's copy,
installed under $RLVR_HOME/models with every file's sha256 checked against the manifest, never built;
a changed file is refused by name. A build's bits differ by CPU vendor, so this is what makes the
docs' figures hold on any machine."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest

from rlvr.clients import demo
from rlvr.models import resolve_model
from rlvr.tiny.build import RECIPES, default_build_dir, default_model_dir, default_model_name, recipe_record
from rlvr.tiny.shipped import (
    MANIFEST_FILE,
    SHIPPED_ROOT,
    ShippedModelError,
    compare_with_shipped,
    differences,
    file_sha256,
    install_shipped,
    manifest,
    shipped_files,
)

# model.safetensors as built on the AMD EPYC hosts the docs' figures come from (an Intel Xeon built
# 95cf8b6d...): docs/tiny-model.md
SHIPPED_SHA256_PREFIX = "34f9ce59"


def demo_model() -> str:
    """The base model `rlvr demo` trains when given no --model."""
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    return demo.demo_model(parser.parse_args([]))


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh $RLVR_HOME, and no build of a tiny model allowed in it."""
    import rlvr.tiny

    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("a shipped model was built instead of installed")

    monkeypatch.setenv("RLVR_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(rlvr.tiny, "build_tiny_model", no_build)
    return tmp_path / "home"


@pytest.fixture
def package_copy(tmp_path: Path) -> Path:
    """A copy of the package's shipped models, to change without touching the checkout."""
    root = tmp_path / "shipped"
    shutil.copytree(SHIPPED_ROOT, root)
    return root


def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))


def test_the_demo_trains_the_shipped_bits(home: Path) -> None:
    """Resolved the way the demo's services resolve it, the demo's model is the manifest's bits,
    installed without a build, and every file the manifest lists is the package's."""
    name = demo_model()
    files = shipped_files(name)
    folder = Path(resolve_model(name))
    assert folder == home / "models" / name == default_model_dir(name)
    assert {rel: file_sha256(folder / rel) for rel in files} == files
    assert files["model.safetensors"].startswith(SHIPPED_SHA256_PREFIX)
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json", "rlvr_model.json"} <= set(files)
    assert resolve_model(name) == str(folder)  # the second use checks the installed copy and reuses it
    assert not folder.with_name(name + ".partial").exists()


def test_the_shipped_model_loads_as_built(home: Path) -> None:
    """The shipped files are a whole model: transformers loads it and its tokenizer, at the size its
    build recorded, with the compact prompt form the tiny models declare."""
    transformers = pytest.importorskip("transformers")
    from rlvr.tasks.render import COMPACT_STYLE, model_dir_prompt_style

    name = demo_model()
    folder = resolve_model(name)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    assert sum(p.numel() for p in model.parameters()) == manifest()[name]["params"] == 2_527_488
    assert tokenizer.convert_tokens_to_ids("77") != tokenizer.unk_token_id  # whole-number tokens
    assert model_dir_prompt_style(Path(folder)) == COMPACT_STYLE


def test_an_installed_folder_that_differs_is_moved_aside_and_the_shipped_one_installed(home: Path) -> None:
    """A folder under the name that is not the bundled bits (a build from the recipe on another CPU
    vendor, a changed file) is never trained as the bundled model, and nothing of it is lost."""
    name = demo_model()
    folder = Path(resolve_model(name))
    flip_last_byte(folder / "tokenizer.json")
    changed = (folder / "tokenizer.json").read_bytes()
    said: list[str] = []
    assert Path(resolve_model(name, progress=said.append)) == folder
    assert differences(folder, shipped_files(name)) == []
    aside = folder.with_name(folder.name + ".local")
    assert (aside / "tokenizer.json").read_bytes() == changed
    assert any(f"moved to {aside}" in line and "tokenizer.json: sha256" in line for line in said), said
    (folder / "model.safetensors").unlink()
    resolve_model(name)
    assert folder.with_name(folder.name + ".local-2").is_dir()  # the earlier one is kept too
    assert file_sha256(folder / "model.safetensors") == shipped_files(name)["model.safetensors"]


def test_a_damaged_package_copy_is_refused_by_name(package_copy: Path, tmp_path: Path) -> None:
    name = demo_model()
    flip_last_byte(package_copy / name / "model.safetensors")
    out = tmp_path / "models" / name
    with pytest.raises(ShippedModelError, match=r"shipped .* is damaged \(model\.safetensors: sha256"):
        install_shipped(name, out, root=package_copy)
    assert not out.exists() and not out.with_name(name + ".partial").exists()


def test_the_manifest_records_the_current_recipe() -> None:
    """A changed recipe must ship a new build (`python -m rlvr.tiny ship`): the manifest records the
    recipe, size and seed its files were built from, and every file it lists ships."""
    entries = manifest()
    assert entries and set(entries) == {demo_model()}
    for name, entry in entries.items():
        size = str(entry["size"])
        assert default_model_name(size) == name and entry["seed"] == 0
        assert entry["recipe"] == recipe_record(RECIPES[size])
        listed = set(shipped_files(name))
        assert listed == {p.name for p in (SHIPPED_ROOT / name).iterdir()}, "a shipped file the manifest lacks"
    assert (SHIPPED_ROOT / MANIFEST_FILE).is_file()


def test_a_rebuild_goes_beside_and_says_whether_it_matches(home: Path, tmp_path: Path) -> None:
    """`rlvr models build-tiny --size headroom` writes `<name>.rebuilt`, never over the shipped copy,
    and says whether its bits are the shipped ones."""
    name = demo_model()
    size = str(manifest()[name]["size"])
    assert default_build_dir(size) == home / "models" / f"{name}.rebuilt"
    assert default_build_dir("small") == default_model_dir("rlvr-tiny-small")  # built, not shipped
    folder = Path(resolve_model(name))
    assert compare_with_shipped(name, folder).startswith(f"the build is bit for bit the shipped {name}")
    other = tmp_path / "rebuilt"
    shutil.copytree(folder, other)
    flip_last_byte(other / "model.safetensors")
    said = compare_with_shipped(name, other)
    assert said.startswith(f"the build differs from the shipped {name} (model.safetensors: sha256")
    assert "CPU vendor" in said


def test_the_calculator_demo_trains_the_tools_model_as_an_agent() -> None:
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    args = parser.parse_args(["--environment", "calculator", "--max-turns", "3"])
    spec = demo.demo_spec(args)
    assert spec.base_model == demo.TOOLS_MODEL == demo.demo_model(args)
    assert (spec.environment.key, spec.environment.max_turns) == ("calculator", 3)
    assert not spec.advanced.dynamic_sampling  # refused with an environment
    assert demo.demo_spec(parser.parse_args([])).environment.key == ""
