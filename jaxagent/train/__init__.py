"""The trainer: typed configs (``config``), the training loop (``trainer.Trainer``), SFT
warm-starts (``sft``), checkpoints (``checkpoint``), metrics (``metrics_log``), progress,
the end-of-run report (``summary``) and the env registry (``envs``). Imports are lazy so that
``import jaxagent.train.config`` stays light."""
