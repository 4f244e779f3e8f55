"""Isolation primitives for the sandbox worker (stdlib only; runs as root inside the sandbox).

Mounting the minimal read-only root and the per-job /tmp, rlimits, dropping privileges, and
the candidate process's set-up and runner. Loaded by path from ``_worker.py``.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys
import traceback

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_NO_NEW_PRIVS, PR_SET_DUMPABLE = 38, 4
MNT_DETACH = 2
MEMORY_EXIT = 251  # exit status the candidate runner uses for an uncaught MemoryError
# Imported once in the worker so that candidates (which may not read the Python install)
# get them for free; kept short because every module enlarges each fork's copy-on-write.
PRELOAD = (
    "math",
    "re",
    "collections",
    "itertools",
    "functools",
    "heapq",
    "bisect",
    "string",
    "typing",
    "hashlib",
    "random",
    "copy",
    "operator",
    "fractions",
)
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")

_libc = ctypes.CDLL(None, use_errno=True)
harness = None  # the _harness module, set by _worker at start-up (loaded by path)
landlock = None  # the _landlock module, likewise
LANDLOCK_READ: list = []  # what a Landlock-confined candidate may read, set by _worker
LANDLOCK_LIST: list = []  # directories it may list only (the stdlib directory, for imports)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src, target, fstype, flags, data=None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(
        _libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
        f"mount {target}",
    )


def ro_bind_roots() -> list[str]:
    """Directories bound read-only into the sandbox: system dirs and this Python's prefix."""
    roots = [d for d in SYSTEM_DIRS if os.path.lexists(d)]
    extra = [sys.base_prefix, sys.prefix] + [p for p in sys.path if os.path.isdir(p)]
    for p in extra:
        p = os.path.realpath(p)
        if not any(p == r or p.startswith(r.rstrip("/") + "/") for r in roots):
            roots.append(p)
    return roots


def build_root(job: dict) -> None:
    """In P (root, fresh mount namespace): minimal read-only root, private /tmp, chroot."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    root = os.path.join(job["jobs_dir"], "mnt")  # same path for all: each P has its own ns
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, f"size={job['tmpfs_mb']}m,mode=755")
    for src in job["ro_binds"]:
        dst = root + src
        if os.path.islink(src):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.symlink(os.readlink(src), dst)
            continue
        os.makedirs(dst, exist_ok=True)
        _mount(src, dst, None, MS_BIND | MS_REC)
        _mount(None, dst, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)
    mask_packages(root)
    os.makedirs(root + "/dev")
    for name in ("null", "zero", "random", "urandom"):
        open(f"{root}/dev/{name}", "w").close()
        _mount(f"/dev/{name}", f"{root}/dev/{name}", None, MS_BIND)
    os.makedirs(root + "/proc")
    _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.makedirs(root + "/tmp")
    os.chroot(root)
    os.chdir("/")


def mask_packages(root: str) -> None:
    """Empties every installed-packages directory of the bound Python installs (the
    interpreter's prefix holds site-packages, hence HumanEval's data with its canonical
    solutions): a read-only empty tmpfs over each. The candidate needs the stdlib only."""
    import glob

    prefixes = {"/usr", "/usr/local", sys.base_prefix, sys.prefix}
    found = set()
    for prefix in prefixes:
        for pattern in (
            "lib/python3*/*-packages",
            "lib/python3/dist-packages",
            "lib64/python3*/*-packages",
        ):
            found.update(glob.glob(os.path.join(root + prefix, pattern)))
    for path in sorted(found):
        if os.path.isdir(path) and not os.path.islink(path):
            _mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,mode=555")


def fresh_workdir(job: dict) -> None:
    """Without namespaces: an empty working directory under the host's job directory."""
    import shutil

    workdir = os.path.join(job["jobs_dir"], job["name"], "work")
    shutil.rmtree(workdir, ignore_errors=True)
    os.mkdir(workdir, 0o700)
    if os.geteuid() == 0:
        os.chown(workdir, job["uid"], job["uid"])


def forbid_ipc() -> None:
    """In the sandbox's own IPC namespace, allow no System V or POSIX IPC object at all, so
    no job can leave one behind for the next (these limits are per IPC namespace)."""
    for path, value in (
        ("kernel/shmmni", "0"),
        ("kernel/msgmni", "0"),
        ("kernel/sem", "0 0 0 0"),
        ("fs/mqueue/queues_max", "0"),
    ):
        with open(f"/proc/sys/{path}", "w") as f:
            f.write(value)


def fresh_tmp(config: dict) -> None:
    """An empty /tmp (the candidate's working directory, a tmpfs) for every job.

    The common case (only the solution file, ownership and mode untouched) just unlinks it;
    anything else gets a brand-new tmpfs.
    """
    uid = config["uid"]
    try:
        st = os.lstat("/tmp")
        if (
            os.path.ismount("/tmp")
            and st.st_mode == 0o40700
            and st.st_uid == uid
            and st.st_gid == uid
            and os.listdir("/tmp") in ([], ["solution.py"])
        ):
            if os.path.lexists("/tmp/solution.py"):
                os.unlink("/tmp/solution.py")
            return
    except OSError:
        pass
    if os.path.ismount("/tmp"):
        _check(_libc.umount2(b"/tmp", MNT_DETACH), "umount /tmp")
    _mount(
        "tmpfs",
        "/tmp",
        "tmpfs",
        MS_NOSUID | MS_NODEV,
        f"size={config['tmpfs_mb']}m,mode=700,uid={uid},gid={uid}",
    )


def limit(job: dict, *, candidate: bool) -> None:
    mem = job["memory_bytes"]
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (job["fsize_bytes"],) * 2)
    if candidate:
        cpu = job["cpu_s"]
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_NOFILE, (job["nofile"],) * 2)
        resource.setrlimit(resource.RLIMIT_NPROC, (job["nproc"],) * 2)


def no_new_privs() -> None:
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def not_dumpable() -> None:
    """No ptrace-class access (/proc/pid/mem, /proc/pid/fd, process_vm_readv) to this
    process without CAP_SYS_PTRACE, even from its own uid (the fallback shares one)."""
    _check(_libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "PR_SET_DUMPABLE")


def drop_privileges(uid: int) -> None:
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


# Syscalls refused to the candidate by a seccomp filter (after no_new_privs). Keyrings are
# per-uid kernel state that outlives processes (a channel between jobs of the same uid);
# namespaces, ptrace, bpf, perf, userfaultfd and io_uring are kernel attack surface the code
# never needs. clone is allowed only without namespace flags; clone3 (whose flags a filter
# cannot read) answers ENOSYS, so libc falls back to clone.
_SYSCALLS = {  # machine: (audit arch, {name: nr})
    "x86_64": (
        0xC000003E,
        {
            "ptrace": 101,
            "add_key": 248,
            "request_key": 249,
            "keyctl": 250,
            "unshare": 272,
            "setns": 308,
            "bpf": 321,
            "perf_event_open": 298,
            "userfaultfd": 323,
            "io_uring_setup": 425,
            "clone": 56,
            "clone3": 435,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "ptrace": 117,
            "add_key": 217,
            "request_key": 218,
            "keyctl": 219,
            "unshare": 97,
            "setns": 268,
            "bpf": 280,
            "perf_event_open": 241,
            "userfaultfd": 282,
            "io_uring_setup": 425,
            "clone": 220,
            "clone3": 435,
        },
    ),
}
_NS_CLONE_FLAGS = 0x7E020000  # NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET


_FILTER = []  # the built program, cached (the worker builds it once, before forking)


def seccomp_filter() -> bool:
    """Installs the filter in this process (inherited by its children); False if the
    machine's architecture is not in the table (then only the other limits apply)."""
    if not _FILTER:
        _FILTER.append(_build_filter())
    if _FILTER[0] is None:
        return False
    _check(_libc.prctl(22, 2, ctypes.byref(_FILTER[0][1]), 0, 0), "seccomp")  # SET_SECCOMP
    return True


def _build_filter():
    machine = os.uname().machine
    if machine not in _SYSCALLS:
        return None
    arch, nr = _SYSCALLS[machine]
    ld, jeq, jset, jge, ret = 0x20, 0x15, 0x45, 0x35, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, ...
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, eperm), (ld, 0, 0, 0)]
    if machine == "x86_64":  # x32 syscalls (bit 30) bypass the numbers below: refuse them
        prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, eperm)]
    for name in (
        "ptrace",
        "add_key",
        "request_key",
        "keyctl",
        "unshare",
        "setns",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "io_uring_setup",
    ):
        prog += [(jeq, 0, 1, nr[name]), (ret, 0, 0, eperm)]
    prog += [
        (jeq, 0, 1, nr["clone3"]),
        (ret, 0, 0, enosys),
        (jeq, 0, 3, nr["clone"]),
        (ld, 0, 0, 16),  # low 32 bits of args[0]: the flags
        (jset, 0, 1, _NS_CLONE_FLAGS),
        (ret, 0, 0, eperm),
        (ret, 0, 0, allow),
    ]

    class Filter(ctypes.Structure):
        _fields_ = [
            ("code", ctypes.c_ushort),
            ("jt", ctypes.c_ubyte),
            ("jf", ctypes.c_ubyte),
            ("k", ctypes.c_uint32),
        ]

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    filters = (Filter * len(prog))(*[Filter(*ins) for ins in prog])
    return filters, Prog(len(prog), filters)  # keep ``filters`` alive with the program


def _block_sockets() -> None:
    """Fallback when no network namespace is available: refuse socket creation in-process."""
    import socket

    def refuse(*args, **kwargs):
        raise PermissionError("network access is disabled in the sandbox")

    socket.socket = socket.create_connection = socket.socketpair = refuse  # type: ignore


def _print_user_traceback(e: BaseException) -> None:
    """The traceback as plain ``python solution.py`` would print it (no sandbox frames)."""
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    try:
        traceback.print_exception(type(e), e, tb)
    except BaseException:  # noqa: BLE001 - e.g. MemoryError again while formatting
        print(f"{type(e).__name__}: {e}", file=sys.stderr)


def close_all_but(keep) -> None:
    """Closes every descriptor above 2 except ``keep`` (close_range(2) under the hood)."""
    lo = 3
    for fd in sorted(k for k in keep if k >= 3):
        os.closerange(lo, fd)
        lo = fd + 1
    os.closerange(lo, 1 << 20)


def candidate(job, fds, keep) -> None:
    """C: set up the candidate process and run the code; never returns.

    ``fds``: inherited descriptors (devnull, code, stdout, stderr); ``keep``: the RPC pipe
    ends (tests mode). Everything else is closed before the candidate's code runs.
    """
    os.dup2(fds["devnull"], 0)
    os.dup2(fds["stdout"], 1)
    os.dup2(fds["stderr"], 2)
    code = os.read(fds["code"], job["code_bytes"] + 1).decode("utf-8", "replace")
    for fd in job.get("cgroup_procs_fds", ()):  # the whole job in the worker's cgroup
        os.write(fd, b"0")
    close_all_but(keep)
    if not job["namespaces"]:
        os.chdir(os.path.join(job["jobs_dir"], job["name"], "work"))
    if job["namespaces"]:
        os.chdir("/tmp")
    else:
        os.setpgid(0, 0)  # its own process group, killed as a whole after the job
    limit(job, candidate=True)
    no_new_privs()
    if job.get("landlock"):  # still root if we were: every allowed path can be opened
        landlock.confine(".", LANDLOCK_READ, LANDLOCK_LIST)
    drop_privileges(job["uid"])
    seccomp_filter()
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # output/file over the limit: killed
    os.environ.clear()
    os.environ.update(job["env"])
    if not job["namespaces"]:
        _block_sockets()
    sys.stdin = open(0, "r", closefd=False)
    sys.stdout = open(1, "w", closefd=False, buffering=1)  # line-buffered: kept on timeout
    sys.stderr = open(2, "w", closefd=False, buffering=1)
    path = os.path.join(os.getcwd(), "solution.py")
    with open("solution.py", "w") as f:
        f.write(code)
    sys.argv = [path]
    status = 0
    try:
        if job["mode"] == "tests":
            harness.serve(code, path, job["entry_point"], *keep)
        else:
            exec(compile(code, path, "exec"), {"__name__": "__main__", "__file__": path})
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except MemoryError as e:
        _print_user_traceback(e)
        status = MEMORY_EXIT
    except BaseException as e:  # noqa: BLE001
        _print_user_traceback(e)
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            pass
    os._exit(status & 0xFF)
