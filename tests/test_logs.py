"""What the services' logging setup (rlvr/common/logs.py) lets through."""

from __future__ import annotations

import logging

import pytest

from rlvr.common.logs import quiet_optional_kernels


def test_bitsandbytes_missing_optional_kernels_is_no_warning_but_its_real_failures_are(
        caplog: pytest.LogCaptureFixture) -> None:
    """bitsandbytes 0.50 (imported by peft) warns on every start of a process on an AVX512-BF16
    host that the optional `kernels` package is missing, and goes on with its own kernel: the
    services' logging (configure_logging) and a job process's drop that one line, and keep the same
    warning with another cause."""
    quiet_optional_kernels()
    logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    text = ("Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please make sure you already "
            "`pip install kernels` and the kernels >= 0.11.1")  # bitsandbytes/backends/cpu/ops.py's own
    with caplog.at_level(logging.WARNING):
        logger.warning(text, ModuleNotFoundError("No module named 'kernels'"))
        logger.warning(text, RuntimeError("kernel hub unreachable"))
        logger.warning("something else")
    assert [r.getMessage().split(":", 1)[1].split(".")[0].strip() if "kernels-community" in r.getMessage()
            else r.getMessage() for r in caplog.records] == ["kernel hub unreachable", "something else"]
