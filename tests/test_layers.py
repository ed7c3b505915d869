"""The architecture contract (.importlinter) holds for the code, and `lint-imports` really fails when
a layer is crossed: each planted violation below is written into a copy of the sources and must
break the contract that forbids it, naming the offending import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}  # the copy's packages before the installed ones
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--config", str(root / ".importlinter")],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_the_code_keeps_every_contract() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout and result.stdout.count("KEPT") >= 5


@pytest.fixture(scope="module")
def copy_of_sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("layers")
    for package in ("rlvr", "services", "clients"):
        shutil.copytree(ROOT / package, root / package, symlinks=True,  # rlvr/services stays a link to services/
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "data", "static", "templates"))
    shutil.copy(ROOT / ".importlinter", root / ".importlinter")
    return root


PLANTED = [
    # (file, planted import, the contract that must break, the line lint-imports must print)
    ("rlvr/jobspec/fields.py", "import rlvr.clients.sdk", "layers: clients", "rlvr.jobspec.fields -> rlvr.clients.sdk"),
    ("rlvr/rewards/scoring.py", "import rlvr.services.reward.pool", "layers: clients",
     "rlvr.rewards.scoring -> rlvr.services.reward.pool"),
    ("services/trainer/job/config.py", "import rlvr.services.scheduler.loopspec", "independent of each other",
     "rlvr.services.trainer.job.config -> rlvr.services.scheduler.loopspec"),
    ("rlvr/common/settings.py", "import rlvr.jobspec", "layers: clients", "rlvr.common.settings -> rlvr.jobspec"),
    ("clients/views/jobs.py", "import rlvr.clients.commands.train", "no import cycles", "clients"),
    ("clients/cli.py", "import rlvr.services.scheduler.server", "over gRPC only", "rlvr.clients.cli -> rlvr.services.scheduler.server"),
]


@pytest.mark.parametrize(("path", "line", "contract", "shown"), PLANTED, ids=[p[0] for p in PLANTED])
def test_a_planted_violation_breaks_its_contract(copy_of_sources: Path, path: str, line: str, contract: str,
                                                 shown: str) -> None:
    target = copy_of_sources / path
    original = target.read_text()
    target.write_text(original + f"\n{line}  # planted by tests/test_layers.py\n")
    try:
        result = lint_imports(copy_of_sources)
    finally:
        target.write_text(original)
    assert result.returncode != 0, result.stdout
    broken = [row for row in result.stdout.splitlines() if row.endswith("BROKEN")]
    assert any(contract in row for row in broken), result.stdout
    assert shown in result.stdout.split("Broken contracts", 1)[1], result.stdout


def test_the_copy_is_clean_without_a_plant(copy_of_sources: Path) -> None:
    """The planted runs fail because of the plant, not because the copy differs from the repository."""
    result = lint_imports(copy_of_sources)
    assert result.returncode == 0, result.stdout + result.stderr
