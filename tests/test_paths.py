"""rlvr/common/paths.py: the one check that a client's path stays inside the server's roots, as the
reward service, the benchmark, the trainer and the scheduler's trackers apply it."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlvr.common import paths
from rlvr.common.errors import InvalidArgument
from rlvr.services.benchmark.planning import adapter_folder
from rlvr.services.trainer.job.artifacts import under_root
from rlvr.tasks.base import TaskError
from rlvr.tasks.sources import resolve_local


def test_dotdot_symlinks_and_the_root_itself(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    roots = paths.resolve_all([root])
    assert paths.is_under(paths.resolve(root), roots)  # the root itself is inside
    assert paths.is_under(paths.resolve(root / "sub" / "x.jsonl"), roots)
    assert not paths.is_under(paths.resolve(root / "sub" / ".." / ".." / "outside"), roots)
    assert not paths.is_under(paths.resolve(root / "escape" / "x"), roots)  # a symlink does not lead out
    assert not paths.is_under(paths.resolve(tmp_path / "rootless"), roots)  # a name sharing the prefix
    assert paths.resolve("sub", base=root) == (root / "sub").resolve()  # relative to a base


def test_every_caller_refuses_the_same_escape(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    (outside / "train.jsonl").write_text('{"prompt": "p", "ground_truth": "1"}\n')
    with pytest.raises(TaskError, match="outside the allowed data roots"):
        resolve_local(str(root / "escape" / "train.jsonl"), [root])
    with pytest.raises(InvalidArgument, match="adapter_path: .* is outside"):
        adapter_folder(str(root / "escape"), [root])
    with pytest.raises(InvalidArgument, match="outside the artifact root"):
        under_root(root, "escape/x", "init_adapter.path")
    assert under_root(root, "sub/x", "init_adapter.path") == (root / "sub" / "x").resolve()
