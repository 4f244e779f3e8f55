"""Sandbox results: the ``SandboxResult`` type and how a worker's reply is classified.

Kept apart from ``sandbox.py`` (the pool of workers). ``classify`` is where the statuses are
decided: a forged control line or a candidate-made report is charged to the candidate
(``failed`` / ``crashed``), an OOM kill in the job cgroup is ``memory``, and only the sandbox's
own failures are ``error``.
"""

from __future__ import annotations

import dataclasses
import os
import signal

MEMORY_EXIT = 251  # must match _worker.MEMORY_EXIT (_isolation.MEMORY_EXIT)


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """Outcome of one sandboxed job.

    ``status``: "passed" (exit 0 / all tests passed), "failed" (non-zero exit / a test failed),
    "timeout" (wall clock or CPU time), "memory" (address-space limit), "crashed" (killed by a
    signal, e.g. output over ``max_file_mb``, or the candidate process died mid-test), or
    "error" (the sandbox itself failed: not the candidate's fault).
    """

    status: str
    exit_code: int | None
    signal: int | None
    duration_s: float
    isolation: str
    stdout: str
    stderr: str
    tests_passed: int = 0
    tests_total: int = 0
    test_results: tuple = ()  # one dict per unit: {"src", "ok", "error"}
    detail: str = ""  # human-readable reason (first failing test, limit hit, ...)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def fraction_passed(self) -> float:
        return self.tests_passed / self.tests_total if self.tests_total else float(self.passed)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("test_results")
        return d


def truncate(data: bytes, limit: int) -> str:
    if len(data) <= limit:
        return data.decode("utf-8", "replace")
    half = limit // 2
    return (
        data[:half].decode("utf-8", "replace")
        + f"\n...[{len(data) - 2 * half} bytes cut]...\n"
        + data[-half:].decode("utf-8", "replace")
    )


def read_capped(path: str, limit: int) -> str:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size <= limit:
                return f.read().decode("utf-8", "replace")
            head = f.read(limit // 2)
            f.seek(size - limit // 2)
            return truncate(head + b"\0" * (size - limit) + f.read(), limit)
    except FileNotFoundError:
        return ""


def classify(
    rep: dict, total: int, stdout: str, stderr: str, config, isolation: str, memory_limit: str
) -> SandboxResult:
    """The ``SandboxResult`` of a worker reply (``rep``) for a job with ``total`` tests."""
    base = dict(
        duration_s=float(rep.get("duration_s", 0.0)),
        isolation=isolation,
        stdout=stdout,
        stderr=stderr,
    )
    if "error" in rep:
        return SandboxResult("error", None, None, detail=rep["error"][-1000:], **base)
    if rep.get("forged_lines"):  # the candidate wrote into the control channel
        return SandboxResult(
            "failed",
            None,
            None,
            tests_total=total,
            detail=f"the candidate wrote {rep['forged_lines']} line(s) into the sandbox's "
            "control channel: scored as a failure",
            **base,
        )
    if rep.get("oom_kills"):  # the job cgroup's limit: all its processes together
        limit_mb = config.job_memory_limit_mb
        code, sig = _decode_wait(rep.get("wait_status"))
        return SandboxResult(
            "memory",
            code,
            sig,
            tests_total=total,
            detail=f"the job's processes together exceeded {limit_mb} MiB ({memory_limit})",
            **base,
        )
    if rep.get("timed_out"):
        return SandboxResult(
            "timeout",
            None,
            signal.SIGKILL,
            detail=(f"wall-clock limit of {config.timeout_s}s exceeded"),
            **base,
        )
    code, sig = _decode_wait(rep.get("wait_status"))
    if rep.get("report") is None and not total:
        status, detail = _run_status(code, sig, config)
        return SandboxResult(status, code, sig, detail=detail, **base)
    report = rep.get("report") or {}
    units = tuple(report.get("units", ()))
    passed = sum(bool(u["ok"]) for u in units)
    first = next((u for u in units if not u["ok"]), None)
    detail = ""
    if report.get("harness_error"):
        status, detail = "error", report["harness_error"]
    elif report.get("timed_out") or sig == signal.SIGXCPU:
        status = "timeout"
    elif report.get("memory") or code == MEMORY_EXIT:
        status = "memory"
    elif report.get("crashed"):
        status = "crashed"
    elif passed == total and len(units) == total:
        status = "passed"
    else:
        status = "failed"
    if first is not None and not detail:
        detail = f"failed test: {first['src']}\n{first['error']}"
    return SandboxResult(
        status,
        code,
        sig,
        tests_passed=passed,
        tests_total=total,
        test_results=units,
        detail=detail[:4000],
        **base,
    )


def _decode_wait(status: int | None) -> tuple[int | None, int | None]:
    if status is None:
        return None, None
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    return os.WEXITSTATUS(status), None


def _run_status(code: int | None, sig: int | None, cfg) -> tuple[str, str]:
    if sig == signal.SIGXCPU:
        return "timeout", f"CPU-time limit of {cfg.cpu_limit_s}s exceeded"
    if sig == signal.SIGXFSZ:
        return "crashed", f"output or file size over the {cfg.max_file_mb} MiB limit"
    if sig is not None:
        return "crashed", f"killed by signal {signal.Signals(sig).name}"
    if code == MEMORY_EXIT:
        return "memory", f"MemoryError under the {cfg.memory_mb} MiB address-space limit"
    if code == 0:
        return "passed", ""
    return "failed", f"exit status {code}"
