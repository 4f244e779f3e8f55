"""BFCL multi-turn adapter: the stateful API worlds shipped in ``bfcl-eval``.

Install the data and backends with ``pip install --no-deps bfcl-eval`` (plus ``mpmath``).
Importing this package works without it; using it raises ``BFCLMissingError`` with the fix.
Check: ``jaxagent check bfcl category=multi_turn_base`` (the ground truth acted out through the
pool must succeed, and fail without its last state-changing call).
"""

from jaxagent.envs.tools.bfcl.data import (
    DANGEROUS_METHODS,
    INSTALL_HINT,
    BFCLMissingError,
    list_categories,
    load_entries,
    require_bfcl,
)
from jaxagent.envs.tools.bfcl.env import BFCLEnv, BFCLEnvConfig, system_prompt
from jaxagent.envs.tools.bfcl.replay import check_category, replay, state_changing_calls
from jaxagent.envs.tools.bfcl.source import BFCLSource, BFCLSourceConfig

__all__ = [
    "BFCLEnv",
    "BFCLEnvConfig",
    "BFCLMissingError",
    "BFCLSource",
    "BFCLSourceConfig",
    "DANGEROUS_METHODS",
    "INSTALL_HINT",
    "check_category",
    "list_categories",
    "load_entries",
    "replay",
    "require_bfcl",
    "state_changing_calls",
    "system_prompt",
]
