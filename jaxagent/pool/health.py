"""Health counters of the environment pool: timeouts, crashes, restarts, corrupt data, latency."""

from __future__ import annotations

import collections
import dataclasses
import threading

import numpy as np

COUNTERS = (
    "resets",  # reset calls that returned a valid observation
    "steps",  # step calls that returned a valid result
    "timeouts",  # calls that exceeded their timeout (worker restarted)
    "crashes",  # worker deaths (process exit, or EnvCrash in a thread worker)
    "corrupt",  # calls that returned data violating the protocol
    "exceptions",  # calls where the env raised an exception
    "restarts",  # workers restarted (after a timeout or a crash)
    "retries",  # reset attempts repeated after a failure
    "episodes_started",  # episodes started with async_reset
    "episodes_finished",  # episodes that ended (any reason, env_error included)
    "env_error_episodes",  # episodes that ended with Termination.ENV_ERROR
    "episodes_abandoned",  # episodes the caller replaced with a new reset before they ended
    "stale_results",  # results of abandoned calls, dropped
)


@dataclasses.dataclass
class Health:
    """Thread-safe counters plus a window of call latencies."""

    latency_window: int = 10_000
    counts: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))

    def __post_init__(self):
        self._lock = threading.Lock()
        self._latencies = collections.deque(maxlen=self.latency_window)

    def add(self, name: str, n: int = 1) -> None:
        if name not in self.counts:
            raise KeyError(f"unknown health counter {name!r}; known: {COUNTERS}")
        with self._lock:
            self.counts[name] += n

    def latency(self, seconds: float) -> None:
        with self._lock:
            self._latencies.append(seconds)

    def __getitem__(self, name: str) -> int:
        return self.counts[name]

    def snapshot(self) -> dict[str, float]:
        """Counters plus latency percentiles in milliseconds (p50, p90, p99, max)."""
        with self._lock:
            out: dict[str, float] = dict(self.counts)
            lat = np.asarray(self._latencies, np.float64) * 1e3
        for q in (50, 90, 99):
            out[f"latency_p{q}_ms"] = float(np.percentile(lat, q)) if lat.size else 0.0
        out["latency_max_ms"] = float(lat.max()) if lat.size else 0.0
        return out
