"""Structured logs: one JSON object per line on stderr (or plain text for people), with the
service name on every record, so the logs of a multi-service stack can be merged and filtered."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        # Fields passed with `extra=` become top-level keys.
        for key, value in vars(record).items():
            if key not in _STANDARD:
                entry[key] = value if isinstance(value, str | int | float | bool | None) else str(value)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


_OPTIONAL_KERNELS_LOGGER = "bitsandbytes.backends.cpu.ops"


def _not_the_missing_kernels_package(record: logging.LogRecord) -> bool:
    """False for bitsandbytes' warning that the optional `kernels` package is not installed."""
    message = record.getMessage()
    return not ("kernels-community" in message and "No module named 'kernels'" in message)


def quiet_optional_kernels() -> None:
    """bitsandbytes (which peft imports) looks for the optional `kernels` package's CPU 4-bit kernel
    on a host with AVX512-BF16, warns "Failed to load CPU gemm_4bit_forward from kernels-community:
    No module named 'kernels'" when it is not installed, and uses its own kernel: nothing is wrong,
    yet every process that imports peft said so. Only that case is dropped: `kernels` installed but
    failing still warns, as does anything else of that logger. A filter on the logger itself, so it
    holds whatever handlers are set up later."""
    logger = logging.getLogger(_OPTIONAL_KERNELS_LOGGER)
    if _not_the_missing_kernels_package not in logger.filters:
        logger.addFilter(_not_the_missing_kernels_package)


def configure_logging(service: str, level: str = "INFO", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(service))
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Third-party chatter at INFO drowns the service's own lines.
    for noisy in ("httpx", "urllib3", "filelock", "asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(level)))
    quiet_optional_kernels()
