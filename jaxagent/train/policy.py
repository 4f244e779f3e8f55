"""The policy as the trainer sees it: model config from the run config, samplers, learner math.

``build_model(section, tokenizer, key)`` makes ``(graphdef, params)`` from scratch (vocabulary
from the tokenizer) or loads a Hugging Face directory. ``make_turn_sampler`` picks the cached
multi-turn sampler built on ``jaxagent.generate`` and falls back to the cache-free reference
sampler. ``make_logprob_fn`` is the learner's teacher-forced log-prob (and value) pass.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxagent.agents.cached import CachedTurnSampler
from jaxagent.agents.engine import EngineConfig, SlotEngine
from jaxagent.agents.sampling import ReferenceSampler
from jaxagent.agents.turn_policy import TurnPolicy
from jaxagent.generate import SamplingConfig
from jaxagent.models import (
    ModelConfig,
    abstract_graphdef,
    abstract_params,
    apply_model,
    init_model,
    load_hf,
    model_config as model_config_of,
    token_logprobs,
    token_values,
)
from jaxagent.rl.config import RLConfig
from jaxagent.rl.train_state import make_optimizer
from jaxagent.errors import ConfigError
from jaxagent.sections import build
from jaxagent.train.config import Config
from jaxagent.train.model_section import ModelSection, derived_model_fields


def hf_input(fn):
    """``fn`` (a Hugging Face directory loader: ``fn(path, ...)``) with its input errors as
    ``ConfigError`` naming ``model.init_from``, the path and what a valid directory holds (the
    CLI then exits 2 with one line instead of a traceback)."""

    def call(path, *args, **kwargs):
        try:
            return fn(path, *args, **kwargs)
        except ConfigError:
            raise
        except (OSError, ValueError, KeyError) as err:
            text = str(err.args[0]) if err.args else type(err).__name__
            raise ConfigError(
                f"model.init_from={str(path)!r}: {text}; pass a local Hugging Face directory "
                "of a Llama or Qwen2 model (config.json, model*.safetensors, tokenizer files)"
            ) from None

    return call


def model_config(section: ModelSection, tokenizer) -> ModelConfig:
    """A ``ModelConfig`` for a from-scratch model: the section's fields, the vocabulary and
    special ids from the tokenizer, ``head_dim = hidden_size // num_heads``."""
    return build(section, ModelConfig, **derived_model_fields(section, tokenizer))


def build_model(
    section: ModelSection,
    tokenizer,
    key: jax.Array,
    *,
    shardings: Callable[[ModelConfig], Any] | None = None,
    abstract: bool = False,
) -> tuple[Any, Any, ModelConfig]:
    """(graphdef, params, model config): loaded from ``section.init_from`` or built anew.

    ``shardings(model_config)``: the params' target shardings (None: one device), asked for
    once the model's shapes are known and before any weight exists, so that every parameter
    is born in its shards (``load_hf``'s slice reads; a jitted init with ``out_shardings``).
    ``abstract``: shapes and dtypes only, no weight read or made (a resumed run restores
    its weights from its checkpoint)."""
    if section.init_from:
        # The run's dtypes apply to a loaded model too; a critic asked for but absent from the
        # checkpoint gets a fresh value head.
        config, graphdef, params = hf_input(load_hf)(  # bad directory: ConfigError
            section.init_from,
            param_dtype=section.param_dtype,
            dtype=section.dtype,
            kv_cache_dtype=section.kv_cache_dtype,
            scan_layers=section.scan_layers,
            value_head=True if section.value_head else None,
            key=key,
            shardings=shardings,
            abstract=abstract,
        )
        if config.vocab_size < len(tokenizer):
            raise ValueError(
                f"model.init_from={section.init_from!r} has vocab_size "
                f"{config.vocab_size} < the tokenizer's {len(tokenizer)} tokens"
            )
        return graphdef, params, config
    config = model_config(section, tokenizer)
    placement = None if shardings is None else shardings(config)
    if abstract:
        return abstract_graphdef(config), abstract_params(config), config
    graphdef, params = init_model(config, key, shardings=placement)
    return graphdef, params, config


def make_logits_fn(graphdef) -> Callable:
    """``logits_fn(params, tokens, positions, segment_ids) -> logits [B,T,V]``."""

    def logits_fn(params, tokens, positions, segment_ids):
        return apply_model(graphdef, params, tokens, positions, segment_ids).logits

    return logits_fn


def make_logprob_fn(graphdef) -> Callable:
    """Jitted learner pass: ``(params, tokens, positions, segment_ids) -> (logprobs [B,T],
    values [B,T] aligned as values[:, t] = V(tokens[:, :t]) or None)``."""

    @jax.jit
    def fn(params, tokens, positions, segment_ids):
        out = apply_model(graphdef, params, tokens, positions, segment_ids)
        values = None if out.values is None else token_values(out.values)
        return token_logprobs(out.logits, tokens), values

    return fn


# The share of a chip's free memory (when the sampler is built) its KV cache may take: the
# rest is left to the decode step's own buffers and what the phase after it allocates.
KV_MEMORY_FRACTION = 0.8


def device_free_bytes(devices=None) -> Optional[int]:
    """The smallest free memory of ``devices`` (default: this process's), from
    ``Device.memory_stats()`` (``bytes_limit - bytes_in_use``); None where a device does not
    report it (the CPU backend): no limit."""
    free = []
    for d in devices if devices is not None else jax.local_devices():
        stats = d.memory_stats()
        if not stats or "bytes_limit" not in stats:
            return None
        free.append(int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)))
    return min(free) if free else None


def kv_bytes_per_row(config: ModelConfig, capacity: int) -> int:
    """Bytes of one KV-cache row of ``capacity`` tokens (keys and values of every layer,
    ``jaxagent.models.cache.init_cache``'s layout)."""
    item = jnp.dtype(config.jnp_kv_cache_dtype).itemsize
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * capacity * item


def state_reserve_bytes(params: Any, rl: RLConfig, loaded: bool = True) -> int:
    """Per-chip bytes the train state adds after the sampler is built (which measures the
    chip's free memory then): Adam's two moments of the trained parameters (full
    fine-tuning; LoRA's adapters are small), in float32 or the parameters' dtype
    (``rl.optim.moments_dtype``), and with ``loaded=False`` (a resumed run restores its
    weights later) the parameters themselves. A leaf counts its one shard on a mesh."""
    total = 0
    for x in jax.tree.leaves(params):
        sharding = getattr(x, "sharding", None)
        shape = sharding.shard_shape(x.shape) if sharding is not None else x.shape
        n, item = int(np.prod(shape, dtype=np.int64)), jnp.dtype(x.dtype).itemsize
        if not rl.lora.rank:
            total += n * 2 * (4 if rl.optim.moments_dtype == "float32" else item)
        if not loaded:
            total += n * item
    return total


def sized_engine(
    engine: EngineConfig,
    config: ModelConfig,
    capacity: int,
    *,
    streamed: bool,
    rows: int = 0,
    free_bytes: Optional[int] = None,
    row_shards: int = 1,
) -> EngineConfig:
    """``engine`` with its KV cache fitted to ``free_bytes`` (a chip's free memory; None: no
    limit, the engine unchanged): ``slots=0`` (one cache row per episode, every episode at
    once) becomes the slots that fit ``KV_MEMORY_FRACTION`` of it, and a setting that cannot
    fit is refused in one line with the computed need and the fix.

    Args:
      rows: the most episodes one call samples (rollout or evaluation), 0 if unknown;
        the lockstep engine holds all of them at once.
      row_shards: devices the rows split over (each chip holds its share of the rows).

    Raises:
      ConfigError naming ``rollout.slots`` / ``rollout.engine``, the bytes needed and free.
    """
    if free_bytes is None:
        return engine
    per_row = kv_bytes_per_row(config, capacity)
    budget = int(free_bytes * KV_MEMORY_FRACTION)
    fit = budget // per_row * max(1, row_shards)
    gib = lambda b: f"{b / 2**30:.2f} GiB"
    each = (
        f"{gib(per_row)} a row: 2 x {config.num_layers} layers x {config.num_kv_heads} kv heads "
        f"x {config.head_dim} x {capacity} tokens x "
        f"{jnp.dtype(config.jnp_kv_cache_dtype).itemsize} B"
    )
    room = f"{gib(budget)} ({KV_MEMORY_FRACTION:.0%} of the chip's {gib(free_bytes)} free)"
    if fit < 1:
        raise ConfigError(
            f"rollout: one episode's KV cache ({each}) exceeds {room}; lower "
            "rollout.max_total_tokens or set model.kv_cache_dtype=bfloat16"
        )
    share = lambda n: -(-n // max(1, row_shards))
    if engine.resolved(streamed) == "slots":
        if engine.slots == 0:
            return dataclasses.replace(engine, slots=fit if not rows else min(fit, rows))
        if engine.slots > fit:
            raise ConfigError(
                f"rollout.slots={engine.slots} needs {gib(share(engine.slots) * per_row)} of KV "
                f"cache per chip ({each}) but {room} fits {fit}; set rollout.slots={fit} or less"
            )
        return engine
    if rows > fit:
        raise ConfigError(
            f"rollout.engine={engine.engine} holds all {rows} episodes' KV caches at once: "
            f"{gib(share(rows) * per_row)} per chip ({each}) but {room} fits {fit}; set "
            f"rollout.engine=slots and rollout.slots={fit}, or sample fewer episodes a call"
        )
    return engine


def _less(free: Optional[int], reserve: int) -> Optional[int]:
    return None if free is None else max(0, free - reserve)


def make_turn_sampler(
    graphdef,
    sampling: SamplingConfig,
    max_len: int,
    kind: str = "auto",
    pad_id: int = 0,
    engine: Optional[EngineConfig] = None,
    streamed: bool = False,
    rows: int = 0,
    free_bytes: Optional[int] = None,
    reserve_bytes: int = 0,
) -> TurnPolicy:
    """The multi-turn LM sampler: "cached" (KV cache with ragged continuation), "reference"
    (re-encodes each row for every token) or "auto" (cached). A cached sampler runs its
    episodes through ``engine`` (``EngineConfig.resolved(streamed)``: ``streamed`` says the
    environments answer asynchronously, from a pool), its KV cache fitted to the chip's free
    memory (``sized_engine``; ``rows``: the most episodes a call samples; ``free_bytes``:
    default ``device_free_bytes()``, None on CPU; ``reserve_bytes``: what the run allocates
    later, ``state_reserve_bytes``)."""
    if kind not in ("auto", "cached", "reference"):
        raise ValueError(f"sampler kind={kind!r}; choose auto, cached or reference")
    if kind in ("auto", "cached"):
        engine = sized_engine(
            engine or EngineConfig(),
            model_config_of(graphdef),
            max_len,
            streamed=streamed,
            rows=rows,
            free_bytes=_less(
                device_free_bytes() if free_bytes is None else free_bytes, reserve_bytes
            ),
        )
        if engine.resolved(streamed) == "slots":
            return SlotEngine(
                graphdef,
                sampling,
                max_len,
                pad_id=pad_id,
                slots=engine.slots,
                decode_steps=engine.decode_steps,
                max_admit=engine.max_admit,
            )
        return CachedTurnSampler(graphdef, sampling, max_len, pad_id=pad_id)
    return ReferenceSampler(make_logits_fn(graphdef), sampling, max_len, pad_id=pad_id)


def rl_optimizer(
    rl: RLConfig, schedule: str, total_steps: int, final_ratio: float = 0.1
) -> optax.GradientTransformation:
    """The recipe's optimiser (``jaxagent.rl.make_optimizer``: AdamW, global-norm clipping,
    linear warm-up) with the learning rate after the warm-up "constant", or "linear" /
    "cosine" decayed to ``final_ratio * learning_rate`` at ``total_steps`` (the run's optimiser
    steps)."""
    return make_optimizer(rl, schedule, total_steps, final_ratio)


def run_optimizer(config: Config) -> optax.GradientTransformation:
    """The RL optimiser of a run: ``rl_optimizer`` over the run's optimiser steps (every
    iteration takes ``update.num_epochs * ceil(tasks * samples / update.minibatch_size)`` steps;
    with dynamic sampling the batch keeps that row count). The trainer
    and ``load_policy`` build it alike, so checkpoints restore into the same state layout."""
    rl = config.rl_config
    episodes = config.rollout.tasks_per_iteration * config.group_size
    steps_per_iteration = rl.update.num_epochs * -(-episodes // rl.update.minibatch_size)
    return rl_optimizer(
        rl,
        config.rl.lr_schedule,
        steps_per_iteration * config.train.iterations,
        config.rl.lr_final_ratio,
    )
