"""Continuous-control PPO (Gaussian actor, critic) over batched MuJoCo robots."""
