"""Non-LLM learners, one folder each (networks, losses, jitted update, trainer): continuous-
control PPO over MuJoCo robots (``ppo_continuous/``) and DQN for dialogue policies
(``dqn_dialogue/``). ``registry.py`` dispatches a ``learner:`` config to its trainer."""
