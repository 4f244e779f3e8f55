"""Load a trained policy back from a run directory (for ``eval``, ``rollout`` and ``export``).

A run directory holds ``config.yaml`` (the resolved run config), ``tokenizer/`` (a
``save_pretrained`` directory) and ``checkpoints/`` (orbax). ``load_policy`` accepts the run
directory or its ``checkpoints`` directory; a path that is not one, or a run directory missing
its tokenizer or checkpoints, raises ``CheckpointError`` naming the path and the fix.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax

from jaxagent.parallel.layout import DeviceLayout, place
from jaxagent.rl.train_state import TrainState
from jaxagent.train.checkpoint import CheckpointError, Checkpointer, storage_path
from jaxagent.train.config import Config, load_config
from jaxagent.train.policy import build_model, run_optimizer
from jaxagent.models import load_tokenizer


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
    what = "does not exist" if not path.exists() else "has no config.yaml (nor its parent)"
    raise CheckpointError(
        f"--checkpoint {str(checkpoint)!r} {what}; pass the run directory `jaxagent train` "
        "wrote, e.g. runs/quickstart/seed0"
    )


def parse_step(text: str) -> str | int:
    """``--step``'s value: ``best``, ``latest`` or a checkpoint number."""
    if text in ("best", "latest"):
        return text
    try:
        step = int(text)
    except ValueError:
        step = -1
    if step < 0:
        raise CheckpointError(
            f"--step {text!r} is not a checkpoint: pass best (the best-validation one), "
            "latest, or a step number such as 20"
        )
    return step


def load_policy(checkpoint: str | Path, step: str | int = "latest") -> LoadedPolicy:
    """The policy saved in a run directory: its ``latest`` checkpoint, its ``best`` one (by
    validation success, or held-out success without a validation set: the one the trainer
    keeps), or checkpoint ``step``. Reads only: a training still writing the directory is
    left alone."""
    run_dir = run_dir_of(checkpoint)
    config = load_config(run_dir / "config.yaml")
    try:
        tokenizer = load_tokenizer(str(run_dir / "tokenizer"))
    except FileNotFoundError:
        raise CheckpointError(
            f"--checkpoint {str(checkpoint)!r} is incomplete: no tokenizer in "
            f"{str(run_dir / 'tokenizer')!r}; pass a run directory `jaxagent train` finished "
            "setting up (it saves the tokenizer before training)"
        ) from None
    # Shapes only: the weights come from the checkpoint, restored straight into the run's
    # own mesh layout (each device reads its shards; nothing is whole on one device).
    graphdef, like, model_config = build_model(
        config.model, tokenizer, jax.random.key(0), abstract=True
    )
    layout = DeviceLayout.build(config.mesh, graphdef, like)
    ckpts = storage_path(config.checkpoint_dir(run_dir))
    if not ckpts.is_dir():
        raise CheckpointError(
            f"--checkpoint {str(checkpoint)!r} is incomplete: no {str(ckpts)!r} directory; "
            "train until the first checkpoint is saved"
        )
    ckpt = Checkpointer(ckpts, read_only=True)
    try:
        steps = ckpt.all_steps()
        chosen = {"latest": ckpt.latest_step, "best": ckpt.best_step}
        found = chosen[step]() if step in chosen else (step if step in steps else None)
        if found is None:
            have = f"steps {steps}" if steps else "none"
            want = {"latest": "no checkpoint", "best": "no checkpoint with a validation score"}
            want = want.get(step, f"checkpoint {step} not")
            raise CheckpointError(
                f"--checkpoint {str(checkpoint)!r}: {want} found in {str(ckpts)!r} "
                f"(found {have}); train until the first checkpoint is saved, or pass "
                "--step with one of those"
            )
        step = found
        rl, optimizer = config.rl_config, run_optimizer(config)
        abstract = jax.eval_shape(
            lambda p: TrainState.create(
                p,
                rl,
                jax.random.key(0),
                optimizer=optimizer,
                ref_params=p if rl.needs_reference else None,
            ),
            like,
        )
        key = jax.random.key(0)  # a concrete key: the checkpoint stores its raw data
        if layout.mesh is not None:
            key = place(key, layout.replicated())
        template = layout.abstract_state(abstract, optimizer).replace(rng=key)
        try:
            state, meta = ckpt.restore(step, template)
        except Exception as err:  # orbax raises many types for a half-written directory
            first = (str(err).splitlines() or [""])[0][:200]
            raise CheckpointError(
                f"--checkpoint {str(checkpoint)!r}: checkpoint {step} in {str(ckpts)!r} cannot "
                f"be read into the model and recipe of {str(run_dir / 'config.yaml')!r} "
                f"({type(err).__name__}: {first}); pass another --step, or re-run training"
            ) from None
    finally:
        ckpt.close()
    params = state.model_params()  # the optimiser state is dropped with ``state``
    return LoadedPolicy(config, tokenizer, graphdef, params, model_config, step, meta)


# Model and tokenizer settings come from a checkpoint's own config: overrides of them on
# ``eval`` / ``rollout --checkpoint`` cannot apply.
_CHECKPOINT_OWNED = ("model.", "tokenizer.")


def checkpoint_notes(config: Config, policy: LoadedPolicy, overrides: list[str]) -> list[str]:
    """Lines for the user when a checkpoint runs under ``config``: the ``key=value`` overrides
    it ignores (its own model and tokenizer are used), and an environment other than the one
    it was trained on."""
    from jaxagent.train.config import config_to_dict
    from jaxagent.train.run_dir import flat

    notes = []
    asked, own = flat(config_to_dict(config)), flat(config_to_dict(policy.config))
    last = {o.split("=", 1)[0]: o for o in overrides}  # a later override wins
    ignored = [
        o for k, o in last.items() if k.startswith(_CHECKPOINT_OWNED) and asked.get(k) != own.get(k)
    ]
    if ignored:
        notes.append(
            f"note: {', '.join(ignored)} ignored: the checkpoint's own model and tokenizer are used"
        )
    mine, theirs = config.env, policy.config.env
    if (mine.name, dict(mine.options)) != (theirs.name, dict(theirs.options)):
        notes.append(
            f"warning: the checkpoint was trained on env {theirs.name!r} (options "
            f"{dict(theirs.options)}), this config runs env {mine.name!r} (options "
            f"{dict(mine.options)}); pass the run's own config (its config.yaml) to evaluate "
            "it where it was trained"
        )
    return notes
