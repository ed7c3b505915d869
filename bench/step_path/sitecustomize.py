"""Loaded by every Python process of a traced stack (bench/step_path.py puts this folder first on
PYTHONPATH): records when each of the project's own source files is entered, so the bench can tell
which files one training step runs through, in every process at once.

RLVR_TRACE_DIR: where each process writes `<pid>.json` (every second and at exit);
RLVR_TRACE_ROOT: the checkout whose files are counted (tests/ and bench/ are not).
It also records TRL's `GRPOTrainer.training_step` calls, the step boundaries.
"""

import atexit
import json
import os
import sys
import threading
import time

_DIR = os.environ.get("RLVR_TRACE_DIR")
_ROOT = os.environ.get("RLVR_TRACE_ROOT", "")
if _DIR and _ROOT:
    _root = os.path.realpath(_ROOT) + os.sep
    _skip = tuple(os.path.join(_root, d) + os.sep for d in ("tests", "bench", ".venv"))
    _seen: dict[str, list[float]] = {}  # file -> entry times (10 ms resolution)
    _steps: list[float] = []
    _known: dict[str, str | None] = {}  # co_filename -> the counted path, or None

    def _path(filename: str) -> str | None:
        p = _known.get(filename, "")
        if p == "" and filename.startswith("<"):  # <frozen os>, <string>, generated code: no file
            p = _known[filename] = None
        if p == "":
            real = os.path.realpath(filename)
            p = real[len(_root):] if real.startswith(_root) and not real.startswith(_skip) else None
            _known[filename] = p
        return p

    def _prof(frame, event, arg):  # noqa: ARG001
        if event != "call":
            return
        code = frame.f_code
        if code.co_name == "training_step" and code.co_filename.endswith("grpo_trainer.py"):
            _steps.append(time.time())
        p = _path(code.co_filename)
        if p is not None:
            t = round(time.time(), 2)
            times = _seen.setdefault(p, [])
            if not times or times[-1] != t:
                times.append(t)

    def _dump() -> None:
        data = {"pid": os.getpid(), "argv": sys.argv[:3], "steps": _steps, "files": _seen}
        tmp = os.path.join(_DIR, f".{os.getpid()}.tmp")
        try:
            with open(tmp, "w") as f:
                json.dump(data, f)
            os.replace(tmp, os.path.join(_DIR, f"{os.getpid()}.json"))
        except (OSError, RuntimeError):
            pass

    def _flusher() -> None:
        while True:
            time.sleep(1.0)
            _dump()

    def _start() -> None:
        threading.Thread(target=_flusher, daemon=True, name="rlvr-trace").start()

    def _forked() -> None:  # a forked worker (a process pool) keeps the hook, not the flusher thread
        _seen.clear()
        _steps.clear()
        _start()

    sys.setprofile(_prof)
    threading.setprofile(_prof)
    _start()
    os.register_at_fork(after_in_child=_forked)
    atexit.register(_dump)
