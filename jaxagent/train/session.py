"""Load a trained policy back from a run directory (for ``eval``, ``rollout`` and ``export``).

A run directory holds ``config.yaml`` (the resolved run config), ``tokenizer/`` (a
``save_pretrained`` directory) and ``checkpoints/`` (orbax). ``load_policy`` accepts the run
directory or its ``checkpoints`` directory.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Optional

import jax

from jaxagent.rl.train_state import TrainState
from jaxagent.train.checkpoint import Checkpointer
from jaxagent.train.config import Config, load_config
from jaxagent.train.policy import build_model, run_optimizer
from jaxagent.train.tokenizer import load_tokenizer_dir


@dataclasses.dataclass
class LoadedPolicy:
    config: Config  # the run's own config
    tokenizer: Any
    graphdef: Any
    params: Any  # model parameters (LoRA merged)
    model_config: Any
    step: int
    meta: dict


def run_dir_of(checkpoint: str | Path) -> Path:
    path = Path(checkpoint)
    if (path / "config.yaml").exists():
        return path
    if (path.parent / "config.yaml").exists():
        return path.parent
    raise FileNotFoundError(
        f"{str(checkpoint)!r} is not a jaxagent run directory (no config.yaml in it or its "
        "parent); pass the directory `jaxagent train` wrote, e.g. runs/quickstart/seed0")


def load_policy(checkpoint: str | Path, step: Optional[int] = None) -> LoadedPolicy:
    """The policy saved in a run directory (newest checkpoint unless ``step`` is given)."""
    run_dir = run_dir_of(checkpoint)
    config = load_config(run_dir / "config.yaml")
    tokenizer = load_tokenizer_dir(str(run_dir / "tokenizer"))
    graphdef, like, model_config = build_model(config.model, tokenizer, jax.random.key(0))
    ckpt = Checkpointer(run_dir / "checkpoints", async_save=False)
    step = ckpt.latest_step() if step is None else step
    if step is None:
        raise FileNotFoundError(f"no checkpoint in {str(run_dir / 'checkpoints')!r}")
    rl = config.rl_config()
    template = TrainState.create(like, rl, jax.random.key(0), optimizer=run_optimizer(config),
                                 ref_params=like if rl.needs_reference else None)
    state, meta = ckpt.restore(step, template)
    ckpt.close()
    return LoadedPolicy(config, tokenizer, graphdef, state.model_params(), model_config, step,
                        meta)
