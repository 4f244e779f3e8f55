"""A run's train state: its device layout, a fresh state, a checkpoint restored into it, and
the update step over that layout.

The layout (``config.mesh`` over the model's shapes) is built before any weight exists, so
that the weights are born in their shards (``jaxagent.train.run.build_run`` returns it with
the run); everything here reads it, nothing sets it. The state itself is
``jaxagent.rl.train_state.TrainState`` (params, optimizer state, step, update RNG; a frozen
reference copy for KL recipes).
"""

from __future__ import annotations

import functools
from pathlib import Path
import jax

from jaxagent.models import abstract_graphdef, abstract_params
from jaxagent.parallel.layout import DeviceLayout, ShardedUpdate, place
from jaxagent.rl.config import RLConfig
from jaxagent.rl.model_fns import model_logprob_fn
from jaxagent.rl.train_state import TrainState
from jaxagent.rl.update import make_update_step
from jaxagent.train.checkpoint import CheckpointError, Checkpointer

__all__ = ["RunState", "device_layout", "update_step"]


def device_layout(mesh, model_config, sampler_devices: int = 0) -> DeviceLayout:
    """The device layout of ``mesh`` (the config's ``mesh`` section) over the shapes of
    ``model_config``: built before any weight is read or made."""
    return DeviceLayout.build(
        mesh,
        abstract_graphdef(model_config),
        abstract_params(model_config),
        sampler_devices=sampler_devices,
    )


def update_step(rl: RLConfig, layout: DeviceLayout, graphdef, optimizer) -> ShardedUpdate:
    """The recipe's jitted update over ``layout``, on the memory-lean learner pass (block
    remat unless ``rl.update.remat`` is off; the vocabulary head only over positions that
    carry loss): ``benchmarks/update_memory.py``."""
    lean = model_logprob_fn(
        graphdef,
        remat=rl.update.remat,
        skip_unmasked_chunks=True,
        activation_sharding=layout.activation_sharding(),
    )
    return ShardedUpdate(
        layout, functools.partial(make_update_step, rl, optimizer=optimizer, logprob_fn=lean)
    )


class RunState:
    """Makes and restores the train state of one run in its layout.

    Args:
      layout: the run's device layout.
      rl: the recipe (a KL recipe keeps a frozen reference copy of the start).
      optimizer: the optax transformation.
      key: the update RNG a fresh state starts from.
      params_like: the params' shapes and dtypes (``jax.ShapeDtypeStruct`` leaves).
    """

    def __init__(self, layout: DeviceLayout, rl: RLConfig, optimizer, key, params_like):
        self.layout, self.rl, self.optimizer = layout, rl, optimizer
        self._key, self._params_like = key, params_like

    def _make(self, params) -> TrainState:
        ref = params if self.rl.needs_reference else None  # create() copies it
        return TrainState.create(
            params, self.rl, self._key, optimizer=self.optimizer, ref_params=ref
        )

    def new(self, params) -> TrainState:
        """A fresh TrainState owning ``params``.

        Made under ``jit`` with the state's shardings as ``out_shardings`` and ``params``
        donated: the Adam moments are born in their shards (never whole on one device) and
        the parameters become the state's own buffers (no second copy)."""
        if self.layout.mesh is None:
            return self._make(params)
        shardings = self.layout.state_shardings(jax.eval_shape(self._make, params), self.optimizer)
        return jax.jit(self._make, out_shardings=shardings, donate_argnums=0)(params)

    def like(self) -> TrainState:
        """An abstract TrainState (shapes, dtypes, shardings) to restore a checkpoint into."""
        key = self._key  # replicated over the mesh, as the live state's key is
        if self.layout.mesh is not None:
            key = place(key, self.layout.replicated())
        abstract = jax.eval_shape(self._make, self._params_like)
        return self.layout.abstract_state(abstract, self.optimizer).replace(rng=key)

    def restore(
        self, checkpointer: Checkpointer, step: int, run_dir: Path
    ) -> tuple[TrainState, dict]:
        """Checkpoint ``step`` into this layout: ``(state, meta)``. A
        checkpoint this config cannot read (another model shape or recipe) is a one-line
        ``CheckpointError``."""
        try:
            return checkpointer.restore(step, self.like())
        except Exception as err:  # orbax raises many types for a mismatched tree
            raise CheckpointError(
                f"train.out_dir={str(run_dir)!r}: checkpoint {step} cannot be restored "
                f"into this config's train state ({type(err).__name__}: "
                f"{(str(err).splitlines() or [''])[0][:160]}); train into another "
                "train.out_dir, or resume with the settings the run was trained with"
            ) from None
