"""The ``jaxagent`` command: ``main.py`` parses it and runs train / rollout / export, ``eval.py``
evaluates checkpoints and scripted policies, ``check.py`` checks an environment suite."""
