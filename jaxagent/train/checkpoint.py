"""Checkpoints with orbax: async saves, keep the newest N plus the best by eval success.

A checkpoint holds the whole train state pytree (params, optimizer state, step, RNG) and a
JSON "meta" record with everything else a run needs to continue exactly: the iteration, the
data position, the sampling key, the evaluation history; an overlapped run's batches sampled
with older weights are a third item, ``pending``, of plain host arrays (nothing a checkpoint
holds is pickled: restoring one runs no code of the directory's). Orbax writes to a temporary directory
and renames it when complete, so a run killed mid-save resumes from the previous checkpoint;
leftover temporary directories are removed when the next run opens the directory, and
``latest_step`` names the newest checkpoint that is *complete* (every item's metadata on disk
and its meta readable), so a kill while an old checkpoint was being deleted cannot leave a
half-removed one to resume from (``tests/test_checkpoint_crash.py`` kills a save at 20+ points).

Memory: orbax's default async save copies every array to host before ``save`` returns, so
that the caller may donate the arrays at once: a second full copy of params and optimiser
state (measured +0.9x the state for a 975 MiB state). Here the device-to-host transfers (and
the writes) stream through a bounded window (``save_window_mb``, orbax's
``save_device_host_concurrent_gb``): +130 MiB for the same state, as fast. The price is
orbax's rule for that mode: the saved arrays must not be donated or changed until the save has
finished, so the trainer calls ``before_mutation()`` before anything that donates the state.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as cm

from jaxagent.errors import ConfigError

BEST_METRIC = "eval_success"
PENDING = "pending"  # the item of host arrays saved beside the state (``Checkpointer.save``)
# files every finished checkpoint has (orbax writes them last, before the final rename)
_REQUIRED = ("_CHECKPOINT_METADATA", "state/_METADATA", "state/manifest.ocdbt", "meta/metadata")


class CheckpointError(FileNotFoundError):
    """A checkpoint path is missing, not a run directory, incomplete, or of another model
    (one-line message)."""


class _Quiet(logging.Filter):
    """Orbax notes every save without metrics (the periodic ones) and every read-only
    manager (``eval`` / ``rollout`` / ``export``); both are by design here."""

    NOTES = ("did not provide metrics", "directory is read only", "read_only=True, setting")

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(note in record.getMessage() for note in self.NOTES)


logging.getLogger("absl").addFilter(_Quiet())


def _metric(metrics: dict) -> float:
    return metrics[BEST_METRIC]


def _to_savable(tree: Any) -> Any:
    """Typed PRNG keys become their raw uint32 data (orbax stores plain arrays)."""

    def conv(x):
        if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            return jax.random.key_data(x)
        return x

    return jax.tree.map(conv, tree)


def _from_saved(saved: Any, like: Any) -> Any:
    def conv(s, ref):
        if isinstance(ref, jax.Array) and jax.dtypes.issubdtype(ref.dtype, jax.dtypes.prng_key):
            return jax.random.wrap_key_data(s, impl=jax.random.key_impl(ref))
        return s

    return jax.tree.map(conv, saved, like)


class Checkpointer:
    """An orbax ``CheckpointManager`` for one run directory.

    Args:
      directory: where checkpoints live (``<run_dir>/checkpoints``).
      keep: how many of the newest checkpoints to keep (the best by ``eval_success`` is kept
        as well).
      async_save: save in a background thread (``wait()`` blocks until it is on disk).
      save_window_mb: bytes in flight from device to host (and to disk) during a save;
        0 copies the whole state at once (orbax's default: arrays free to donate at once).
      read_only: only restore (``eval``, ``rollout``, ``export``): nothing is created,
        deleted or cleaned up, so a training still writing the directory is left alone.
    """

    def __init__(
        self,
        directory: str | Path,
        keep: int = 3,
        async_save: bool = True,
        save_window_mb: int = 64,
        read_only: bool = False,
    ):
        self.directory = storage_path(directory)
        self._streaming, self._pending = save_window_mb > 0, False
        policy = cm.AnyPreservationPolicy(
            [
                cm.LatestN(n=keep),
                cm.BestN(
                    get_metric_fn=_metric,
                    n=1,
                    keep_checkpoints_without_metrics=False,
                ),
            ]
        )
        options = ocp.CheckpointManagerOptions(
            read_only=read_only,
            save_interval_steps=0 if read_only else 1,
            preservation_policy=None if read_only else policy,
            # Orbax writes a checkpoint's metrics to disk (and reads them back when a later
            # manager opens the directory) only when best_fn is set; without it the metrics
            # live in this manager's memory, so a resumed run saw the old best as a
            # checkpoint without metrics and LatestN deleted it.
            best_fn=_metric,
            best_mode="max",
            enable_async_checkpointing=async_save and not read_only,
            create=not read_only,
            cleanup_tmp_directories=not read_only,  # what a kill mid-save left behind
        )
        gb = save_window_mb / 1000 if save_window_mb > 0 else None
        handler = ocp.PyTreeCheckpointHandler(
            save_device_host_concurrent_gb=gb, save_concurrent_gb=gb
        )
        registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
        for item, args in (
            ("state", ocp.args.PyTreeSave),
            ("state", ocp.args.PyTreeRestore),
            ("meta", ocp.args.JsonSave),
            ("meta", ocp.args.JsonRestore),
        ):
            registry.add(item, args, handler if item == "state" else ocp.JsonCheckpointHandler())
        pending = ocp.PyTreeCheckpointHandler()
        registry.add(PENDING, ocp.args.PyTreeSave, pending)
        registry.add(PENDING, ocp.args.PyTreeRestore, pending)
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, handler_registry=registry
        )

    def save(
        self,
        step: int,
        state: Any,
        meta: dict,
        eval_success: Optional[float] = None,
        pending: Optional[dict] = None,
    ):
        """Save ``state`` (a pytree of arrays) and ``meta`` (JSON) as checkpoint ``step``;
        ``pending``: host arrays (a nested dict of numpy arrays) saved beside them, the
        overlapped rollout's batches that the state's weights did not sample."""
        metrics = None if eval_success is None else {BEST_METRIC: float(eval_success)}
        items = {
            "state": ocp.args.PyTreeSave(_to_savable(state)),
            "meta": ocp.args.JsonSave(meta),
        }
        if pending:
            items[PENDING] = ocp.args.PyTreeSave(pending)
        self._manager.save(step, args=ocp.args.Composite(**items), metrics=metrics, force=True)
        self._pending = self._streaming

    def before_mutation(self) -> None:
        """Block until a streaming save has read every array: call before donating (or
        otherwise changing) the state that was saved. A no-op when nothing is in flight."""
        if self._pending:
            self.wait()

    def latest_step(self) -> Optional[int]:
        """The newest complete checkpoint (None when there is none)."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def all_steps(self) -> list[int]:
        """Complete checkpoints, oldest first (a half-deleted or half-written one is skipped)."""
        return complete_steps(self.directory)

    def best_step(self) -> Optional[int]:
        """The complete checkpoint with the best ``eval_success`` (ties: the newest), the one
        the keep-best rule preserves; None when no checkpoint carries the metric."""
        scored = [(m, s) for s in self.all_steps() if (m := self.metric(s)) is not None]
        return max(scored)[1] if scored else None

    def metric(self, step: int) -> Optional[float]:
        """Checkpoint ``step``'s ``eval_success`` as saved (None when it was saved without)."""
        try:
            metrics = json.loads((self.directory / str(step) / "metrics" / "metrics").read_text())
        except (OSError, ValueError):
            return None
        value = metrics.get(BEST_METRIC) if isinstance(metrics, dict) else None
        return None if value is None else float(value)

    def is_complete(self, step: int) -> bool:
        return _is_complete(self.directory / str(step))

    def restore(self, step: int, like: Any) -> tuple[Any, dict]:
        """Restore checkpoint ``step`` into the structure (and shardings) of ``like``."""
        target = jax.tree.map(
            lambda x: ocp.utils.to_shape_dtype_struct(x) if hasattr(x, "shape") else x,
            _to_savable(like),
        )
        restore_args = ocp.checkpoint_utils.construct_restore_args(target)
        out = self._manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.PyTreeRestore(item=target, restore_args=restore_args),
                meta=ocp.args.JsonRestore(),
            ),
        )
        return _from_saved(out["state"], like), dict(out["meta"])

    def restore_pending(self, step: int) -> dict:
        """The host arrays saved as ``pending`` with checkpoint ``step`` (numpy; {} when it
        has none)."""
        if not (self.directory / str(step) / PENDING).exists():
            return {}
        out = self._manager.restore(
            step, args=ocp.args.Composite(**{PENDING: ocp.args.PyTreeRestore()})
        )
        return jax.tree.map(np.asarray, dict(out[PENDING]))

    def restore_meta(self, step: int) -> dict:
        out = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return dict(out["meta"])

    def wait(self) -> None:
        self._manager.wait_until_finished()
        self._pending = False

    def close(self) -> None:
        self.wait()
        self._manager.close()


def _is_complete(d: Path) -> bool:
    if not all((d / f).exists() for f in _REQUIRED):
        return False
    try:
        json.loads((d / "meta" / "metadata").read_text())
    except (OSError, ValueError):
        return False
    return True


def storage_path(path: Any) -> Any:
    """A checkpoint location: a local path (made absolute) or a URL of any filesystem orbax
    writes through ``etils.epath`` (``gs://bucket/run``: a pod's hosts all see it)."""
    text = str(path)
    if "://" in text:
        from etils import epath

        return epath.Path(text)
    return Path(text).absolute()


def check_same_directory(directory: Any) -> None:
    """With several processes, every one must see the checkpoint directory process 0 sees:
    orbax writes a checkpoint collectively, so a directory on each host's own disk would
    split it in pieces that no host can restore. Process 0 leaves a token there, every
    process reads it back; a process that cannot is named in a one-line ``ConfigError``.
    The token is removed again (and a directory made only for it)."""
    if jax.process_count() == 1:
        return
    import secrets

    from jax.experimental import multihost_utils

    d = storage_path(directory)
    token = int(multihost_utils.broadcast_one_to_all(np.int32(secrets.randbits(31))))
    probe = d / f".shared-{token}"
    made = False
    if jax.process_index() == 0:
        made = not d.exists()
        d.mkdir(parents=True, exist_ok=True)
        probe.write_text(str(token))
    multihost_utils.sync_global_devices("checkpoint directory token written")
    try:
        sees = probe.exists() and probe.read_text() == str(token)
    except OSError:
        sees = False
    seen = np.asarray(multihost_utils.process_allgather(np.int32(sees)))
    multihost_utils.sync_global_devices("checkpoint directory token read")
    if jax.process_index() == 0:
        probe.unlink()
        if made:
            d.rmdir()
    # No process looks at the directory (complete_steps, next) while process 0 removes it.
    multihost_utils.sync_global_devices("checkpoint directory token removed")
    blind = [i for i, ok in enumerate(seen.reshape(-1)) if not ok]
    if blind:
        raise ConfigError(
            f"checkpoint directory {str(d)!r}: process(es) {blind} of {jax.process_count()} "
            "do not see what process 0 writes there; put checkpoints where every host sees "
            "them: a shared filesystem for train.out_dir, or train.checkpoint_dir=gs://..."
        )


def complete_steps(directory: Any) -> list[int]:
    """The complete checkpoints under ``directory``, oldest first, read from the directory
    alone (no manager is opened, so nothing is created or cleaned up)."""
    d = storage_path(directory)
    if not d.is_dir():
        return []
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit() and _is_complete(p))


def refuse_overwrite(directory: Path, resume: bool, out_dir: Path) -> None:
    """With ``train.resume=false`` a run directory holding checkpoints would have its config,
    metrics and checkpoints mixed with the new run's (and orbax refuses step 0 only after SFT
    and the first evaluation): refuse before any work."""
    steps = [] if resume else complete_steps(directory)
    if steps:
        raise ConfigError(
            f"train.resume=false but train.out_dir={str(out_dir)!r} already holds "
            f"checkpoints (steps {steps}); set train.resume=true to continue that run, or "
            "choose another train.out_dir (or delete the old one)"
        )


def restore_params_only(directory: str | Path, step: Optional[int] = None) -> tuple[Any, dict, int]:
    """Read params (as saved) and meta from a checkpoint directory, without a template.

    Used by ``jaxagent eval`` / ``export`` / ``rollout``. Returns (state tree as numpy, meta,
    step); ``step`` defaults to the newest checkpoint.
    """
    manager = ocp.CheckpointManager(
        storage_path(directory), options=ocp.CheckpointManagerOptions(read_only=True)
    )
    step = manager.latest_step() if step is None else step
    if step is None:
        raise FileNotFoundError(
            f"no checkpoint found in {str(directory)!r}; pass the run's "
            "checkpoints directory (e.g. runs/quickstart/seed0/checkpoints)"
        )
    # The target: every array on this process's first device. The saved shardings name the
    # devices of the run that wrote it (a mesh, other hosts) and cannot be rebuilt here.
    saved = ocp.StandardCheckpointer().metadata(Path(directory).absolute() / str(step) / "state")
    one = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    target = jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one),
        saved.item_metadata,
        is_leaf=lambda m: hasattr(m, "shape") and hasattr(m, "dtype"),
    )
    out = manager.restore(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()
        ),
    )
    manager.close()
    state = jax.tree.map(np.asarray, out["state"])
    return state, dict(out["meta"]), step
