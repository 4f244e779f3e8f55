"""Run metrics: one JSON line per record, TensorBoard event files, optional W&B.

``MetricsLogger.log(step, metrics)`` appends ``{"step": step, **metrics}`` to
``<run_dir>/metrics.jsonl`` and writes every numeric value as a TensorBoard scalar (via
tensorboardX, no TensorFlow needed). ``read_jsonl`` reads a run's records back.

Crash safety: a record is appended with one ``write`` of a whole line, flushed at once, so a
crash can only leave a partial *last* line, which ``read_jsonl`` skips (everything before it
is read); the one rewrite, ``truncate_after`` on resume, writes a temporary file and renames
it over the old one (``os.replace``), so a kill there leaves the old file whole.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np


def _plain(value: Any) -> Any:
    if isinstance(value, (np.generic,)):
        return value.item()
    if hasattr(value, "shape") and getattr(value, "shape", None) == ():
        return float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class MetricsLogger:
    """Writes metrics to JSONL (always), TensorBoard and W&B (optional).

    Args:
      run_dir: the run directory.
      tensorboard: also write TensorBoard event files under ``run_dir/tb``.
      wandb_project: a W&B project name to log to as well ("" = off).
      config: the run config as a dict (saved by W&B).
    """

    def __init__(
        self,
        run_dir: str | Path,
        tensorboard: bool = True,
        wandb_project: str = "",
        config: Mapping | None = None,
    ):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(Path(run_dir) / "tb"))
        self._wandb = None
        if wandb_project:
            try:
                import wandb
            except ImportError as err:
                raise ImportError("train.wandb=true needs `pip install wandb`") from err
            self._wandb = wandb.init(project=wandb_project, config=dict(config or {}))

    def truncate_after(self, step: int) -> None:
        """Drop records with ``step > step`` (a resumed run rewrites what it redoes)."""
        if not self.path.exists():
            return
        keep = [r for r in read_jsonl(self.path) if int(r.get("step", -1)) <= step]
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in keep))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        record = {"step": int(step), **{k: _plain(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")  # one write: a crash cuts only this line
        for k, v in record.items():
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                if self._tb is not None:
                    self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in record.items() if k != "step"}, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


class NullLogger:
    """The logger of a process that writes nothing (every process of a multi-host run but
    process 0, which writes the run's metrics once); takes ``MetricsLogger``'s arguments."""

    def __init__(self, *args, **kwargs):
        pass

    def truncate_after(self, step: int) -> None:
        pass

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


def read_jsonl(path: str | Path) -> list[dict]:
    """Every complete record; a final line cut short by a crash is skipped (a corrupt line
    anywhere else is an error, naming the file and line)."""
    with Path(path).open() as f:
        lines = [line for line in f.read().split("\n")]
    records, last = [], max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError as err:
            if i == last:  # the record being written when the process died
                break
            raise ValueError(
                f"{path}: line {i + 1} is not a JSON record ({err}); the file was edited or "
                "corrupted: fix or remove that line"
            ) from None
    return records
