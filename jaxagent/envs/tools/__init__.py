"""Tool-calling API worlds (text environments speaking ``jaxagent.envs.base``).

* ``quickstart``: an embedded, closed, stateful world (stocks, weather, calculator, notes,
  calendar; 10 tools, 5 difficulty levels) small enough for a tiny model trained from scratch
  on CPU, with a scripted expert whose error rate is controllable.
* ``bfcl``: the BFCL multi-turn stateful API worlds from the installed ``bfcl-eval`` package
  (``pip install --no-deps bfcl-eval``), scored with the benchmark's own state and response
  checkers; ``jaxagent check bfcl category=CATEGORY`` is the health check.

Submodules are imported on use (``from jaxagent.envs.tools import quickstart``), so a missing
``bfcl-eval`` only matters to code that uses the BFCL adapter.
"""
