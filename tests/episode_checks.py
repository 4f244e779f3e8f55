"""The one comparison of two rollouts that should be the same episodes.

Token ids, loss masks, turn ids, constrained-decoding masks, endings and rewards must be equal;
log-probs are compared at 1e-5, because the two sides may compute them with different batch
shapes (a prefill of the whole context against one row's decode step), which sum the same
float32 terms in different orders.
"""

from __future__ import annotations

import numpy as np

FIELDS = ("tokens", "loss_mask", "turn_ids", "constraint_ids", "constraint_masks")


def assert_same_episodes(a, b, *, rewards: bool = True, endings: bool = True) -> None:
    """``endings=False`` where one side is a served session (it ends when the harness says);
    ``rewards=False`` where one side's environment was failed on purpose."""
    assert len(a) == len(b)
    for field in FIELDS:
        assert [getattr(ep, field) for ep in a] == [getattr(ep, field) for ep in b], field
    if endings:
        assert [ep.termination for ep in a] == [ep.termination for ep in b]
    if rewards:
        assert [ep.reward for ep in a] == [ep.reward for ep in b]
    np.testing.assert_allclose(
        np.concatenate([np.asarray(ep.logprobs, np.float64) for ep in a]),
        np.concatenate([np.asarray(ep.logprobs, np.float64) for ep in b]),
        atol=1e-5,
    )
