"""A live progress display for long loops: rich (default), tqdm, or none.

On a terminal "rich" draws a live bar. When stderr is not a terminal (a log file, ``nohup``,
a cluster job's output) a live bar prints nothing until the loop ends, so "rich" writes a
plain line instead every ``every_s`` seconds (``train.progress_every_s``), from a timer:
a step that takes minutes (the first one compiles) still shows the run is alive.
"""

from __future__ import annotations

import sys
import threading
import time


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class Progress:
    """Context manager with ``update(n, **fields)``; ``kind`` is "rich", "tqdm" or "none".

    The display goes to stderr so stdout stays clean for the final table and JSON line.
    ``every_s``: the period of the plain lines "rich" writes when stderr is not a terminal.
    """

    def __init__(self, kind: str, desc: str, total: int, start: int = 0, every_s: float = 30.0):
        self.kind, self.desc, self.total, self.start = kind, desc, total, start
        self.every_s = every_s
        self._bar = None
        self._lines: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._done, self._info, self._t0 = start, "", time.monotonic()

    def __enter__(self) -> "Progress":
        if self.kind == "rich" and not _is_terminal(sys.stderr):
            self.kind = "lines"
        self._t0 = time.monotonic()
        if self.kind == "lines":
            self._lines = threading.Thread(
                target=self._every, name=f"progress-{self.desc}", daemon=True
            )
            self._lines.start()
        elif self.kind == "rich":
            from rich.console import Console
            from rich.table import Column
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress as RichProgress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bar = RichProgress(
                TextColumn("[bold]{task.description}"),
                BarColumn(bar_width=20),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                # The metrics fold onto further lines on a narrow console instead of
                # squeezing the step count and times out of the line.
                TextColumn("{task.fields[info]}", table_column=Column(overflow="fold", ratio=1)),
                console=Console(file=sys.stderr),
                transient=False,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task(
                self.desc, total=self.total, completed=self.start, info=""
            )
        elif self.kind == "tqdm":
            from tqdm import tqdm

            self._bar = tqdm(
                total=self.total,
                initial=self.start,
                desc=self.desc,
                file=sys.stderr,
                dynamic_ncols=True,
            )
        return self

    def update(self, n: int = 1, **fields) -> None:
        info = " ".join(f"{k}={v}" for k, v in fields.items())
        if self.kind == "lines":
            with self._lock:
                self._done += n
                self._info = info
        elif self.kind == "rich" and self._bar is not None:
            self._bar.update(self._task, advance=n, info=info)
        elif self.kind == "tqdm" and self._bar is not None:
            self._bar.update(n)
            if fields:
                self._bar.set_postfix(fields, refresh=False)

    def line(self) -> str:
        """The plain progress line: ``sft 12/300 0:00:34 elapsed ~0:13:20 left loss=5.358``."""
        with self._lock:
            done, info = self._done, self._info
        elapsed = time.monotonic() - self._t0
        parts = [f"{self.desc} {done}/{self.total}", f"{_clock(elapsed)} elapsed"]
        if done > self.start and done < self.total:
            left = elapsed / (done - self.start) * (self.total - done)
            parts.append(f"~{_clock(left)} left")
        if info:
            parts.append(info)
        return " ".join(parts)

    def _every(self) -> None:
        while not self._stop.wait(self.every_s):
            print(self.line(), file=sys.stderr, flush=True)

    def __exit__(self, *exc) -> None:
        if self._lines is not None:
            self._stop.set()
            self._lines.join()
            if exc[0] is None:  # the loop's last state, once
                print(self.line(), file=sys.stderr, flush=True)
        if self._bar is not None:
            if self.kind == "rich":
                self._bar.__exit__(*exc)
            else:
                self._bar.close()


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stream
        return False
