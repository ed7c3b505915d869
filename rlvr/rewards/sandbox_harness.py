"""What a sandbox child runs once the zygote has locked it down: the Python guards, the code, the
tests and the one report it writes.

Standalone, standard library only: ``sandbox_zygote.py`` loads it by path (rlvr never imports it).

The guards are the innermost layer, not the boundary (the kernel layers of the zygote are): code can
reach any loaded module through ``sys.modules``, so the import allowlist stops the honest mistake,
and the audit hook (``sys.addaudithook``, which Python code cannot remove) stops the *operations*
whatever module they come from: process and thread creation, sockets, ctypes, signals, writes and
other path changes outside the run's directory, reads outside it and the standard library, and
``/proc/*/environ``. A blocked operation ends the run at once (``os._exit``) with a ``V`` report
naming it, so code that catches the exception cannot carry on.

The report on fd ``FD_RESULT`` is one of: ``R`` + JSON ``{"outcomes": [...]}`` (or ``{"error":
...}`` when the code did not compile or raised at its top level), ``V`` + what was blocked, ``M``
(memory exhausted). A value test (kind ``v``) reports the ``repr`` of its expression's value; the
parent compares it with the expected value, which never enters this process, so a program cannot
pass it without computing the value, whatever it does to this harness.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import re
import sys
import sysconfig
from collections.abc import Callable
from typing import Any, NoReturn

MAX_VALUE_CHARS = 16_384  # a value's repr; longer fails the test ("value too large")
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
ENVIRON = re.compile(r"^/proc/[^/]+(/task/[^/]+)?/environ$")
DEVICE_FILES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")

# Modules whose (first) load is blocked whoever asks, the standard library included (the audit
# layer's list; user code's own imports must also be in the allowlist, checked by its __import__).
DENIED_IMPORTS = frozenset({
    "_ctypes", "_multiprocessing", "_posixshmem", "_posixsubprocess", "_socket", "_sqlite3", "_ssl",
    "asyncio", "concurrent", "ctypes", "dbm", "fcntl", "ftplib", "http", "imaplib", "mmap",
    "multiprocessing", "nntplib", "poplib", "pty", "pwd", "grp", "resource", "shelve", "smtplib",
    "socket", "socketserver", "sqlite3", "ssl", "subprocess", "telnetlib", "termios", "tty",
    "urllib", "webbrowser", "wsgiref", "xmlrpc",
})
NAMED_EVENTS = {
    **dict.fromkeys(("os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
                     "os.startfile", "subprocess.Popen", "pty.spawn", "webbrowser.open"), "process creation"),
    "_thread.start_new_thread": "thread creation",
    **dict.fromkeys(("os.kill", "os.killpg", "signal.pthread_kill"), "signal to a process"),
    **dict.fromkeys(("os.chdir", "os.chroot"), "change of working directory"),
    **dict.fromkeys(("os.link", "os.symlink"), "link creation"),
    **dict.fromkeys(("resource.setrlimit", "resource.prlimit"), "resource limit change"),
    "sqlite3.connect": "database",
}
NETWORK_PREFIXES = ("socket.", "ftplib.", "http.client.", "imaplib.", "nntplib.", "poplib.", "smtplib.",
                    "telnetlib.", "urllib.")
# event -> (indices of its path arguments, indices of its dir_fd arguments)
PATH_EVENTS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "os.remove": ((0,), (1,)), "os.rmdir": ((0,), (1,)), "os.mkdir": ((0,), (2,)),
    "os.rename": ((0, 1), (2, 3)), "os.truncate": ((0,), ()), "os.utime": ((0,), (3,)),
    "os.chmod": ((0,), (2,)), "os.chown": ((0,), (3,)), "os.chflags": ((0,), ()),
    "os.lchflags": ((0,), ()), "os.lchmod": ((0,), ()), "os.setxattr": ((0,), ()),
    "os.removexattr": ((0,), ()), "shutil.rmtree": ((0,), (1,)), "shutil.copyfile": ((1,), ()),
    "shutil.copymode": ((1,), ()), "shutil.copystat": ((1,), ()), "shutil.copytree": ((1,), ()),
    "shutil.move": ((0, 1), ()), "shutil.chown": ((0,), ()), "shutil.make_archive": ((0,), ()),
    "shutil.unpack_archive": ((1,), ()),
}
WATCHED = frozenset({"import", "open", *NAMED_EVENTS, *PATH_EVENTS})
WATCHED_PREFIXES = ("ctypes.", *NETWORK_PREFIXES)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    libs = {os.path.realpath(paths[key]) for key in ("stdlib", "platstdlib") if key in paths}
    libs.add(os.path.realpath(os.path.dirname(os.__file__)))
    return tuple(sorted(libs))


LIBRARY_ROOTS = _library_roots()  # computed once, in the zygote


def make_hook(run_dir: str, violation: Callable[[str], NoReturn]) -> Callable[[str, tuple[Any, ...]], None]:
    """The audit hook: every watched event is checked, the first blocked one ends the run."""
    home = os.path.realpath(run_dir)
    roots = (home, *LIBRARY_ROOTS)  # where a run may read (device files apart)
    realpath, fsdecode = os.path.realpath, os.fsdecode
    busy = [False]

    def check_path_event(event: str, args: tuple[Any, ...]) -> str | None:
        paths, dir_fds = PATH_EVENTS[event]
        if any(i < len(args) and args[i] not in (None, -1) for i in dir_fds):
            return f"write outside the sandbox ({event} relative to a directory descriptor)"
        for i in paths:
            if i < len(args) and not isinstance(args[i], int):
                real = realpath(fsdecode(args[i]))
                if not _inside(real, home):
                    return f"write outside the sandbox ({real})"
        return None

    def check(event: str, args: tuple[Any, ...]) -> str | None:
        if event == "import":
            return f"import {args[0]}" if str(args[0]).partition(".")[0] in DENIED_IMPORTS else None
        if event == "open":
            path, mode, flags = args
            if isinstance(path, int):
                return None  # an open descriptor
            real = realpath(fsdecode(path))
            if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (flags or 0) & WRITE_FLAGS:
                return None if _inside(real, home) else f"write outside the sandbox ({real})"
            if ENVIRON.match(real):
                return f"environment read ({real})"
            if real in DEVICE_FILES or any(_inside(real, root) for root in roots):
                return None
            return f"read outside the sandbox ({real})"
        if event in PATH_EVENTS:
            return check_path_event(event, args)
        if event in NAMED_EVENTS:
            return NAMED_EVENTS[event]
        if event.startswith(NETWORK_PREFIXES):
            return "network"
        return "ctypes" if event.startswith("ctypes.") else None

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if busy[0] or (event not in WATCHED and not event.startswith(WATCHED_PREFIXES)):
            return
        busy[0] = True
        try:
            verdict = check(event, args)
        except Exception as exc:  # arguments of an unexpected shape: refuse rather than guess
            verdict = f"{event} (unreadable arguments: {type(exc).__name__})"
        busy[0] = False
        if verdict:
            violation(verdict)

    return hook


def make_import(allowed: frozenset[str], real_import: Callable[..., Any],
                violation: Callable[[str], NoReturn]) -> Callable[..., Any]:
    """The ``__import__`` of the code's builtins: absolute imports of allowed top-level modules only."""

    def guarded_import(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if level == 0 and name.partition(".")[0] in allowed:
            return real_import(name, globals, locals, fromlist, level)
        violation("import " + "." * level + name)

    return guarded_import


def _describe_syntax_error(exc: BaseException) -> str:
    if isinstance(exc, SyntaxError):
        return f"{exc.msg} (line {exc.lineno})"
    return str(exc)  # ValueError: source code string cannot contain null bytes


def run(code: str, tests: list[list[str]], run_dir: str, cfg: dict[str, Any], fd: int) -> NoReturn:
    """Compile and run ``code``, then each test in its namespace; report once and exit."""
    write, exit_, dumps = os.write, os._exit, json.dumps

    def report(kind: bytes, text: str = "") -> NoReturn:
        if kind == b"R":  # output first: past the file-size limit this is where SIGXFSZ ends the run
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(BaseException):
                    stream.flush()
        write(fd, kind + text.encode("utf-8", "replace"))
        exit_(0)

    def violation(what: str) -> NoReturn:
        report(b"V", what)

    user_builtins = dict(builtins.__dict__)
    if cfg["guards"]:
        sys.addaudithook(make_hook(run_dir, violation))
        user_builtins["__import__"] = make_import(frozenset(cfg["allowed"]), builtins.__import__, violation)
    namespace: dict[str, Any] = {"__name__": "solution", "__builtins__": user_builtins}
    try:
        try:
            program = compile(code, "<solution>", "exec")
        except (SyntaxError, ValueError) as exc:
            report(b"R", dumps({"error": "syntax:" + _describe_syntax_error(exc)}))
        try:
            exec(program, namespace)
        except MemoryError:
            raise
        except BaseException as exc:
            report(b"R", dumps({"error": "raised:" + type(exc).__name__}))
        outcomes: list[list[str]] = []
        for kind, source in tests:
            try:
                if kind == "v":
                    text = repr(eval(compile(source, "<test>", "eval"), namespace))
                    outcomes.append(["v", text] if len(text) <= MAX_VALUE_CHARS else ["x", "value too large"])
                else:
                    exec(compile(source, "<test>", "exec"), namespace)
                    outcomes.append(["ok"])
            except MemoryError:
                raise
            except BaseException as exc:
                outcomes.append(["x", type(exc).__name__])
        report(b"R", dumps({"outcomes": outcomes}))
    except MemoryError:
        write(fd, b"M")
        exit_(0)
