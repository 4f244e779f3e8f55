"""Whole-job memory and process limits through a cgroup, where the machine offers one.

Without a cgroup, a job's memory is bounded only by RLIMIT_AS per process x RLIMIT_NPROC
processes. With one, every process of the job lives in a per-worker cgroup whose limits bound
their *sum* (and the kernel OOM-kills inside it, never the trainer). Preferred: cgroup v2
(``memory.max``, ``pids.max``, ``memory.events``); else the v1 ``memory`` and ``pids``
hierarchies. ``create`` returns None plus the reason when neither is writable (not root, no
delegation), and the sandbox reports which mechanism bounds memory.
"""

from __future__ import annotations

import dataclasses
import os
import shutil

_ROOT = "/sys/fs/cgroup"


@dataclasses.dataclass(frozen=True)
class JobCgroup:
    kind: str  # "v2" or "v1"
    dirs: tuple[str, ...]  # created directories (v1: memory and maybe pids), removed on close
    procs: tuple[str, ...]  # cgroup.procs files a candidate joins (writes "0")
    events: str  # file whose "oom_kill N" counts OOM kills in the cgroup
    describe: str

    def close(self) -> None:
        for d in self.dirs:
            try:
                os.rmdir(d)
            except OSError:
                shutil.rmtree(d, ignore_errors=True)


def _own_path(controller: str) -> str | None:
    """This process's cgroup path in the v2 ("") or a v1 ``controller`` hierarchy."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, names, path = line.rstrip("\n").split(":", 2)
                if names.split(",") == [controller] or (controller == "" and names == ""):
                    return path
    except OSError:
        return None
    return None


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _v2_mount() -> str | None:
    for cand in (_ROOT, f"{_ROOT}/unified"):
        if os.path.exists(f"{cand}/cgroup.controllers"):
            return cand
    return None


def _try_v2(name: str, memory: int, pids: int) -> JobCgroup | str:
    mount, own = _v2_mount(), _own_path("")
    if mount is None or own is None:
        return "no cgroup v2 hierarchy"
    parent = os.path.join(mount, own.lstrip("/"))
    with open(f"{parent}/cgroup.controllers") as f:
        available = f.read().split()
    if "memory" not in available:
        return f"cgroup v2 at {mount} offers {available or 'no controllers'}, not memory"
    base = os.path.join(parent, name)
    try:
        os.mkdir(base)
        _write(
            f"{base}/cgroup.subtree_control", "+memory" + (" +pids" if "pids" in available else "")
        )
        job = os.path.join(base, "job")
        os.mkdir(job)
        _write(f"{job}/memory.max", str(memory))
        if os.path.exists(f"{job}/memory.swap.max"):
            _write(f"{job}/memory.swap.max", "0")
        if os.path.exists(f"{job}/pids.max"):
            _write(f"{job}/pids.max", str(pids))
    except OSError as e:
        shutil.rmtree(base, ignore_errors=True)
        return f"cgroup v2 not writable here ({e.strerror})"
    return JobCgroup(
        "v2",
        (job, base),
        (f"{job}/cgroup.procs",),
        f"{job}/memory.events",
        f"cgroup v2 memory.max={memory >> 20}MiB pids.max={pids} (all processes of a job)",
    )


def _try_v1(name: str, memory: int, pids: int) -> JobCgroup | str:
    own = _own_path("memory")
    if own is None or not os.path.isdir(f"{_ROOT}/memory"):
        return "no cgroup v1 memory hierarchy"
    mem = os.path.join(_ROOT, "memory", own.lstrip("/"), name)
    dirs, procs = [mem], [f"{mem}/cgroup.procs"]
    try:
        os.mkdir(mem)
        _write(f"{mem}/memory.limit_in_bytes", str(memory))
        if os.path.exists(f"{mem}/memory.memsw.limit_in_bytes"):
            _write(f"{mem}/memory.memsw.limit_in_bytes", str(memory))  # no escape into swap
        described = f"cgroup v1 memory.limit_in_bytes={memory >> 20}MiB"
        own_pids = _own_path("pids")
        if own_pids is not None and os.path.isdir(f"{_ROOT}/pids"):
            pid_dir = os.path.join(_ROOT, "pids", own_pids.lstrip("/"), name)
            os.mkdir(pid_dir)
            dirs.append(pid_dir)
            _write(f"{pid_dir}/pids.max", str(pids))
            procs.append(f"{pid_dir}/cgroup.procs")
            described += f" pids.max={pids}"
    except OSError as e:
        for d in reversed(dirs):
            if os.path.isdir(d):
                os.rmdir(d)
        return f"cgroup v1 memory not writable here ({e.strerror})"
    return JobCgroup(
        "v1",
        tuple(dirs),
        tuple(procs),
        f"{mem}/memory.oom_control",
        described + " (all processes of a job)",
    )


def create(name: str, memory_bytes: int, max_pids: int) -> tuple[JobCgroup | None, str]:
    """A fresh cgroup ``name`` under this process's own; (cgroup, description) or (None, why)."""
    reasons = []
    for attempt in (_try_v2, _try_v1):
        try:
            got = attempt(name, memory_bytes, max_pids)
        except OSError as e:
            got = f"{attempt.__name__[5:]}: {e.strerror}"
        if isinstance(got, JobCgroup):
            return got, got.describe
        reasons.append(got)
    return None, "; ".join(reasons)


def oom_kills(text: str) -> int:
    """The ``oom_kill N`` count in memory.events (v2) or memory.oom_control (v1)."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return 0
