"""The host side of one warm sandbox worker (``_worker.py``): start, isolation check, jobs.

``WorkerProcess`` starts the worker with an emptied environment in its own session, reads its
hello (which isolation the machine allows), refuses an isolation level that cannot keep the
grading out of the candidate's reach, and sends jobs one JSON line each way. Every reply must
carry the job's random token: a line the candidate managed to write into the pipe can never be
taken for a result (``Sandbox`` in ``sandbox.py`` owns a pool of these).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_worker.py")


class WorkerProcess:
    """One warm worker process; serves one job at a time (one JSON line each way)."""

    def __init__(self, isolation: str, config_fn, index: int):
        self.isolation, self.config_fn, self.index = isolation, config_fn, index
        self.start()

    def start(self):
        isolation = self.isolation
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", _WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            close_fds=True,
            start_new_session=True,
            cwd="/",
        )
        self.hello = json.loads(self.proc.stdout.readline() or b"{}")
        if not self.hello.get("ready"):
            raise RuntimeError("sandbox worker failed to start")
        ns_error, ll_error = self.hello["namespaces_error"], self.hello["landlock_error"]
        if isolation == "namespaces" and ns_error:
            self.kill()
            raise RuntimeError(
                f"isolation='namespaces' requested but unavailable: {ns_error}; use "
                "isolation='auto' (Landlock where namespaces are unavailable)"
            )
        self.namespaces = isolation in ("auto", "namespaces") and not ns_error
        self.landlock = not self.namespaces and isolation != "unsafe"
        if self.landlock and ll_error:
            self.kill()
            why = f"{ns_error}; {ll_error}" if isolation == "auto" else ll_error
            raise RuntimeError(
                f"isolation={isolation!r}: the sandbox cannot keep the grading out of the "
                f"candidate's reach on this machine ({why}); run as root (namespaces) or on "
                "Linux >= 6.12 with Landlock enabled, or opt in by name with "
                "isolation='unsafe' (hostile code can then read the tests and forge results)"
            )
        self.config = self.config_fn(self)
        self.proc.stdin.write((json.dumps(self.config) + "\n").encode())
        self.proc.stdin.flush()

    def request(self, job: dict, timeout: float) -> dict:
        """Sends one job; returns the worker's reply, the one line carrying this job's random
        token. Any other line was written into the pipe by the candidate (possible only with
        isolation='unsafe'): counted as ``forged_lines`` and charged to this job, so no
        result is ever attributed to another job."""
        token = os.urandom(16).hex()
        self.proc.stdin.write((json.dumps({**job, "token": token}) + "\n").encode())
        self.proc.stdin.flush()
        timer = threading.Timer(timeout, self.kill)  # backstop if the worker itself hangs
        timer.start()
        forged = 0
        try:
            while True:
                line = self.proc.stdout.readline()
                if not line:
                    raise RuntimeError("sandbox worker died")
                if not line.strip():
                    continue
                try:
                    reply = json.loads(line)
                except ValueError:
                    reply = None
                if isinstance(reply, dict) and reply.get("token") == token:
                    reply["forged_lines"] = forged
                    return reply
                forged += 1
        finally:
            timer.cancel()

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def close(self):
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except Exception:  # noqa: BLE001
            self.kill()
            self.proc.wait()
