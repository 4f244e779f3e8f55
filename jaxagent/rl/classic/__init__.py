"""Non-LLM learners over array batches: they share jaxagent's optimisers, advantage estimators
(``jaxagent.rl.advantages.compute_gae``) and device mesh, but not the token pipeline.

What lands here, one module per learner (networks, loss, jitted update) plus a config and a
trainer entry that ``jaxagent train`` dispatches to:

- continuous-control PPO (Gaussian policy and value MLPs) over ``jaxagent.pool.ArrayEnvPool``
  batches of MuJoCo robots;
- DQN for dialogue policies (a Q-network over dialogue-act features, replay buffer, target
  network).
"""
