"""The pool's clocks: call deadlines and reset retries with back-off.

``Timers`` keeps one heap of ``(time, seq, env_id)`` for every call's deadline and every
scheduled reset retry (``seq == RETRY``), so ``EnvPool.recv`` finds the next thing due in
O(log N) per answer (256 envs at 5k calls/s). Entries are never removed when a call answers;
they go stale and are skipped (``live`` decides), and the heap is compacted now and then.

``RetryPolicy`` says whether a failed call is tried again and after how long: a reset is
idempotent and is retried ``max_retries`` times with exponential, capped back-off; a step is
never retried (the env's state died with its worker), so its episode ends with env_error.
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from collections.abc import Callable, Iterator

RETRY = -1  # the seq of a scheduled reset retry


class Timers:
    """A heap of deadlines with lazy deletion.

    Args:
      live: ``live(when, seq, env_id)`` is False once an entry is stale (its call answered,
        its retry cancelled).
      compact_at: heap size past which stale entries are dropped on the next push.
    """

    def __init__(self, live: Callable[[float, int, int], bool], compact_at: int):
        self._live, self._compact_at = live, compact_at
        self._heap: list[tuple[float, int, int]] = []

    def push(self, when: float, seq: int, env_id: int) -> None:
        if len(self._heap) > self._compact_at:
            self._heap = [t for t in self._heap if self._live(*t)]
            heapq.heapify(self._heap)
        heapq.heappush(self._heap, (when, seq, env_id))

    def next_time(self, idle: float = 0.05) -> float:
        """When the earliest entry is due (``idle`` seconds from now when there is none)."""
        return self._heap[0][0] if self._heap else time.monotonic() + idle

    def due(self, now: float) -> Iterator[tuple[float, int, int]]:
        """Pop and yield every live entry due at ``now``, earliest first."""
        while self._heap and self._heap[0][0] <= now:
            entry = heapq.heappop(self._heap)
            if self._live(*entry):
                yield entry


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries of failed resets (see the module docstring)."""

    max_retries: int = 2  # extra reset attempts after a failed reset
    backoff_s: float = 0.05  # the first retry waits this long, then 2x, 4x, ...
    backoff_max_s: float = 2.0  # cap of the back-off

    @classmethod
    def of(cls, config) -> RetryPolicy:
        return cls(config.max_retries, config.backoff_s, config.backoff_max_s)

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based): exponential, capped."""
        return min(self.backoff_max_s, self.backoff_s * 2 ** (attempt - 1))

    def next_attempt(self, kind: str, attempt: int) -> int | None:
        """The attempt number to schedule after ``kind``'s attempt ``attempt`` failed, or None
        to give up (a step, or a reset out of retries)."""
        return attempt + 1 if kind == "reset" and attempt < self.max_retries else None
