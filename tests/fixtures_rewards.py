"""Reward plugins for the tests, installed the way pip installs any distribution's entry points: a
folder on sys.path (and PYTHONPATH, for the processes a test starts) holding the plugin's module and
its `<name>.dist-info` with `entry_points.txt`. Nothing is written into the environment itself.
"""

from __future__ import annotations

import os
import sys
import textwrap
import tomllib
from collections.abc import Iterator, Mapping
from importlib import metadata
from pathlib import Path

import pytest

from rlvr.rewards import registry

FAULTY_PLUGIN = '''
import asyncio, math, time
from rlvr.rewards import RewardOutput, Sample, reward

@reward("hangs", display_name="Hangs on HANG", columns=())
def hangs(sample: Sample) -> float:
    if "HANG" in sample.completion:
        time.sleep(60)
    return 1.0 if sample.completion.strip() == sample.ground_truth else 0.0

@reward("raises")
def raises(sample: Sample) -> float:
    if "BOOM" in sample.completion:
        raise ValueError("the checker cannot parse this")
    return 1.0

@reward("nan")
def nan(sample: Sample) -> float:
    return math.nan if "NAN" in sample.completion else 0.5

@reward("too_big")
def too_big(sample: Sample) -> float:
    return 1.5

@reward("says_yes")
def says_yes(sample: Sample):
    return "yes"

@reward("bad_parts")
def bad_parts(sample: Sample):
    return {"good": 1.0, "bad": -0.2}

@reward("short_batch", batch=True)
def short_batch(samples):
    return [1.0] * (len(samples) - 1)

@reward("length", batch=True)
def length(samples):
    """Shorter is better: 1 for an empty completion, 0 at 100 characters or more."""
    return [max(0.0, 1.0 - len(s.completion) / 100) for s in samples]

@reward("slow_async")
async def slow_async(sample: Sample) -> float:
    await asyncio.sleep(0.2)
    return 1.0 if sample.completion.strip() == sample.ground_truth else 0.0

@reward("labelled", columns=("label",))
def labelled(sample: Sample):
    return {"exact": float(sample.completion.strip() == str(sample.columns["label"])), "score": 1.0}

def not_a_reward(sample):
    return 1.0
'''

BROKEN_PLUGIN = '''
raise ImportError("this plugin needs a library that is not installed (rlvr_test_missing)")
'''

FAULTY_ENTRY_POINTS = {
    **{k: f"rlvr_test_faulty:{k}" for k in ("hangs", "raises", "nan", "too_big", "says_yes", "bad_parts",
                                            "short_batch", "length", "slow_async", "labelled")},
    "broken": "rlvr_test_broken:reward",
    "not_declared": "rlvr_test_faulty:not_a_reward",
    "math_pairs_again": "rlvr_test_faulty:hangs",  # its key is "hangs": refused, the name must match
}


def write_distribution(root: Path, name: str, modules: Mapping[str, str], entry_points: Mapping[str, str]) -> Path:
    """An installed distribution `name` in `root`: the modules and the dist-info pip would write."""
    root.mkdir(parents=True, exist_ok=True)
    for module, source in modules.items():
        (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{name.replace('-', '_')}-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    lines = "".join(f"{key} = {value}\n" for key, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\n{lines}")
    return root


ROOT = Path(__file__).resolve().parent.parent


def checkout_distribution(root: Path) -> Path:
    """A dist-info named rlvr in `root` with this checkout's entry points (pyproject.toml's)."""
    groups = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    info = root / "rlvr-0.1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rlvr\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in points.items()) for group, points in groups.items()))
    return root


@pytest.fixture
def checkout_entry_points(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """rlvr's own rewards as this checkout declares them, where rlvr's editable install predates its
    pyproject.toml (a checkout that added a built-in since `make install`): a dist-info named rlvr with
    this checkout's entry points, first on sys.path (and PYTHONPATH), shadows the stale one as a
    reinstall would. Nothing where the installed entry points are current."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][
        registry.ENTRY_POINT_GROUP]
    if set(declared) <= {e.name for e in metadata.entry_points(group=registry.ENTRY_POINT_GROUP)}:
        yield
        return
    root = checkout_distribution(tmp_path_factory.mktemp("checkout-dist"))
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(root))
        mp.setenv("PYTHONPATH", os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])]))
        registry.clear_cache()
        yield
    registry.clear_cache()


@pytest.fixture
def faulty_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The faulty test plugins on sys.path and PYTHONPATH, the registry reloaded with them; gone after."""
    root = write_distribution(tmp_path / "plugins", "rlvr-test-faulty",
                              {"rlvr_test_faulty": FAULTY_PLUGIN, "rlvr_test_broken": BROKEN_PLUGIN},
                              FAULTY_ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])]))
    registry.clear_cache()
    yield root
    for module in ("rlvr_test_faulty", "rlvr_test_broken"):
        sys.modules.pop(module, None)
    registry.clear_cache()
