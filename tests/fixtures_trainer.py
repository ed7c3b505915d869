"""Fixtures the trainer's model tests share: one torch thread for a module, and the test-size tiny
model built once under its own name. conftest.py imports them; a module takes the thread setting
with `pytestmark = pytest.mark.usefixtures("one_thread")`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

__all__ = ["one_thread", "tiny_model"]


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One torch thread: the "test" model's matrices are tiny, and on a shared 2-core machine a
    second thread made generation 4-15x slower (measured: 0.08 s vs 0.3-1.3 s for 8 x 32 tokens)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_model() -> str:
    from rlvr.tiny.build import build_tiny_model, default_model_dir

    return build_tiny_model(default_model_dir("trainer-tests-tiny-test"), size="test").path
