"""A live progress display for long loops: rich (default), tqdm, or none."""

from __future__ import annotations

import sys


class Progress:
    """Context manager with ``update(n, **fields)``; ``kind`` is "rich", "tqdm" or "none".

    The display goes to stderr so stdout stays clean for the final table and JSON line.
    """

    def __init__(self, kind: str, desc: str, total: int, start: int = 0):
        self.kind, self.desc, self.total, self.start = kind, desc, total, start
        self._bar = None

    def __enter__(self) -> "Progress":
        if self.kind == "rich":
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
                # The metrics fold onto further lines on a narrow (or non-tty, 80-column)
                # console instead of squeezing the step count and times out of the line.
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
        if self.kind == "rich" and self._bar is not None:
            self._bar.update(self._task, advance=n, info=info)
        elif self.kind == "tqdm" and self._bar is not None:
            self._bar.update(n)
            if fields:
                self._bar.set_postfix(fields, refresh=False)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            if self.kind == "rich":
                self._bar.__exit__(*exc)
            else:
                self._bar.close()
