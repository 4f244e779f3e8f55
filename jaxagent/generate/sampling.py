"""Pure token sampling: temperature, top-k, top-p, greedy, with the sampled tokens' log-probs.

Log-prob convention: the returned log-prob of a sampled token is taken under
``softmax(logits / temperature)`` *before* top-k / top-p filtering, so at temperature 1 it
equals the teacher-forced log-prob of a forward pass over the produced sequence (what RL
importance ratios need). Greedy decoding reports temperature-1 log-probs.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxagent.errors import ConfigError


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """Decoding settings. Every field is static: changing one recompiles the sampler."""

    max_new_tokens: int = 128  # tokens generated per row (output width N)
    temperature: float = 1.0  # softmax temperature (> 0); ignored when greedy
    top_k: int = 0  # keep the k most likely tokens; 0 disables
    top_p: float = 1.0  # nucleus mass in (0, 1]; 1 disables
    greedy: bool = False  # argmax decoding
    stop_token_ids: tuple[int, ...] = ()  # a row stops after emitting one of these (kept)
    # The prompt is written into the KV cache in chunks of at most this many tokens, each
    # attending to the cache written so far: attention scores are [rows, heads, chunk,
    # capacity] instead of [rows, heads, prompt, capacity], so prefill memory grows linearly
    # with the prompt, not quadratically. 0 = the whole prompt in one call.
    prefill_chunk: int = 512

    def __post_init__(self):
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(
                f"SamplingConfig.max_new_tokens={self.max_new_tokens!r} must be an int >= 1"
            )
        if not self.temperature > 0:
            raise ValueError(
                f"SamplingConfig.temperature={self.temperature!r} must be > 0; "
                "use greedy=True for argmax decoding"
            )
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"SamplingConfig.top_k={self.top_k!r} must be an int >= 0 (0 = off)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingConfig.top_p={self.top_p!r} must be in (0, 1] (1 = off)")
        if not isinstance(self.prefill_chunk, int) or self.prefill_chunk < 0:
            raise ConfigError(
                f"SamplingConfig.prefill_chunk={self.prefill_chunk!r} must be an int >= 0 "
                "(0 = the whole prompt in one call)"
            )
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @classmethod
    def create(
        cls,
        *,
        max_new_tokens: int,
        temperature: float,
        top_k: int = 0,
        top_p: float = 1.0,
        stop_token_ids=(),
    ) -> "SamplingConfig":
        """The settings of a run config, where temperature 0 means greedy decoding."""
        return cls(
            max_new_tokens=max_new_tokens,
            temperature=temperature if temperature > 0 else 1.0,
            top_k=top_k,
            top_p=top_p,
            greedy=temperature <= 0,
            stop_token_ids=tuple(stop_token_ids),
        )


def _filter_sorted(values: jax.Array, top_p: float) -> jax.Array:
    """Mask (to -inf) the tail of descending-sorted logits [B, k] outside the top-p nucleus."""
    if top_p >= 1.0:
        return values
    probs = jax.nn.softmax(values, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    return jnp.where(mass_before < top_p, values, -jnp.inf)  # the first token always stays


def categorical(key: jax.Array, logits: jax.Array, block: int = 128) -> jax.Array:
    """Draw one index per row from softmax(logits) by inverting the CDF.

    Equivalent in distribution to ``jax.random.categorical`` but draws one uniform per row
    instead of a Gumbel variate per vocabulary entry: on CPU, generating B x V random numbers
    costs more than a whole decode step of a small model. See ``categorical_from_uniform``.

    Args:
      key: PRNG key.
      logits: [B, V] float32; -inf entries are never drawn.
      block: block width of the two-level CDF.

    Returns:
      [B] int32 indices.
    """
    return categorical_from_uniform(uniforms(key, (logits.shape[0],)), logits, block)[0]


def uniforms(key: jax.Array, shape) -> jax.Array:
    """Uniform draws in (0, 1) (never exactly 0), the input of ``categorical_from_uniform``."""
    return jax.random.uniform(key, shape, minval=jnp.finfo(jnp.float32).tiny)


def row_uniforms(key: jax.Array, n: int, row_ids: jax.Array, turn_ids=None) -> jax.Array:
    """[n, B] uniforms whose column b depends only on ``(key, row_ids[b])``, or with
    ``turn_ids`` [B] only on ``(key, row_ids[b], turn_ids[b])``.

    A batch split over hosts (each sampling its own rows) then draws exactly what the whole
    batch draws in one process: the rollout does not depend on how rows are partitioned. With
    turn ids (an episode's turn number) a turn draws the same whichever call serves it, so a
    continuous-batching engine and the lock-step driver sample the same tokens
    (``jaxagent.agents.engine``)."""
    if turn_ids is None:
        per_row = lambda r: uniforms(jax.random.fold_in(key, r), (n,))
        return jax.vmap(per_row, out_axes=1)(row_ids)
    per_turn = lambda r, t: uniforms(jax.random.fold_in(jax.random.fold_in(key, r), t), (n,))
    return jax.vmap(per_turn, out_axes=1)(row_ids, turn_ids)


def categorical_from_uniform(u: jax.Array, logits: jax.Array, block: int = 128):
    """Invert the CDF of softmax(logits) at ``u``; also return logsumexp(logits).

    The CDF is built in two levels (block sums, then one block) so no full-vocabulary
    cumulative sum is needed; the same exponentials give the log-normaliser, so a caller
    needing log-probs does not make a second pass over the vocabulary.

    Args:
      u: [B] uniforms in (0, 1) (see ``uniforms``).
      logits: [B, V] float32; -inf entries are never drawn.
      block: block width of the two-level CDF.

    Returns:
      [B] int32 indices and [B] float32 logsumexp of each row.
    """
    b, v = logits.shape
    nb = -(-v // block)
    top = jnp.max(logits, axis=-1, keepdims=True)
    weights = jnp.exp(logits - top)  # [B, V] in [0, 1]
    weights = jnp.pad(weights, ((0, 0), (0, nb * block - v))).reshape(b, nb, block)
    block_sums = jnp.sum(weights, axis=-1)  # [B, nb]
    block_cdf = jnp.cumsum(block_sums, axis=-1)
    total = block_cdf[:, -1]
    u = u * total
    blk = jnp.minimum(jnp.sum(block_cdf < u[:, None], axis=-1), nb - 1)  # [B]
    rows = jnp.arange(b)
    u_in = u - (block_cdf[rows, blk] - block_sums[rows, blk])
    inner = weights[rows, blk]  # [B, block]
    inner_cdf = jnp.cumsum(inner, axis=-1)
    # Rounding can leave u_in just above the block total: clamp to the last drawable entry.
    last = block - 1 - jnp.argmax(inner[:, ::-1] > 0, axis=-1)
    idx = jnp.minimum(jnp.sum(inner_cdf < u_in[:, None], axis=-1), last)
    return (blk * block + idx).astype(jnp.int32), top[:, 0] + jnp.log(total)


def sample_tokens(key: jax.Array, logits: jax.Array, cfg: SamplingConfig):
    """Sample one token per row.

    Args:
      key: PRNG key.
      logits: [B, V] float32 next-token logits.
      cfg: static sampling settings.

    Returns:
      tokens [B] int32 and their log-probs [B] float32 (see module docstring).
    """
    u = None if cfg.greedy else uniforms(key, (logits.shape[0],))
    return sample_tokens_from_uniform(u, logits, cfg)


def sample_tokens_from_uniform(u, logits: jax.Array, cfg: SamplingConfig):
    """``sample_tokens`` with the randomness given: ``u`` [B] from ``uniforms`` (None if greedy).

    A decode loop draws all its uniforms once before the loop and indexes them per step,
    instead of running the PRNG (a chain of small ops) inside every step.
    """
    logits = logits.astype(jnp.float32)
    if cfg.greedy:
        tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        picked = jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0]
        return tokens, picked - jax.nn.logsumexp(logits, axis=-1)
    scaled = logits / cfg.temperature if cfg.temperature != 1.0 else logits
    if cfg.top_k or cfg.top_p < 1.0:
        k = min(cfg.top_k or logits.shape[-1], logits.shape[-1])
        values, indices = jax.lax.top_k(scaled, k)  # sorted descending
        choice, _ = categorical_from_uniform(u, _filter_sorted(values, cfg.top_p))
        tokens = jnp.take_along_axis(indices, choice[:, None], axis=-1)[:, 0].astype(jnp.int32)
        lse = jax.nn.logsumexp(scaled, axis=-1)
    else:
        tokens, lse = categorical_from_uniform(u, scaled)
    picked = jnp.take_along_axis(scaled, tokens[:, None], axis=-1)[:, 0]
    return tokens, picked - lse
