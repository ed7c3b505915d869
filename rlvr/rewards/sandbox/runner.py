"""Run untrusted Python against tests in a sandboxed child process: the code reward's engine (the
host side; rlvr.rewards.sandbox re-exports it).

A :class:`Sandbox` starts one *zygote* (``zygote.py`` beside this file, a pre-started interpreter with an
empty environment) and sends it each run; the zygote forks a child per run, locks it down and
reports back. docs/code-reward.md lists the layers, their fallbacks and the limits.

>>> with Sandbox() as sandbox:  # doctest: +SKIP
...     sandbox.run("def f(x):\\n    return x + 7", ["assert f(1) == 8", "assert f(2) == 10"])
TestRun(passed=1, total=2, reason='', details=('pass', 'fail: got 9'))

The reward (:func:`score_completion`): the fraction of tests passed, and strict = all of them.
Any limit hit or blocked operation scores the whole completion 0 with a named ``reason``, never
partial credit. A failure of the sandbox itself (its zygote cannot start, or dies) raises
:class:`SandboxError`: that is not the completion's fault, and it must not be scored as one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import subprocess
import sys
import threading
import weakref
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, fields
from pathlib import Path
from typing import IO, Any

from rlvr.rewards.code_tests import PreparedTest, extract_code, judge, parse_tests, prepare_test

__all__ = ["DEFAULT_ALLOWED_IMPORTS", "Sandbox", "SandboxError", "SandboxLimits", "TestRun",
           "extract_code", "parse_tests", "score_completion"]

MiB = 1 << 20
MAX_CODE_CHARS = 100_000
START_TIMEOUT_S = 30.0
ZYGOTE = Path(__file__).with_name("zygote.py")

# What code may import: pure computation from the standard library (the zygote preloads these).
DEFAULT_ALLOWED_IMPORTS = frozenset({
    "__future__", "abc", "array", "base64", "binascii", "bisect", "calendar", "cmath", "collections",
    "contextlib", "copy", "dataclasses", "datetime", "decimal", "difflib", "enum", "fractions",
    "functools", "graphlib", "hashlib", "heapq", "io", "itertools", "json", "keyword", "math",
    "numbers", "operator", "pprint", "random", "re", "statistics", "string", "struct", "sys",
    "textwrap", "time", "types", "typing", "unicodedata", "zlib",
})


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start, its zygote died, it was closed): no score."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-run limits (each run is one completion's code and all its tests).

    ``cpu_seconds`` (RLIMIT_CPU, whole seconds rounded up, 0.1-600) and ``wall_seconds``
    (the zygote's deadline, 0.1-600) bound time; ``memory_bytes`` (RLIMIT_AS, 64 MiB-64 GiB) the
    address space, the interpreter's own ~30 MiB included; ``file_bytes`` (RLIMIT_FSIZE, 4 KiB-1 GiB)
    each file, stdout and stderr included (they go to a file in the run's directory);
    ``processes`` (RLIMIT_NPROC, 1-4096) the processes of the run's user, every run's and any other
    process of ``nobody`` included; ``open_files`` (RLIMIT_NOFILE, 16-4096); ``disk_bytes`` (the
    size of the private tmpfs holding every run's directory, 1 MiB-64 GiB; namespaces only).
    """

    cpu_seconds: float = 2.0
    wall_seconds: float = 5.0
    memory_bytes: int = 512 * MiB
    file_bytes: int = 1 * MiB
    processes: int = 16
    open_files: int = 64
    disk_bytes: int = 256 * MiB

    def __post_init__(self) -> None:
        ranges = {"cpu_seconds": (0.1, 600), "wall_seconds": (0.1, 600), "memory_bytes": (64 * MiB, 64 << 30),
                  "file_bytes": (4096, 1 << 30), "processes": (1, 4096), "open_files": (16, 4096),
                  "disk_bytes": (MiB, 64 << 30)}
        for f in fields(self):
            value, (low, high) = getattr(self, f.name), ranges[f.name]
            if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
                raise ValueError(f"SandboxLimits.{f.name} must be a number from {low} to {high}, got {value!r}")
            if f.name.endswith(("_bytes", "processes", "files")) and not isinstance(value, int):
                raise ValueError(f"SandboxLimits.{f.name} must be an integer, got {value!r}")


@dataclass(frozen=True)
class TestRun:
    """How one run went: ``passed`` of ``total`` tests; ``reason`` "" when the run went to its end,
    else why it scores 0 (``passed`` is then 0); ``details`` one "pass"/"fail: ..." per test."""

    __test__ = False  # not a pytest class

    passed: int
    total: int
    reason: str = ""
    details: tuple[str, ...] = ()

    @property
    def fraction(self) -> float:
        """The reward: the fraction of tests passed."""
        return self.passed / self.total if self.total else 0.0

    @property
    def all_passed(self) -> bool:
        """Strict accuracy: every test passed."""
        return self.total > 0 and self.passed == self.total and not self.reason


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", 1024)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} bytes"


def format_reason(code: str, limits: SandboxLimits) -> str:
    """The zygote's reason code in words, with the limit that was hit."""
    kind, _, detail = code.partition(":")
    words = {
        "wall": f"wall-time limit {limits.wall_seconds:g} s",
        "cpu": f"cpu-time limit {limits.cpu_seconds:g} s",
        "memory": f"memory limit {_size(limits.memory_bytes)}",
        "output": f"output/file-size limit {_size(limits.file_bytes)}",
        "blocked": f"blocked: {detail}",
        "syntax": f"syntax error: {detail}",
        "raised": f"code raised {detail} before the tests",
        "crash": f"crashed ({detail})",
        "noresult": f"exited without a result (status {detail})",
        "malformed": "malformed report (the code wrote to the sandbox's report channel)",
        "shutdown": "sandbox closed during the run",
    }
    return words.get(kind, code)


def _result(frame: dict[str, Any], tests: list[PreparedTest], limits: SandboxLimits) -> TestRun:
    total = len(tests)
    if frame.get("reason"):
        return TestRun(0, total, format_reason(frame["reason"], limits))
    try:
        report = json.loads(frame["payload"])
        if "error" in report:
            return TestRun(0, total, format_reason(str(report["error"]), limits))
        outcomes = report["outcomes"]
        if not isinstance(outcomes, list) or len(outcomes) != total:
            raise ValueError
    except (ValueError, KeyError, TypeError, RecursionError):
        return TestRun(0, total, format_reason("malformed", limits))
    judged = [judge(test, outcome) for test, outcome in zip(tests, outcomes, strict=True)]
    return TestRun(sum(ok for ok, _ in judged), total, "", tuple(detail for _, detail in judged))


class _Zygote:
    """One zygote process, the thread its parent-death signal follows, and the reader of its replies."""

    def __init__(self, cmd: list[str], limits: SandboxLimits) -> None:
        self.limits = limits
        self.pending: dict[int, tuple[Future[TestRun], list[PreparedTest]]] = {}
        self.pending_lock, self.write_lock = threading.Lock(), threading.Lock()
        self.next_id = 0
        self.dead: str | None = None
        self.hello: dict[str, Any] = {}
        self.pids: tuple[int, ...] = ()
        self.ready, self.stop = threading.Event(), threading.Event()
        self.proc: subprocess.Popen[bytes] | None = None
        self.reader: threading.Thread | None = None
        spawned = threading.Event()
        errors: list[BaseException] = []

        def keeper() -> None:  # PR_SET_PDEATHSIG fires when the *thread* that forked exits: this one waits
            try:
                self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={}, cwd="/",
                                             close_fds=True, start_new_session=True)
            except OSError as exc:
                errors.append(exc)
            spawned.set()
            self.stop.wait()

        self.keeper = threading.Thread(target=keeper, name="sandbox-zygote-keeper", daemon=True)
        self.keeper.start()
        spawned.wait()
        if errors or self.proc is None:
            self.stop.set()
            raise SandboxError(f"cannot start the sandbox's zygote ({cmd[0]}): {errors[0] if errors else '?'}")
        self.reader = threading.Thread(target=self._read, name="sandbox-zygote-reader", daemon=True)
        self.reader.start()
        if not self.ready.wait(START_TIMEOUT_S) or self.dead:
            why = self.dead or f"no answer in {START_TIMEOUT_S:g} s"
            self.close()
            raise SandboxError(f"the sandbox's zygote did not start: {why}")

    def _read_frame(self, stream: IO[bytes]) -> dict[str, Any] | None:
        head = stream.read(4)
        if len(head) < 4:
            return None
        (size,) = struct.unpack(">I", head)
        data = stream.read(size)
        return json.loads(data) if len(data) == size else None

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        try:
            hello = self._read_frame(self.proc.stdout)
            if hello is None or "error" in hello:
                self.dead = (hello or {}).get("error", "it exited during start-up")
                return
            self.hello = hello
            outer = self.proc.pid
            try:
                inner = Path(f"/proc/{outer}/task/{outer}/children").read_text().split()
            except OSError:
                inner = []
            self.pids = (outer, *map(int, inner))
            self.ready.set()
            while (frame := self._read_frame(self.proc.stdout)) is not None:
                with self.pending_lock:
                    future, tests = self.pending.pop(frame["id"])
                if "error" in frame:
                    future.set_exception(SandboxError(f"the sandbox failed: {frame['error']}"))
                    continue
                try:
                    future.set_result(_result(frame, tests, self.limits))
                except Exception as exc:  # a bug of ours: the caller hears it
                    future.set_exception(exc)
        except (OSError, ValueError) as exc:
            self.dead = f"reading its replies failed: {exc}"
        finally:
            if self.dead is None:
                status: int | None = None
                with contextlib.suppress(subprocess.TimeoutExpired):
                    status = self.proc.wait(timeout=5)
                self.dead = f"the sandbox's zygote exited (status {status})"
            self.ready.set()
            self._fail_pending(self.dead)

    def _fail_pending(self, why: str) -> None:
        with self.pending_lock:
            pending, self.pending = self.pending, {}
        for future, _ in pending.values():
            future.set_exception(SandboxError(why))

    def submit(self, code: str, tests: list[PreparedTest]) -> Future[TestRun]:
        future: Future[TestRun] = Future()
        with self.pending_lock:
            if self.dead:
                raise SandboxError(self.dead)
            run_id, self.next_id = self.next_id, self.next_id + 1
            self.pending[run_id] = (future, tests)
        data = json.dumps({"op": "run", "id": run_id, "code": code,
                           "tests": [[t.kind, t.source] for t in tests]}).encode()
        assert self.proc is not None and self.proc.stdin is not None
        try:
            with self.write_lock:
                self.proc.stdin.write(struct.pack(">I", len(data)) + data)
                self.proc.stdin.flush()
        except (OSError, ValueError) as exc:
            with self.pending_lock:
                self.pending.pop(run_id, None)
            raise SandboxError(f"the sandbox's zygote is gone: {exc}") from exc
        return future

    def close(self) -> None:
        proc = self.proc
        if proc is not None:
            try:
                with self.write_lock:
                    assert proc.stdin is not None
                    proc.stdin.close()  # the zygote's cue: kill the runs, clean up, exit
            except (OSError, ValueError):
                pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                for pid in reversed(self.pids or (proc.pid,)):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, 9)
                proc.wait()
        self.stop.set()
        if self.reader is not None:
            self.reader.join(timeout=10)
        self._fail_pending("the sandbox was closed")
        base = self.hello.get("base")
        if base and not self.hello.get("private_base"):
            shutil.rmtree(base, ignore_errors=True)  # normally removed by the zygote already


def _close_current(current: list[_Zygote | None]) -> None:
    zygote, current[0] = current[0], None
    if zygote is not None:
        zygote.close()


class Sandbox:
    """Runs code against tests, one sandboxed child per run; thread-safe and reusable.

    ``workers``: runs at once (default: the CPUs this process may use); more wait in the zygote's
    queue (their wall time starts when they start). ``allowed_imports``: the top-level modules code
    may import. ``python_guards=False`` removes the innermost layer (audit hook and import
    allowlist), and ``namespaces=False`` the namespace layers: only to test the other layers.
    The zygote starts on first use and again if it dies; ``close()`` kills everything it started.
    """

    def __init__(self, limits: SandboxLimits = SandboxLimits(), *, workers: int | None = None,
                 allowed_imports: Iterable[str] = DEFAULT_ALLOWED_IMPORTS, python_guards: bool = True,
                 namespaces: bool = True, python: str | None = None) -> None:
        self.limits = limits
        self.workers = workers or len(os.sched_getaffinity(0)) or 1
        if not 1 <= self.workers <= 1024:
            raise ValueError(f"workers must be from 1 to 1024, got {workers!r}")
        self.allowed_imports = frozenset(allowed_imports)
        self.python_guards, self.namespaces = python_guards, namespaces
        self.python = python or sys.executable
        self._lock = threading.Lock()
        self._zygote: _Zygote | None = None
        self._closed = False
        # A Sandbox dropped without close(): its zygote goes with it (the threads hold the zygote,
        # not the Sandbox, so the Sandbox can be collected).
        self._current: list[_Zygote | None] = [None]
        weakref.finalize(self, _close_current, self._current)

    def _command(self) -> list[str]:
        cfg = {"parent": os.getpid(), "cpu": self.limits.cpu_seconds, "wall": self.limits.wall_seconds,
               "memory": self.limits.memory_bytes, "file": self.limits.file_bytes,
               "processes": self.limits.processes, "open_files": self.limits.open_files,
               "disk": self.limits.disk_bytes, "workers": self.workers, "guards": self.python_guards,
               "namespaces": self.namespaces, "allowed": sorted(self.allowed_imports)}
        return [self.python, "-I", "-S", "-B", str(ZYGOTE), json.dumps(cfg)]

    def _live_zygote(self) -> _Zygote:
        with self._lock:
            if self._closed:
                raise SandboxError("the sandbox is closed")
            if self._zygote is None or self._zygote.dead:
                if self._zygote is not None:
                    self._zygote.close()
                self._zygote = self._current[0] = None
                self._zygote = self._current[0] = _Zygote(self._command(), self.limits)
            return self._zygote

    def submit(self, code: str, tests: Sequence[str]) -> Future[TestRun]:
        """Start a run; its future holds the :class:`TestRun` (or a :class:`SandboxError`)."""
        if isinstance(tests, str) or not tests:
            raise ValueError("tests: give a non-empty list of test strings (parse_tests turns a column value into one)")
        prepared = [prepare_test(test) for test in tests]
        if len(code) > MAX_CODE_CHARS:
            done: Future[TestRun] = Future()
            done.set_result(TestRun(0, len(prepared), f"code too long ({len(code)} characters, limit {MAX_CODE_CHARS})"))
            return done
        return self._live_zygote().submit(code, prepared)

    def run(self, code: str, tests: Sequence[str]) -> TestRun:
        """Run ``code`` and then each test in its namespace (see :mod:`rlvr.rewards.code_tests`)."""
        return self.submit(code, tests).result()

    def run_many(self, items: Iterable[tuple[str, Sequence[str]]]) -> list[TestRun]:
        """Several runs at once (up to ``workers`` in parallel), results in order."""
        futures = [self.submit(code, tests) for code, tests in items]
        return [future.result() for future in futures]

    def isolation(self) -> dict[str, str]:
        """What is enforced on this host, layer by layer (starts the zygote to find out)."""
        zygote = self._live_zygote()
        iso = dict(zygote.hello.get("isolation", {}))
        lim = self.limits
        iso["limits"] = (f"setrlimit cpu {lim.cpu_seconds:g} s, address space {_size(lim.memory_bytes)}, "
                         f"file size {_size(lim.file_bytes)}, processes {lim.processes}, "
                         f"open files {lim.open_files}; wall {lim.wall_seconds:g} s (process group killed)")
        iso["python"] = (f"audit hook + import allowlist ({len(self.allowed_imports)} modules)"
                         if self.python_guards else "off (python_guards=False)")
        return iso

    @property
    def zygote_pids(self) -> tuple[int, ...]:
        """The zygote's process ids on this host (outer, then the inner one in a PID namespace);
        () before the first run."""
        zygote = self._zygote
        return zygote.pids if zygote is not None and not zygote.dead else ()

    def close(self) -> None:
        """Kill every process the sandbox started and remove its directories; runs in flight fail."""
        with self._lock:
            self._closed = True
            zygote, self._zygote = self._zygote, None
            self._current[0] = None
        if zygote is not None:
            zygote.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def score_completion(sandbox: Sandbox, completion: str, tests: Any) -> TestRun:
    """The code reward of one completion: its last Python block run against the row's ``tests``
    (any form :func:`parse_tests` accepts); "no code block" scores 0 without running anything."""
    parsed = parse_tests(tests)
    code = extract_code(completion)
    if code is None:
        return TestRun(0, len(parsed), "no code block")
    return sandbox.run(code, parsed)
