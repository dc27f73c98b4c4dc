"""Linux Landlock: let a process, and every process it starts, write only beneath given folders.

Used by the ``rlimit`` sandbox (:mod:`coursekit.sandbox.host`), which has no bubblewrap: student
code there can still read what the user it runs as may read, but it cannot create, change or
delete a file outside its scratch folder (not the course folder, the gradebook or the Python
environment), whoever it runs as, root included. Where the kernel's Landlock is recent enough it
also may not open or accept TCP connections (ABI 4, Linux 6.7) nor signal a process outside its own
sandbox, such as the autograder (ABI 6, Linux 6.12).

Standard library only: the host runs this file as a script, as the launcher of the sandbox's first
process (``python -I -S landlock.py WRITABLE... -- COMMAND...``): it restricts itself, then
replaces itself by ``COMMAND``, so the restriction holds from the sandbox's first instruction.
"""

from __future__ import annotations

import ctypes
import os
import sys

# the system calls have the same numbers on every architecture (they came after the unification)
_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# filesystem rights (include/uapi/linux/landlock.h); reads and execution are never restricted here
WRITE_FILE = 1 << 1
REMOVE_DIR, REMOVE_FILE = 1 << 4, 1 << 5
MAKE = sum(1 << b for b in range(6, 13))  # char, dir, reg, sock, fifo, block, sym
REFER = 1 << 13  # ABI 2: link or rename a file into another folder
TRUNCATE = 1 << 14  # ABI 3
NET_BIND_TCP, NET_CONNECT_TCP = 1, 2  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1, 2  # ABI 6


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # __attribute__((packed)) in the kernel's header
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def abi() -> int:
    """The Landlock ABI version this kernel offers; 0 when it has none (not Linux, too old, or
    Landlock not enabled at boot, or a seccomp filter that forbids the call)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        version = _libc().syscall(
            ctypes.c_long(_CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION)
        )
    except (OSError, AttributeError):
        return 0
    return max(int(version), 0)


def write_rights(version: int) -> int:
    """Every right to change the filesystem that ABI ``version`` knows."""
    rights = WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE
    if version >= 2:
        rights |= REFER
    if version >= 3:
        rights |= TRUNCATE
    return rights


def restrict(writable: list[str], devices: tuple[str, ...] = ("/dev/null",)) -> int:
    """Restrict this process (and what it starts) to writing beneath the folders ``writable`` and
    into the files ``devices``. Returns the ABI version used; raises ``OSError`` when the kernel
    refuses (no Landlock: the caller must not go on as if it were confined)."""
    version = abi()
    if version < 1:
        raise OSError("this kernel offers no Landlock")
    libc = _libc()
    attr = _RulesetAttr(handled_access_fs=write_rights(version))
    size = 8
    if version >= 4:
        attr.handled_access_net, size = NET_BIND_TCP | NET_CONNECT_TCP, 16
    if version >= 6:
        attr.scoped, size = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL, 24
    ruleset = libc.syscall(
        ctypes.c_long(_CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0)
    )
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    try:
        rules = [(path, write_rights(version)) for path in writable]
        file_rights = WRITE_FILE | (TRUNCATE if version >= 3 else 0)
        rules += [(path, file_rights) for path in devices if os.path.exists(path)]
        for path, rights in rules:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = _PathBeneathAttr(allowed_access=rights, parent_fd=fd)
                if (
                    libc.syscall(
                        ctypes.c_long(_ADD_RULE),
                        ctypes.c_int(ruleset),
                        ctypes.c_int(_RULE_PATH_BENEATH),
                        ctypes.byref(rule),
                        ctypes.c_uint32(0),
                    )
                    != 0
                ):
                    e = ctypes.get_errno()
                    raise OSError(e, f"landlock_add_rule {path}: {os.strerror(e)}")
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(e)}")
        if libc.syscall(ctypes.c_long(_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"landlock_restrict_self: {os.strerror(e)}")
    finally:
        os.close(ruleset)
    return version


_PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def drop_capabilities() -> None:
    """Give up every capability for good, this process's and what any program it starts could get
    (root's included: the bounding set is emptied). Root without capabilities is the owner of
    root's files, no more: with :func:`restrict`, it cannot write them."""
    libc = _libc()
    last = int(open("/proc/sys/kernel/cap_last_cap").read())
    for cap in range(last + 1):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"prctl(PR_CAPBSET_DROP, {cap}): {os.strerror(e)}")
    libc.prctl(
        _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0
    )  # absent before Linux 4.3: nothing to clear
    header, data = _CapHeader(_CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"capset: {os.strerror(e)}")


def main(argv: list[str]) -> None:
    """``[--drop-capabilities] WRITABLE... -- COMMAND...``: restrict, then become ``COMMAND``
    (never run it unrestricted)."""
    if "--" not in argv:
        sys.exit("usage: landlock.py [--drop-capabilities] WRITABLE... -- COMMAND...")
    cut = argv.index("--")
    writable, command = argv[:cut], argv[cut + 1 :]
    drop = "--drop-capabilities" in writable
    writable = [w for w in writable if w != "--drop-capabilities"]
    try:
        restrict(writable)
        if drop:
            drop_capabilities()
    except OSError as e:
        sys.exit(f"coursekit sandbox: could not confine the sandbox: {e}")
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
