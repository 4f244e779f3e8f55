"""Landlock confinement of the candidate where namespaces are unavailable (stdlib only).

Landlock (Linux >= 5.13) lets an *unprivileged* process restrict itself, irrevocably, for it
and every process it forks. The candidate gets a domain in which it may only:

* read and execute the standard library (every entry of the stdlib directory except
  ``site-packages`` / ``dist-packages``, so installed packages such as HumanEval's data file
  are unreadable) and the system's shared-library directories;
* read and write its own working directory and ``/dev/{null,zero,random,urandom}``.

Everything else is refused by the kernel: the pickled tests next to the working directory,
``/proc`` (so no ``/proc/<ppid>/fd/1`` and no other process's memory map), any TCP bind or
connect (ABI >= 4). Landlock also refuses ptrace-class access (``/proc/pid/mem``,
``process_vm_readv``) to processes outside the domain, and with ABI >= 6 signals and
abstract-unix-socket connections to them: the candidate can neither read, signal nor talk to
the harness, the worker or the trainer, whatever their uid.
"""

from __future__ import annotations

import ctypes
import os
import sysconfig

MIN_ABI = 6  # signal scoping (ABI 6, Linux 6.12) is what keeps the harness out of reach
_NR = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446)}  # create, add_rule, restrict
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1, 2, 4, 8
_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | (1 << 14) | (1 << 15)  # +truncate, ioctl
_ALL_FS = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1}
_RULE_PATH_BENEATH = 1
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1, 2
_NET_BIND_TCP, _NET_CONNECT_TCP = 1, 2
_libc = ctypes.CDLL(None, use_errno=True)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def abi() -> int:
    """The kernel's Landlock ABI version; 0 when Landlock is absent or disabled."""
    nr = _NR.get(os.uname().machine)
    if nr is None:
        return 0
    version = _libc.syscall(nr[0], None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(int(version), 0)


def unavailable_reason() -> str | None:
    """None when the candidate can be confined here, else why not."""
    version = abi()
    if version == 0:
        return "Landlock is not available in this kernel (needs Linux >= 6.12 with lsm=landlock)"
    if version < MIN_ABI:
        return f"Landlock ABI {version} < {MIN_ABI} (no signal scoping: the harness is reachable)"
    return None


def read_only_roots() -> list[str]:
    """What the candidate may read: the stdlib without installed packages, shared libraries."""
    stdlib = sysconfig.get_paths()["stdlib"]
    roots = [
        os.path.join(stdlib, e)
        for e in sorted(os.listdir(stdlib))
        if e not in ("site-packages", "dist-packages")
    ]
    arch = sysconfig.get_config_var("MULTIARCH") or ""
    for d in ("/lib64", f"/lib/{arch}", f"/usr/lib/{arch}", "/usr/lib64"):
        if arch and os.path.isdir(d) and not os.path.islink(d):
            roots.append(d)
    return roots


def confine(workdir: str, read_only: list[str], listable: list[str]) -> None:
    """Restricts this process (and its future children) to the domain described above.

    Must run after ``no_new_privs``. ``listable``: directories whose entries may be listed but
    not read (the stdlib directory itself, so that imports can scan it).
    """
    version = abi()
    create, add_rule, restrict = _NR[os.uname().machine]
    handled = _ALL_FS.get(version, (1 << 16) - 1)
    attr = _RulesetAttr(handled, 0, 0)
    if version >= 4:
        attr.net = _NET_BIND_TCP | _NET_CONNECT_TCP  # no rule: every TCP bind/connect refused
    if version >= 6:
        attr.scoped = _SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL
    size = ctypes.sizeof(_RulesetAttr) if version >= 4 else 8
    ruleset = _libc.syscall(create, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    read = _READ_FILE | _READ_DIR | _EXECUTE
    rules = [(p, read) for p in read_only] + [(p, _READ_DIR) for p in listable]
    rules += [(workdir, handled)]
    rules += [
        (f"/dev/{n}", _READ_FILE | _WRITE_FILE) for n in ("null", "zero", "random", "urandom")
    ]
    try:
        for path, allowed in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # a path that does not exist needs no rule
            try:
                if not os.path.isdir(path):
                    allowed &= _FILE_RIGHTS
                rule = _PathBeneath(allowed & handled, fd)
                if _libc.syscall(add_rule, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0):
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
            finally:
                os.close(fd)
        if _libc.syscall(restrict, ruleset, ctypes.c_uint32(0)):
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)
