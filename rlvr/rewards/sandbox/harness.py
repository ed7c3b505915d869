"""What a sandbox child runs once the zygote has locked it down: the Python guards, the code, the
tests and the one report it writes.

Standalone, standard library only: ``zygote.py`` loads it by path (rlvr never imports it).

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
import stat
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


def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    libs = {os.path.realpath(paths[key]) for key in ("stdlib", "platstdlib") if key in paths}
    libs.add(os.path.realpath(os.path.dirname(os.__file__)))
    return tuple(sorted(libs))


LIBRARY_ROOTS = _library_roots()  # computed once, in the zygote
USER_BUILTINS = dict(builtins.__dict__)  # built once in the zygote: copying it in each run costs ~0.2 ms


def make_hook(run_dir: str, fd: int) -> Callable[[str, tuple[Any, ...]], None]:
    """The audit hook: every watched event is checked, the first blocked one writes its ``V``
    report on ``fd`` and ends the process.

    Code can reach this module's globals (through any function defined here), any frame, and patch
    any Python module, so the hook reads none of them and never runs the code's own methods: its
    tables are private copies, every function it calls is bound here and is a C function (its own
    ``realpath`` over ``posix.lstat``/``readlink``), paths must be exactly ``str`` or ``bytes``
    (not an object whose ``__fspath__`` would run inside the hook), and nothing outside this
    closure refers to the hook.
    """
    home = os.path.realpath(run_dir)
    roots = (home, *LIBRARY_ROOTS)  # where a run may read (device files apart)
    named, path_events, denied = dict(NAMED_EVENTS), dict(PATH_EVENTS), DENIED_IMPORTS
    watched, watched_prefixes, network_prefixes = WATCHED, WATCHED_PREFIXES, NETWORK_PREFIXES
    devices, write_flags, environ_match = DEVICE_FILES, WRITE_FLAGS, ENVIRON.match
    lstat, readlink, getcwd, is_link = os.lstat, os.readlink, os.getcwd, stat.S_ISLNK
    write, exit_ = os.write, os._exit
    str_, bytes_, int_, len_, type_ = str, bytes, int, len, type
    os_error, exception, type_error = OSError, Exception, TypeError
    busy = [False]

    def realpath(path: Any) -> str:
        """``os.path.realpath`` (non-strict) from C functions only."""
        if type_(path) is bytes_:
            path = path.decode("utf-8", "surrogateescape")
        elif type_(path) is not str_:
            raise type_error("path of an unusual type")
        if not path.startswith("/"):
            path = getcwd() + "/" + path
        todo: list[str] = [p for p in path.split("/") if p][::-1]
        done: list[str] = []
        links = 0
        while todo:
            part = todo.pop()
            if part == ".":
                continue
            if part == "..":
                if done:
                    done.pop()
                continue
            current = "/" + "/".join([*done, part])
            try:
                link = is_link(lstat(current).st_mode)
            except os_error:
                link = False
            if not link:
                done.append(part)
                continue
            links += 1
            if links > 40:
                raise os_error(40, "too many levels of symbolic links", path)
            target = readlink(current)
            if target.startswith("/"):
                done = []
            todo.extend([p for p in target.split("/") if p][::-1])
        return "/" + "/".join(done)

    def inside(path: str, root: str) -> bool:
        return path == root or path.startswith(root.rstrip("/") + "/")

    def check_path_event(event: str, args: tuple[Any, ...]) -> str | None:
        paths, dir_fds = path_events[event]
        for i in dir_fds:
            if i < len_(args) and args[i] is not None and not (type_(args[i]) is int_ and args[i] == -1):
                return f"write outside the sandbox ({event} relative to a directory descriptor)"
        for i in paths:
            if i < len_(args) and type_(args[i]) is not int_:
                real = realpath(args[i])
                if not inside(real, home):
                    return f"write outside the sandbox ({real})"
        return None

    def check(event: str, args: tuple[Any, ...]) -> str | None:
        if event == "import":
            name = args[0]
            if type_(name) is not str_:
                return "import of a name that is not a string"
            return f"import {name}" if name.partition(".")[0] in denied else None
        if event == "open":
            path, mode, flags = args
            if type_(path) is int_:
                return None  # an open descriptor
            real = realpath(path)
            writing = type_(mode) is str_ and ("w" in mode or "a" in mode or "x" in mode or "+" in mode)
            if writing or (type_(flags) is int_ and flags & write_flags):
                return None if inside(real, home) else f"write outside the sandbox ({real})"
            if environ_match(real):
                return f"environment read ({real})"
            if real in devices:
                return None
            for root in roots:
                if inside(real, root):
                    return None
            return f"read outside the sandbox ({real})"
        if event in path_events:
            return check_path_event(event, args)
        if event in named:
            return named[event]
        if event.startswith(network_prefixes):
            return "network"
        return "ctypes" if event.startswith("ctypes.") else None

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if busy[0] or (event not in watched and not event.startswith(watched_prefixes)):
            return
        busy[0] = True
        try:
            verdict = check(event, args)
        except exception as exc:  # arguments of an unexpected shape: refuse rather than guess
            verdict = f"{event} ({exc.args[0] if type_(exc) is type_error and exc.args else 'unreadable arguments'})"
        busy[0] = False
        if verdict:
            write(fd, b"V" + verdict.encode("utf-8", "replace"))
            exit_(0)

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

    user_builtins = USER_BUILTINS  # this process's own copy (the fork's), its to change
    if cfg["guards"]:
        sys.addaudithook(make_hook(run_dir, fd))
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
