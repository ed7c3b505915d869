"""The host side of the code sandbox: namespaces, mounts, capabilities and prctl, through libc.

Standalone, standard library only: ``zygote.py`` loads it by path (rlvr never imports it
at run time). Every step the host refuses is reported in the isolation dictionary and falls back
(docs/code-reward.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import tempfile
from typing import Any

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 36, 38
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = -100, 0x8000, 0x1
SYS_MOUNT_SETATTR = {"x86_64": 442, "aarch64": 442}.get(platform.machine())  # the same number on both
NOBODY = 65534

LIBC = ctypes.CDLL(None, use_errno=True)


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def prctl(option: int, value: int) -> None:
    _check(LIBC.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl({option})")


def _bytes(text: str | None) -> bytes | None:
    return text.encode() if text is not None else None


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(LIBC.mount(_bytes(source), _bytes(target), _bytes(fstype), ctypes.c_ulong(flags), _bytes(data)),
           f"mount {target}")


def drop_capabilities() -> None:
    data = (_CapData * 2)()
    _check(LIBC.capset(ctypes.byref(_CapHeader(0x20080522, 0)), data), "capset")


def _map_user(uid: int, gid: int) -> None:
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def enter_namespaces(iso: dict[str, str]) -> dict[str, Any]:
    """Unshare what the host allows; says which namespaces are new and how runs drop privileges
    (``creds``: ``nobody`` as root, ``caps`` in a user namespace, ``none`` otherwise)."""
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC
    if os.geteuid() == 0:
        if LIBC.unshare(flags) == 0:
            iso.update(network="namespace (no interfaces up)", pid="namespace")
            return {"pid_ns": True, "mount_ns": True, "creds": "nobody"}
        iso["namespaces"] = f"unshare refused ({os.strerror(ctypes.get_errno())})"
        if LIBC.unshare(CLONE_NEWNET) == 0:
            iso["network"] = "namespace (no interfaces up)"
        return {"pid_ns": False, "mount_ns": False, "creds": "nobody"}
    uid, gid = os.getuid(), os.getgid()
    caps = "same user, all capabilities dropped (user namespace)"
    if LIBC.unshare(CLONE_NEWUSER | flags) == 0:
        _map_user(uid, gid)
        iso.update(network="namespace (no interfaces up; user namespace)", pid="namespace (user namespace)",
                   user=caps)
        return {"pid_ns": True, "mount_ns": True, "creds": "caps"}
    iso["namespaces"] = f"user namespaces refused ({os.strerror(ctypes.get_errno())})"
    if LIBC.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
        _map_user(uid, gid)
        iso.update(network="namespace (no interfaces up; user namespace)", user=caps)
        return {"pid_ns": False, "mount_ns": False, "creds": "caps"}
    return {"pid_ns": False, "mount_ns": False, "creds": "none"}


def _set_readonly(path: str, readonly: bool) -> bool:
    """``mount_setattr(path, AT_RECURSIVE)``: the mount and every mount below it read-only (or back)."""
    if SYS_MOUNT_SETATTR is None:
        return False
    attr = _MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0) if readonly else _MountAttr(0, MOUNT_ATTR_RDONLY, 0, 0)
    return LIBC.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, path.encode(), AT_RECURSIVE,
                         ctypes.byref(attr), ctypes.sizeof(attr)) == 0


def setup_filesystem(iso: dict[str, str], mount_ns: bool, pid_ns: bool, disk_bytes: int) -> tuple[str, bool]:
    """The directory the runs' directories go in, and whether it is a private tmpfs.

    In a mount namespace: mounts private (nothing propagates to the host), the whole tree read-only,
    a fresh /proc (with a PID namespace), a size-capped tmpfs on /tmp for the runs. Each step that
    the host refuses falls back (docs/code-reward.md): to read-only tmpfs over the usual world-writable
    directories, to the host's /proc, or to a plain temporary directory on the host.
    """
    # What a run still reads from the host after the tmpfs covers /tmp is the standard library
    # (lazy imports); the zygote's own scripts (this one, the harness) were loaded before it, and
    # runs are forks that exec nothing, so rlvr itself may lie under /tmp (a CI clone). A standard
    # library under /tmp would be hidden: the plain directory then.
    stdlib = os.path.realpath(os.path.dirname(os.__file__))
    if mount_ns and not (stdlib == "/tmp" or stdlib.startswith("/tmp/")):
        try:
            _mount(None, "/", None, MS_REC | MS_PRIVATE)
        except OSError as exc:
            iso["mounts"] = f"refused ({exc})"
        else:
            readonly = _set_readonly("/", True)
            try:
                _mount("rlvr-sandbox", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={disk_bytes},mode=0711")
            except OSError as exc:
                iso["mounts"] = f"tmpfs refused ({exc})"
                if readonly:
                    _set_readonly("/", False)
            else:
                if pid_ns:
                    try:
                        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
                        iso["proc"] = "private /proc (the sandbox's processes only)"
                    except OSError as exc:
                        iso["proc"] = f"host /proc (a private one was refused: {exc})"
                if readonly:
                    iso["filesystem"] = "whole tree read-only; runs in a private tmpfs on /tmp"
                else:
                    for path in ("/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue"):
                        if os.path.isdir(path) and not os.path.islink(path):
                            with contextlib.suppress(OSError):
                                _mount("none", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,mode=0755")
                    iso["filesystem"] = "private tmpfs on /tmp; /var/tmp, /dev/shm, /run/lock read-only"
                return "/tmp", True
    base = tempfile.mkdtemp(prefix="rlvr-sandbox-")
    os.chmod(base, 0o711)
    iso["filesystem"] = f"own directory per run under {base} (host file permissions elsewhere)"
    return base, False


def others_can_read(directory: str) -> bool:
    """Whether a user with no rights of its own (nobody) can list ``directory`` and traverse to it."""
    path = os.path.realpath(directory)
    try:
        if os.stat(path).st_mode & 0o005 != 0o005:
            return False
        while path != "/":
            path = os.path.dirname(path)
            if not os.stat(path).st_mode & 0o001:
                return False
    except OSError:
        return False
    return True
