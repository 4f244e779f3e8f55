"""Run untrusted Python in an isolated sandbox; structured results.

``Sandbox`` keeps ``num_workers`` warm worker processes (``_worker.py``). Each worker is pid 1
of its own pid / mount / network / IPC / UTS namespaces, chrooted into a minimal read-only
root (system directories, the Python install, /dev/{null,zero,random,urandom}, its own
/proc). Every job gets: a new candidate process forked from the warm worker (the standard
library already imported) with an emptied environment, an unprivileged uid (a second uid runs
the test harness, so the candidate can neither signal nor ptrace it), ``no_new_privs``, a
seccomp filter (no keyrings, namespaces, ptrace, bpf, perf, userfaultfd, io_uring), rlimits
on CPU time, address space, file size (which also bounds stdout / stderr), open files and
processes, and an empty tmpfs ``/tmp`` as its working directory -- the only writable place.
There is no network (no interface is up in the namespace) and no IPC object can be created.
The wall clock is enforced by the worker, which then SIGKILLs and waits for every process of
the candidate's uid, so nothing the code starts outlives its job.

Trade-off, stated: a worker's jobs run one after another in the same namespaces rather than
in new ones each (that set-up cost ~2 ms a job); nothing persists between them: no process
survives, /tmp is emptied or replaced, no IPC object or keyring can exist, and the network
namespace has no configurable state without capabilities.

Where namespaces are not available (not root, or unshare refused) the fallback is Landlock
(``_landlock.py``: the candidate may read only the standard library and its own fresh working
directory, and cannot touch /proc, ptrace, signal or talk to any process outside its domain,
nor make a TCP connection) plus a process group with the same rlimits and seccomp filter, an
emptied environment and in-process socket blocking. Where neither is available the sandbox
refuses to run rather than grade hackably, unless the user opts in with ``isolation="unsafe"``
(rlimits only, warned loudly). Memory and processes of a whole job are bounded by a cgroup
(v2, else v1) where the machine lets us create one (``_cgroup.py``); ``Sandbox.isolation``
reports the active level and ``Sandbox.memory_limit`` the mechanism bounding memory.

Command line, for debugging a task file exactly as training runs it::

    python -m jaxagent.envs.code.sandbox PATH [--timeout S] [--memory-mb M]

prints one JSON line: status, exit code, duration, isolation level, what bounds memory
(``memory_limit``), truncated output.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import pickle
import queue
import random
import shutil
import sys
import tempfile
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from jaxagent.envs.code import _cgroup, _harness
from jaxagent.envs.code._channel import WorkerProcess
from jaxagent.envs.code._results import SandboxResult, classify, read_capped

STATUSES = ("passed", "failed", "timeout", "memory", "crashed", "error")
# auto: namespaces, else Landlock, else refuse; "rlimits" is the Landlock fallback forced (the
# name kept for existing configs); only "unsafe" runs code that could game the grading
ISOLATION_CHOICES = ("auto", "namespaces", "landlock", "rlimits", "unsafe")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SandboxConfig:
    timeout_s: float = 5.0  # wall clock per job, enforced by the worker (not by the candidate)
    cpu_time_s: int | None = None  # RLIMIT_CPU; None = int(timeout_s) + 2
    memory_mb: int = 1024  # RLIMIT_AS of the candidate (and of the harness)
    max_file_mb: int = 16  # RLIMIT_FSIZE: any file written, and captured stdout / stderr
    max_open_files: int = 64  # RLIMIT_NOFILE
    # RLIMIT_NPROC of the candidate uid; with memory_mb it bounds the total memory a job can
    # take (memory_mb x max_processes): there is no per-sandbox cgroup
    max_processes: int = 8
    max_output_bytes: int = 8192  # stdout / stderr returned per stream (head and tail kept)
    tmpfs_mb: int = 64  # size of each job's /tmp (the working directory, a tmpfs)
    # "auto" (strongest available, refuses if none holds), "namespaces" (required),
    # "landlock" / "rlimits" (the unprivileged fallback, required), "unsafe" (rlimits only)
    isolation: str = "auto"
    # all processes of a job together, through a cgroup where one can be created (None:
    # memory_mb); without one memory is bounded by memory_mb x max_processes only
    job_memory_mb: int | None = None
    cgroup: bool = True  # use a per-worker cgroup where available (False: rlimits only)
    harness_margin_s: float = 0.25  # the harness reports this long before the wall deadline
    # tests mode: limit on one call to the candidate; when exceeded, that test fails as a
    # timeout and a fresh candidate process runs the remaining tests (None: only timeout_s)
    call_timeout_s: float | None = None

    @property
    def job_memory_limit_mb(self) -> int:
        """The job cgroup's memory limit: ``job_memory_mb``, or ``memory_mb`` when None."""
        return self.job_memory_mb or self.memory_mb

    def __post_init__(self):
        def need(ok, field, value, fix):
            if not ok:
                raise ValueError(f"SandboxConfig.{field}={value!r} is invalid: {fix}")

        need(self.timeout_s > 0, "timeout_s", self.timeout_s, "use a positive number of seconds")
        need(
            self.cpu_time_s is None or self.cpu_time_s >= 1,
            "cpu_time_s",
            self.cpu_time_s,
            "use None or an integer >= 1",
        )
        need(
            self.memory_mb >= 64,
            "memory_mb",
            self.memory_mb,
            "use >= 64 (the Python interpreter alone needs ~30 MB of address space)",
        )
        need(self.max_file_mb >= 1, "max_file_mb", self.max_file_mb, "use >= 1")
        need(self.max_open_files >= 16, "max_open_files", self.max_open_files, "use >= 16")
        need(self.max_processes >= 1, "max_processes", self.max_processes, "use >= 1")
        need(self.max_output_bytes >= 64, "max_output_bytes", self.max_output_bytes, "use >= 64")
        need(self.tmpfs_mb >= 1, "tmpfs_mb", self.tmpfs_mb, "use >= 1")
        need(
            self.job_memory_mb is None or self.job_memory_mb >= 64,
            "job_memory_mb",
            self.job_memory_mb,
            "use None (= memory_mb) or >= 64",
        )
        need(
            self.isolation in ISOLATION_CHOICES,
            "isolation",
            self.isolation,
            f"choose one of {ISOLATION_CHOICES}",
        )
        need(
            self.call_timeout_s is None or 0 < self.call_timeout_s <= self.timeout_s,
            "call_timeout_s",
            self.call_timeout_s,
            "use None or a value in (0, timeout_s]",
        )
        need(
            0 <= self.harness_margin_s < self.timeout_s,
            "harness_margin_s",
            self.harness_margin_s,
            "use a value in [0, timeout_s)",
        )

    @property
    def cpu_limit_s(self) -> int:
        return self.cpu_time_s if self.cpu_time_s is not None else int(self.timeout_s) + 2


@dataclasses.dataclass(frozen=True)
class TestSpec:
    """Hidden tests in HumanEval's format: ``def check(candidate): assert ...``.

    ``prelude`` is trusted problem code the tests may use (HumanEval prompts define helpers
    such as ``poly``); it runs in the harness, never alongside the candidate.
    """

    __test__ = False  # not a pytest test class

    entry_point: str
    test_source: str
    prelude: str = ""

    def compiled(self) -> bytes:
        """The pickled harness spec (units, calls sent ahead, code objects); cached."""
        return _compile_spec(self)[0]

    @property
    def num_tests(self) -> int:
        """Number of scored units (statements of ``check`` with a non-constant assert)."""
        return _compile_spec(self)[1]


# CPython 3.11 keeps the AST constructor's recursion depth per interpreter, not per thread:
# two threads parsing or compiling at once can raise "SystemError: AST constructor recursion
# depth mismatch" (python/cpython#106905). ``Sandbox.map``'s threads build specs, so one at
# a time (cached, so the lock is taken once a problem).
_AST_LOCK = threading.Lock()


@functools.lru_cache(maxsize=4096)
def _compile_spec(tests: TestSpec) -> tuple[bytes, int]:
    # Cached per problem: RL samples each problem many times, and the spec never changes.
    with _AST_LOCK:
        spec = _harness.split_check(tests.test_source, entry_point=tests.entry_point)
        spec = _harness.compile_spec(spec, tests.prelude)
    spec["entry_point"] = tests.entry_point
    return pickle.dumps(spec, 5), sum(is_test for is_test, _ in spec["units"])


class Sandbox:
    """A pool of warm sandbox workers. Thread-safe; ``map`` runs jobs concurrently."""

    def __init__(self, config: SandboxConfig | None = None, num_workers: int = 1):
        if num_workers < 1:
            raise ValueError(f"num_workers={num_workers!r} is invalid: use >= 1")
        self.config = config or SandboxConfig()
        self.num_workers = num_workers
        self._idle: queue.Queue[WorkerProcess] = queue.Queue()
        # Distinct unprivileged uids per sandbox and worker, candidate != harness, so
        # RLIMIT_NPROC counts are private and the candidate cannot signal or ptrace the harness.
        self._uid_base = random.SystemRandom().randrange(1 << 20, 1 << 30, 1 << 8)
        self._jobs_dir = tempfile.mkdtemp(
            prefix="jaxagent-sbx-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        )
        os.mkdir(os.path.join(self._jobs_dir, "mnt"))
        self._cgroups: dict = {}
        self.memory_limit = (
            f"rlimits only: RLIMIT_AS {self.config.memory_mb} MiB per process x RLIMIT_NPROC "
            f"{self.config.max_processes} (cgroup disabled by SandboxConfig.cgroup=False)"
        )
        self._workers = []
        for i in range(num_workers):
            self._workers.append(WorkerProcess(self.config.isolation, self._worker_config, i))
            os.mkdir(os.path.join(self._jobs_dir, f"w{i}"), 0o700)
            self._idle.put(self._workers[-1])
        w = self._workers[0]
        self.namespaces = w.namespaces
        seccomp = "+seccomp" if os.uname().machine in ("x86_64", "aarch64") else ""
        cgroup = f"+cgroup-{self._cgroups[0].kind}" if self._cgroups.get(0) else ""
        if self.namespaces:
            self.isolation = (
                "namespaces(pid,net,mount,ipc,uts)+ro-root+uid+rlimits" + seccomp + cgroup
            )
        else:
            self.isolation = (
                ("rlimits+landlock(fs,proc,ptrace,signal,tcp)" if w.landlock else "UNSAFE:rlimits")
                + "+pgroup+socket-block"
                + seccomp
                + cgroup
                + (
                    f" ({w.hello['namespaces_error']})"
                    if self.config.isolation in ("auto", "unsafe")
                    else ""
                )
            )
        if not w.landlock and not w.namespaces:
            message = (
                "jaxagent sandbox: isolation='unsafe': untrusted code runs under rlimits only; "
                "it can read the hidden tests, other processes of this uid and forge results. "
                "Never use this for RL on a policy that can learn to exploit it."
            )
            warnings.warn(message, RuntimeWarning, stacklevel=2)
            print(message, file=sys.stderr, flush=True)
        self._pool = ThreadPoolExecutor(num_workers) if num_workers > 1 else None

    # -- public API
    def run(self, code: str, tests: TestSpec | dict | None = None) -> SandboxResult:
        """Runs ``code`` (as ``__main__``), or scores it against ``tests`` if given."""
        worker = self._idle.get()
        try:
            return self._run(worker, code, tests)
        finally:
            self._idle.put(worker)

    def run_file(self, path: str) -> SandboxResult:
        with open(path, encoding="utf-8") as f:
            return self.run(f.read())

    def map(self, jobs: Sequence[tuple[str, TestSpec | dict | None]]) -> list[SandboxResult]:
        if self._pool is None:
            return [self.run(code, tests) for code, tests in jobs]
        return list(self._pool.map(lambda j: self.run(*j), jobs))

    def close(self):
        if self._pool is not None:
            self._pool.shutdown()
        for w in self._workers:
            w.close()
        for cg in self._cgroups.values():
            if cg is not None:
                cg.close()
        shutil.rmtree(self._jobs_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- internals
    def _worker_config(self, worker: WorkerProcess) -> dict:
        cfg = self.config
        uid = self._uid_base + 2 * worker.index
        ns = worker.namespaces
        if cfg.cgroup and worker.index not in self._cgroups:
            memory = cfg.job_memory_limit_mb << 20
            cg, described = _cgroup.create(
                f"jaxagent-sbx-{self._uid_base:x}-w{worker.index}", memory, cfg.max_processes
            )
            self._cgroups[worker.index] = cg
            if worker.index == 0:
                self.memory_limit = (
                    described
                    if cg
                    else f"rlimits only: RLIMIT_AS {cfg.memory_mb} MiB per process x "
                    f"RLIMIT_NPROC {cfg.max_processes} (no cgroup: {described})"
                )
        cg = self._cgroups.get(worker.index)
        return {
            "landlock": worker.landlock,
            "cgroup": cg and {"procs": list(cg.procs), "events": cg.events},
            "jobs_dir": self._jobs_dir,
            "timeout_s": cfg.timeout_s,
            "cpu_s": cfg.cpu_limit_s,
            "memory_bytes": cfg.memory_mb << 20,
            "fsize_bytes": cfg.max_file_mb << 20,
            "nofile": cfg.max_open_files,
            "nproc": cfg.max_processes,
            "uid": uid,
            "harness_uid": uid + 1,
            "namespaces": ns,
            "ro_binds": worker.hello["ro_binds"],
            "tmpfs_mb": cfg.tmpfs_mb,
            "env": {
                "PATH": "/usr/bin:/bin",
                "HOME": "/tmp" if ns else ".",
                "TMPDIR": "/tmp" if ns else ".",
                "LANG": "C.UTF-8",
            },
            "margin_s": cfg.harness_margin_s,
            "call_timeout_s": cfg.call_timeout_s,
        }

    def _run(self, worker: WorkerProcess, code: str, tests) -> SandboxResult:
        if isinstance(tests, dict):
            tests = TestSpec(**tests)
        if tests is not None and not isinstance(tests, TestSpec):
            raise TypeError(f"tests={tests!r} is invalid: pass a TestSpec (or None to run code)")
        name = f"w{worker.index}"  # each worker reuses its own job directory
        workroot = os.path.join(self._jobs_dir, name)
        data = code.encode("utf-8")
        with open(os.path.join(workroot, "solution.py"), "wb") as f:
            f.write(data)
        if tests is not None:
            with open(os.path.join(workroot, "tests.pkl"), "wb") as f:
                f.write(tests.compiled())
        job = {
            "name": name,
            "mode": "tests" if tests else "run",
            "code_bytes": len(data),
            "entry_point": tests and tests.entry_point,
        }
        try:
            rep = worker.request(job, self.config.timeout_s + 30.0)
        except (RuntimeError, OSError, ValueError) as e:
            worker.kill()
            worker.proc.wait()
            worker.start()
            return self._error(f"sandbox worker failed: {e}")
        stdout = read_capped(os.path.join(workroot, "stdout"), self.config.max_output_bytes)
        stderr = read_capped(os.path.join(workroot, "stderr"), self.config.max_output_bytes)
        total = tests.num_tests if tests is not None else 0
        return self._classify(rep, total, stdout, stderr)

    def _error(self, detail: str) -> SandboxResult:
        return SandboxResult("error", None, None, 0.0, self.isolation, "", "", detail=detail)

    def _classify(self, rep: dict, total: int, stdout: str, stderr: str) -> SandboxResult:
        return classify(rep, total, stdout, stderr, self.config, self.isolation, self.memory_limit)


_DEFAULTS = SandboxConfig()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jaxagent.envs.code.sandbox",
        description="Run one Python file in the jaxagent sandbox exactly as training does.",
    )
    parser.add_argument("path", help="Python file to run as __main__")
    parser.add_argument(
        "--timeout", type=float, default=_DEFAULTS.timeout_s, help="wall-clock limit in seconds"
    )
    parser.add_argument(
        "--memory-mb", type=int, default=_DEFAULTS.memory_mb, help="address-space limit in MiB"
    )
    parser.add_argument("--isolation", default="auto", choices=ISOLATION_CHOICES)
    args = parser.parse_args(argv)
    if not os.path.isfile(args.path):
        parser.error(f"PATH={args.path!r} is not a file: give the path of a Python source file")
    config = SandboxConfig(
        timeout_s=args.timeout, memory_mb=args.memory_mb, isolation=args.isolation
    )
    with Sandbox(config) as sandbox:
        result = sandbox.run_file(args.path)
        memory_limit = sandbox.memory_limit
    print(json.dumps({**result.to_json(), "memory_limit": memory_limit}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
