"""Run metrics: one JSON line per record, TensorBoard event files, optional W&B.

``MetricsLogger.log(step, metrics)`` appends ``{"step": step, **metrics}`` to
``<run_dir>/metrics.jsonl`` and writes every numeric value as a TensorBoard scalar (via
tensorboardX, no TensorFlow needed). ``read_jsonl`` reads a run's records back.
"""

from __future__ import annotations

import json
import math
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
        with self.path.open("w") as f:
            for r in keep:
                f.write(json.dumps(r) + "\n")

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        record = {"step": int(step), **{k: _plain(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
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


def read_jsonl(path: str | Path) -> list[dict]:
    with Path(path).open() as f:
        return [json.loads(line) for line in f if line.strip()]
