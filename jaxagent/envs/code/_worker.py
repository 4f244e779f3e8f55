"""Sandbox worker process ("zygote"); stdlib only, started as ``python -I -S _worker.py``.

The host (``sandbox.Sandbox``) starts one worker per concurrent slot with an emptied
environment. The worker pre-imports common standard-library modules, prints a hello line,
reads one configuration line (limits, uids, paths), then serves jobs: one JSON line in on
stdin, one JSON line out on stdout. Per job it uses a fresh process tree that was forked and
built *before* the job arrived (the next one is built while the current job runs):

  worker (root; enforces the wall clock)
    └ P (pid 1 of new pid/net/mount/ipc/uts namespaces; builds a minimal read-only root with
       a private writable /tmp as the working directory, chroots, then waits for its job)
        ├ C  candidate: rlimits, unprivileged uid, no_new_privs, runs the code
        └ (P itself, after dropping to a second unprivileged uid, is the test harness)

When P exits the kernel kills everything left in its pid namespace, so nothing the code
started outlives the job; the mount namespace (and with it the tmpfs /tmp) disappears too.
The test data (``tests.pkl``) is read only by P *after* C is forked, so it never enters the
candidate's address space. The worker itself reads only the small job descriptor.
"""

from __future__ import annotations

import ctypes
import gc
import importlib.util
import json
import os
import pickle
import resource
import select
import signal
import sys
import time
import traceback

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_NO_NEW_PRIVS = 38
MEMORY_EXIT = 251  # exit status the candidate runner uses for an uncaught MemoryError
# Imported once in the worker so that candidates (which may not read the Python install)
# get them for free; kept short because every module enlarges each fork's copy-on-write.
PRELOAD = ("math", "re", "collections", "itertools", "functools", "heapq", "bisect", "string",
           "typing", "hashlib", "random", "copy", "operator", "fractions", "socket")
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")

_libc = ctypes.CDLL(None, use_errno=True)
_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("_jaxagent_harness", os.path.join(_here, "_harness.py"))
harness = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harness)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src, target, fstype, flags, data=None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(_libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {target}")


def ro_bind_roots() -> list[str]:
    """Directories bound read-only into the sandbox: system dirs and this Python's prefix."""
    roots = [d for d in SYSTEM_DIRS if os.path.lexists(d)]
    extra = [sys.base_prefix, sys.prefix] + [p for p in sys.path if os.path.isdir(p)]
    for p in extra:
        p = os.path.realpath(p)
        if not any(p == r or p.startswith(r.rstrip("/") + "/") for r in roots):
            roots.append(p)
    return roots


def _build_root(job: dict) -> None:
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
    os.makedirs(root + "/dev")
    for name in ("null", "zero", "random", "urandom"):
        open(f"{root}/dev/{name}", "w").close()
        _mount(f"/dev/{name}", f"{root}/dev/{name}", None, MS_BIND)
    os.makedirs(root + "/proc")
    _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.makedirs(root + "/tmp")
    os.chown(root + "/tmp", job["uid"], job["uid"])
    os.chmod(root + "/tmp", 0o700)
    os.chroot(root)
    os.chdir("/tmp")


def _limit(job: dict, *, candidate: bool) -> None:
    mem = job["memory_bytes"]
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (job["fsize_bytes"],) * 2)
    if candidate:
        cpu = job["cpu_s"]
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_NOFILE, (job["nofile"],) * 2)
        resource.setrlimit(resource.RLIMIT_NPROC, (job["nproc"],) * 2)


def _drop_privileges(uid: int) -> None:
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def _block_sockets() -> None:
    """Fallback when no network namespace is available: refuse socket creation in-process."""
    import socket

    def refuse(*args, **kwargs):
        raise PermissionError("network access is disabled in the sandbox")

    socket.socket = socket.create_connection = socket.socketpair = refuse  # type: ignore


def _candidate(job, fds, keep) -> None:
    """C: never returns. ``fds`` = dict of inherited descriptors."""
    os.dup2(fds["devnull"], 0)
    os.dup2(fds["stdout"], 1)
    os.dup2(fds["stderr"], 2)
    code = os.read(fds["code"], job["code_bytes"] + 1).decode("utf-8", "replace")
    for fd in [int(f) for f in os.listdir("/proc/self/fd")]:
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    if not job["namespaces"]:
        workdir = os.path.join(job["jobs_dir"], job["name"], "work")
        os.mkdir(workdir, 0o700)
        if os.geteuid() == 0:
            os.chown(workdir, job["uid"], job["uid"])
        os.chdir(workdir)
    _limit(job, candidate=True)
    _drop_privileges(job["uid"])
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
    except MemoryError:
        traceback.print_exc()
        status = MEMORY_EXIT
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            pass
    os._exit(status & 0xFF)


def _reap_until(pid: int) -> int:
    """As pid 1 we inherit orphans: reap everything until ``pid`` exits; return its status."""
    while True:
        got, status = os.wait()
        if got == pid:
            return status


def _read_line(fd: int) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        data += chunk
    return data


def _open_job_files(job: dict, base_fd: int) -> dict:
    d = job["name"]
    opn = lambda name, flags, mode=0o600: os.open(f"{d}/{name}", flags, mode, dir_fd=base_fd)  # noqa
    fds = {
        "devnull": os.open("/dev/null", os.O_RDWR),
        "code": opn("solution.py", os.O_RDONLY),
        "stdout": opn("stdout", os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        "stderr": opn("stderr", os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    }
    if job["mode"] == "tests":
        fds["tests"] = opn("tests.pkl", os.O_RDONLY)
    return fds


def _supervised(config: dict, start_r: int, res_w: int, base_fd: int) -> None:
    """P: build the sandbox ahead of time, wait for a job, run it. Never returns."""
    if config["namespaces"]:
        _build_root(config)
    else:
        os.setsid()
    line = _read_line(start_r)
    if not line:
        os._exit(0)
    job = {**config, **json.loads(line)}
    fds = _open_job_files(job, base_fd)
    rpc = ()
    if job["mode"] == "tests":
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        rpc = (req_r, rep_w)
    pid = os.fork()
    if pid == 0:
        try:
            _candidate(job, fds, rpc)
        finally:
            os._exit(1)  # set-up of the candidate failed (it never returns normally)
    out = {}
    if job["mode"] == "run":
        out["wait_status"] = _reap_until(pid)
    else:
        os.close(req_r)
        os.close(rep_w)
        spec = pickle.loads(os.read(fds["tests"], job["tests_bytes"] + 1))
        for fd in fds.values():
            os.close(fd)
        os.close(base_fd)
        _limit(job, candidate=False)
        _drop_privileges(job["harness_uid"])
        try:
            out["report"] = harness.run_units(spec, req_w, rep_r, job["deadline"] - job["margin_s"])
        except BaseException as e:  # noqa: BLE001
            out["report"] = {"harness_error": f"{type(e).__name__}: {e}", "units": []}
        os.close(req_w)  # EOF ends the candidate's serve loop
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
            out["wait_status"] = status if done else None
        except ChildProcessError:
            out["wait_status"] = None
    os.write(res_w, json.dumps(out).encode() + b"\n")
    os._exit(0)


NS_FLAGS = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
_NS_FILES = (("pid", CLONE_NEWPID), ("mnt", CLONE_NEWNS), ("net", CLONE_NEWNET),
             ("ipc", CLONE_NEWIPC), ("uts", CLONE_NEWUTS))


class Spare:
    """A sandbox built ahead of its job: P waits on ``start_w`` and reports on ``res_r``.

    With namespaces the worker unshares, forks P (pid 1 of the new pid namespace, inside new
    mount / net / ipc / uts namespaces) and returns to its own namespaces with setns(2), so
    no intermediate process is needed per job.
    """

    def __init__(self, config: dict, home_ns: dict):
        start_r, self.start_w = os.pipe()
        self.res_r, res_w = os.pipe()
        self.namespaces = config["namespaces"]
        if self.namespaces:
            _check(_libc.unshare(NS_FLAGS), "unshare")
        self.pid = os.fork()
        if self.pid == 0:
            try:
                base_fd = os.open(config["jobs_dir"], os.O_RDONLY | os.O_DIRECTORY)
                keep = (start_r, res_w, base_fd)
                for fd in [int(f) for f in os.listdir("/proc/self/fd")]:
                    if fd > 2 and fd not in keep:
                        try:
                            os.close(fd)  # the worker's other jobs' descriptors
                        except OSError:
                            pass
                _supervised(config, start_r, res_w, base_fd)
            except BaseException:  # noqa: BLE001
                os.write(res_w, json.dumps({"error": traceback.format_exc()[-2000:]}).encode()
                         + b"\n")
            os._exit(0)
        if self.namespaces:
            for name, flag in _NS_FILES:
                _check(_libc.setns(home_ns[name], flag), f"setns {name}")
        os.close(start_r)
        os.close(res_w)
        self.pidfd = os.pidfd_open(self.pid)

    def kill(self) -> None:
        # pid 1 of the namespace takes everything in it along; without namespaces, the group.
        try:
            if self.namespaces:
                os.kill(self.pid, signal.SIGKILL)
            else:
                os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def run(self, line: bytes, timeout_s: float, make_next) -> tuple[dict, "Spare"]:
        """Hands the job to P, builds the next spare meanwhile, enforces the wall clock."""
        t0 = time.monotonic()
        job = json.loads(line)
        job["deadline"] = deadline = t0 + timeout_s
        os.write(self.start_w, json.dumps(job).encode() + b"\n")
        nxt = make_next()
        data, timed_out = b"", False
        while not data.endswith(b"\n"):
            left = deadline - time.monotonic()
            ready = select.select([self.res_r, self.pidfd], [], [], left)[0] if left > 0 else []
            if not ready:
                timed_out = True
                break
            if self.res_r in ready:
                chunk = os.read(self.res_r, 1 << 16)
                data += chunk
                if not chunk:
                    break
            elif self.pidfd in ready:  # P exited: collect whatever it wrote
                while chunk := os.read(self.res_r, 1 << 16):
                    data += chunk
                break
        self.kill()  # before reporting, so nothing the code started outlives the job
        for fd in (self.start_w, self.res_r, self.pidfd):
            os.close(fd)
        try:
            out = json.loads(data) if data else {"error": "sandbox exited without a report"}
        except ValueError:
            out = {"error": "sandbox sent a malformed report"}
        if timed_out:
            out = {"timed_out": True}
        out["duration_s"] = time.monotonic() - t0
        return out, nxt


def probe_namespaces() -> str | None:
    """Returns None if this process can create the namespaces, else the reason."""
    if os.geteuid() != 0:
        return "not running as root (an unprivileged user namespace is not used)"
    pid = os.fork()
    if pid == 0:
        os._exit(0 if _libc.unshare(NS_FLAGS) == 0 else 1)
    _, status = os.waitpid(pid, 0)
    return None if status == 0 else "unshare(2) failed (namespaces not permitted here)"


def _reap_nohang() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def main() -> None:
    for name in PRELOAD:
        __import__(name)
    # Forked children would otherwise write to every object's GC header on their first
    # collection, copying most of the parent's pages (copy-on-write); freeze them instead.
    gc.collect()
    gc.freeze()
    hello = {"ready": True, "namespaces_error": probe_namespaces(), "ro_binds": ro_bind_roots(),
             "pid": os.getpid()}
    sys.stdout.write(json.dumps(hello) + "\n")
    sys.stdout.flush()
    stdin = sys.stdin.buffer
    config = json.loads(stdin.readline() or b"null")
    if config is None:
        return
    home_ns = {}
    if config["namespaces"]:
        home_ns = {name: os.open(f"/proc/self/ns/{name}", os.O_RDONLY) for name, _ in _NS_FILES}
    make = lambda: Spare(config, home_ns)  # noqa: E731
    spare = make()  # a sandbox is always built before its job arrives
    while line := stdin.readline():
        try:
            out, spare = spare.run(line, config["timeout_s"], make)
        except BaseException:  # noqa: BLE001
            out = {"error": traceback.format_exc()[-2000:]}
            spare = make()
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()
        _reap_nohang()
    spare.kill()
    try:
        while True:
            os.wait()
    except ChildProcessError:
        pass


if __name__ == "__main__":
    main()
