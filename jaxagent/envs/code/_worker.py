"""Sandbox worker process; stdlib only, started as ``python -I -S _worker.py`` by the host.

Protocol (stdin / stdout, one JSON line each): the worker prints a hello line (whether it can
create namespaces, which directories to bind), reads one configuration line (limits, uids,
paths), then answers each job line with one report line.

Process layout with namespaces (the worker runs as root, started with an emptied env):

  worker ── P  pid 1 of new pid / mount / net / ipc / uts namespaces, root, chrooted into a
               minimal read-only root (system dirs + the Python install, 4 device nodes,
               its own /proc); serves jobs one at a time; enforces the wall clock
            ├─ H  the test harness: forked once, runs as unprivileged uid ``harness_uid``
            └─ C  one per job: fresh tmpfs /tmp as cwd, its own IPC namespace, rlimits,
                  unprivileged uid ``uid``, no_new_privs; runs the code (or serves calls)

Per job P mounts a fresh /tmp, forks C, hands H the test file and the RPC pipes to C
(``socket.send_fds``), waits for the report (or C's exit, or the deadline; if H reports a
call over ``call_timeout_s`` P replaces C and hands H the new pipes), then SIGKILLs
every process of the candidate's uid (the pid namespace is P's, so it sees them all) and
reaps them before answering: nothing the code starts outlives its job, and the next job
starts with no candidate process, an empty /tmp and a new IPC namespace. The test data never
enters C's address space (only H reads it, after C exists). Trade-off, stated: jobs of one
worker share the pid / mount / network namespaces serially (never concurrently); nothing
persists in them between jobs (no process survives, /tmp is replaced, interfaces cannot be
configured without capabilities), which is what makes per-job set-up cheap.

Without namespaces (not root) P is the worker itself, C gets its own process group, and the
network is blocked in-process (reported as the weaker isolation level).
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import pickle
import select
import signal
import socket
import sys
import time
import traceback


def _load(name):
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(f"_jaxagent_{name}", f"{here}/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


iso = _load("_isolation")
harness = iso.harness = _load("_harness")
landlock = iso.landlock = _load("_landlock")
NS_FLAGS = (
    iso.CLONE_NEWNS | iso.CLONE_NEWPID | iso.CLONE_NEWNET | iso.CLONE_NEWIPC | iso.CLONE_NEWUTS
)
MAX_REPORT = 1 << 17  # bytes of one harness report (SOCK_SEQPACKET message)


def probe_namespaces() -> str | None:
    """Returns None if this process can create the namespaces, else the reason."""
    if os.geteuid() != 0:
        return "not running as root (an unprivileged user namespace is not used)"
    pid = os.fork()
    if pid == 0:
        os._exit(0 if iso._libc.unshare(NS_FLAGS) == 0 else 1)
    _, status = os.waitpid(pid, 0)
    return None if status == 0 else "unshare(2) failed (namespaces not permitted here)"


# ----------------------------------------------------------------------------- harness (H)


def _harness_main(config: dict, sock: socket.socket) -> None:
    devnull = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    iso.close_all_but({sock.fileno()})
    iso.limit(config, candidate=False)
    iso.drop_privileges(config["harness_uid"])
    iso.not_dumpable()  # after the uid change, which would reset it
    while True:
        msg, fds, _, _ = socket.recv_fds(sock, 1 << 16, 3)
        if not msg:
            os._exit(0)
        job = json.loads(msg)
        tests_fd, req_w, rep_r = fds
        pipes = [req_w, rep_r]

        def respawn(job=job, pipes=pipes):
            for fd in pipes:
                os.close(fd)
            sock.send(json.dumps({"respawn": job["job"]}).encode())
            _, new, _, _ = socket.recv_fds(sock, 1 << 10, 2)
            pipes[:] = new
            return new

        try:
            with os.fdopen(tests_fd, "rb") as f:
                spec = pickle.load(f)
            report = harness.run_units(
                spec,
                req_w,
                rep_r,
                job["deadline"] - job["margin_s"],
                call_timeout=job["call_timeout_s"],
                respawn=respawn,
            )
        except BaseException as e:  # noqa: BLE001
            # run_units reports broken task data itself; anything escaping it happened
            # while handling the candidate's replies, so it is the candidate's failure and
            # never a sandbox error (else a policy could buy itself an env_error)
            report = {"crashed": True, "units": [], "failure": f"{type(e).__name__}"[:100]}
        for fd in pipes:  # EOF ends the candidate's serve loop
            os.close(fd)
        report["job"] = job["job"]
        sock.send(fit_report(report))


def fit_report(report: dict) -> bytes:
    """The report as JSON under MAX_REPORT bytes, always parseable: error texts (which quote
    the candidate) are shortened step by step, and dropped as a last resort."""
    data = json.dumps(report).encode()
    for cap in (2000, 200, 0):
        if len(data) <= MAX_REPORT:
            return data
        for key in ("load_error", "harness_error", "failure"):
            if isinstance(report.get(key), str):
                report[key] = report[key][:cap]
        for u in report.get("units", []):
            u["error"] = u["error"] and u["error"][:cap]
            u["src"] = u["src"][: max(cap, 200)]
        data = json.dumps(report).encode()
    if len(data) <= MAX_REPORT:
        return data
    return json.dumps({"job": report["job"], "crashed": True, "units": []}).encode()


class Server:
    """P: serves jobs inside the sandbox."""

    def __init__(self, config: dict):
        self.config = config
        self.ns = config["namespaces"]
        self.base_fd = os.open(config["jobs_dir"], os.O_RDONLY | os.O_DIRECTORY)
        if self.ns:
            iso.build_root(config)
            iso.forbid_ipc()
        self.h_pid = None
        self.counter = 0
        self.events_fd = config.get("cgroup_events_fd")
        self.list_fd = config.get("cgroup_list_fd")

    def start_harness(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for s in (mine, theirs):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * MAX_REPORT)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * MAX_REPORT)
        pid = os.fork()
        if pid == 0:
            try:
                mine.close()
                _harness_main(self.config, theirs)
            finally:
                os._exit(1)
        theirs.close()
        self.h_pid, self.h_sock = pid, mine

    def stop_harness(self) -> None:
        if self.h_pid is not None:
            try:
                os.kill(self.h_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.h_sock.close()
            self.h_pid = None

    def open_files(self, job: dict, append: bool = False) -> dict:
        d, base = job["name"], self.base_fd
        opn = lambda n, fl: os.open(f"{d}/{n}", fl, 0o600, dir_fd=base)  # noqa: E731
        out = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
        fds = {
            "devnull": os.open("/dev/null", os.O_RDWR),
            "code": opn("solution.py", os.O_RDONLY),
            "stdout": opn("stdout", out),
            "stderr": opn("stderr", out),
        }
        return fds

    def spawn(self, job: dict, append: bool = False) -> tuple[int, tuple]:
        """Forks a candidate; returns its pid and (tests mode) the harness's pipe ends."""
        fds = self.open_files(job, append)
        rpc = theirs = ()
        if job["mode"] == "tests":
            req_r, req_w = os.pipe()
            rep_r, rep_w = os.pipe()
            rpc, theirs = (req_r, rep_w), (req_w, rep_r)
        pid = os.fork()
        if pid == 0:
            try:
                iso.candidate(job, fds, rpc)
            finally:
                os._exit(1)
        for fd in [*fds.values(), *rpc]:
            os.close(fd)
        return pid, theirs

    def run(self, job: dict) -> dict:
        t0 = time.monotonic()
        self.counter += 1
        job = {**self.config, **job, "deadline": t0 + self.config["timeout_s"], "job": self.counter}
        if self.ns:
            iso.fresh_tmp(self.config)
        else:
            iso.fresh_workdir(job)
        if job["mode"] == "tests" and self.h_pid is None:
            self.start_harness()
        ooms = self.oom_kills()
        self.pid, theirs = self.spawn(job)
        out = {}
        try:
            if job["mode"] == "tests":
                tests = os.open(f"{job['name']}/tests.pkl", os.O_RDONLY, dir_fd=self.base_fd)
                keys = ("deadline", "margin_s", "job", "call_timeout_s")
                msg = json.dumps({k: job[k] for k in keys}).encode()
                socket.send_fds(self.h_sock, [msg], [tests, *theirs])
                for fd in (tests, *theirs):
                    os.close(fd)
                out = self.wait_harness(job)
            pidfd = os.pidfd_open(self.pid)
            deadline = job["deadline"] if job["mode"] == "run" else time.monotonic()
            status = self.wait_candidate(self.pid, pidfd, deadline)
            os.close(pidfd)
            if status is None and job["mode"] == "run":
                out["timed_out"] = True
            out["wait_status"] = status
        finally:
            self.cleanup(self.pid)
        out["oom_kills"] = self.oom_kills() - ooms
        out["duration_s"] = time.monotonic() - t0
        return out

    def oom_kills(self) -> int:
        """OOM kills so far in the job cgroup (0 without one)."""
        if self.events_fd is None:
            return 0
        os.lseek(self.events_fd, 0, os.SEEK_SET)
        for line in os.read(self.events_fd, 4096).decode().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def wait_harness(self, job: dict) -> dict:
        while (left := job["deadline"] - time.monotonic()) > 0:
            if not select.select([self.h_sock], [], [], left)[0]:
                break
            data = self.h_sock.recv(MAX_REPORT + 1)
            try:
                report = json.loads(data) if data else None
            except ValueError:
                report = None
            if report is not None and report.get("respawn") == job["job"]:
                # a call exceeded call_timeout_s: a fresh candidate for the remaining tests
                self.cleanup(self.pid)
                self.pid, theirs = self.spawn(job, append=True)
                socket.send_fds(self.h_sock, [b"{}"], list(theirs))
                for fd in theirs:
                    os.close(fd)
                continue
            if report is not None and report.get("job") == job["job"]:
                return {"report": report}
            self.stop_harness()
            return {"error": "the test harness died"}
        self.stop_harness()  # it may still be inside this job: start a fresh one next time
        return {"timed_out": True}

    def wait_candidate(self, pid: int, pidfd: int, deadline: float) -> int | None:
        left = deadline - time.monotonic()
        if select.select([pidfd], [], [], max(left, 0))[0]:
            return os.waitpid(pid, 0)[1]
        return None

    def cleanup(self, pid: int) -> None:
        """SIGKILL every process of the candidate (its uid, or without namespaces its group)
        and wait until each is dead, so nothing the code started outlives the job."""
        try:
            os.killpg(pid, signal.SIGKILL) if not self.ns else os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        # anything it forked: with namespaces all in P's pid namespace with its uid; as root
        # without, the uid is still its own; in any case the job cgroup holds them all
        for _ in range(100):  # bounded: a zombie someone else must reap may stay listed
            if not (self.ns or os.geteuid() == 0 or self.list_fd is not None):
                break
            victims = self._candidate_pids()
            if not victims:
                break
            pidfds = []
            for victim in victims:
                try:
                    pidfds.append(os.pidfd_open(victim))
                    os.kill(victim, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 2.0
            while pidfds and time.monotonic() < deadline:  # pidfd readable = process exited
                done = select.select(pidfds, [], [], deadline - time.monotonic())[0]
                for fd in done:
                    os.close(fd)
                    pidfds.remove(fd)
                self._reap()
            for fd in pidfds:
                os.close(fd)
        self._reap()

    def _candidate_pids(self) -> list[int]:
        pids = set()
        if self.list_fd is not None and not self.ns:  # the cgroup's members, host pids
            os.lseek(self.list_fd, 0, os.SEEK_SET)
            pids = {int(p) for p in os.read(self.list_fd, 1 << 16).split()}
            if os.geteuid() != 0:
                return sorted(pids - {os.getpid()})
        uid, found = str(self.config["uid"]).encode(), sorted(pids)
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) > 1:
                try:
                    with open(f"/proc/{entry}/status", "rb") as f:
                        fields = dict(line.split(b":", 1) for line in f if b":" in line)
                except OSError:
                    continue
                if fields[b"Uid"].split()[0] == uid and not fields[b"State"].strip().startswith(
                    b"Z"
                ):
                    found.append(int(entry))
        return found

    def _reap(self) -> None:
        """As pid 1, collect every exited child and orphan (never the harness while alive)."""
        while True:
            try:
                got, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if got == 0:
                return
            if got == self.h_pid:
                self.h_pid = None
                self.h_sock.close()


def serve(config: dict) -> None:
    server = Server(config)
    stdin = sys.stdin.buffer
    while line := stdin.readline():
        try:
            job = json.loads(line)
            out = server.run(job)
        except BaseException:  # noqa: BLE001
            out = {"error": traceback.format_exc()[-2000:]}
        # the token proves the line is P's (a candidate cannot know it); the leading newline
        # ends any partial line written into this pipe before it
        out["token"] = job.get("token") if isinstance(job, dict) else None
        sys.stdout.write("\n" + json.dumps(out) + "\n")
        sys.stdout.flush()
    server.stop_harness()


def main() -> None:
    for name in iso.PRELOAD:
        __import__(name)
    iso._FILTER.append(iso._build_filter())  # built once; each candidate only installs it
    gc.collect()
    gc.freeze()  # forked children would otherwise touch every object's GC header (copy-on-write)
    hello = {
        "ready": True,
        "namespaces_error": probe_namespaces(),
        "landlock_error": landlock.unavailable_reason(),
        "ro_binds": iso.ro_bind_roots(),
        "pid": os.getpid(),
    }
    sys.stdout.write(json.dumps(hello) + "\n")
    sys.stdout.flush()
    config = json.loads(sys.stdin.buffer.readline() or b"null")
    if config is None:
        return
    iso.not_dumpable()  # its memory holds the job stream: no same-uid /proc/pid/mem reads
    if config.get("landlock"):
        import sysconfig

        iso.LANDLOCK_READ[:] = landlock.read_only_roots()
        iso.LANDLOCK_LIST[:] = [sysconfig.get_paths()["stdlib"]]
    if config.get("cgroup"):  # opened before any chroot; the candidate joins through them
        config["cgroup_procs_fds"] = [os.open(p, os.O_WRONLY) for p in config["cgroup"]["procs"]]
        config["cgroup_events_fd"] = os.open(config["cgroup"]["events"], os.O_RDONLY)
        config["cgroup_list_fd"] = os.open(config["cgroup"]["procs"][0], os.O_RDONLY)
    if config["namespaces"]:
        iso._check(iso._libc.unshare(NS_FLAGS), "unshare")
        pid = os.fork()
        if pid:  # outside the namespaces: wait for P (pid 1 inside), whose death ends them all
            os.waitpid(pid, 0)
            return
    serve(config)


if __name__ == "__main__":
    main()
