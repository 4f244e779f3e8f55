"""jaxagent: train LLM agents with reinforcement learning, in pure JAX.

Sub-packages (see DESIGN.md): ``models`` (Flax decoder LMs, HF checkpoints), ``generate``
(jitted KV-cache sampler), ``rl`` (advantages, losses, update step), ``envs`` (environment
protocol and suites), ``pool`` (host-side async environment pool), ``agents`` (rollout driver),
``eval`` (reporting protocol), ``train`` (trainer, checkpoints) and ``cli``.
"""

__version__ = "0.1.0"
