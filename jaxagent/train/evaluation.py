"""Evaluation inside a run: held-out tests, validation passes and best-validation selection.

The schedule (``eval.every``, the last iteration, a validation split carved from the train
tasks), the keys (derived from the seed and the iteration, so a resumed run evaluates
exactly as an uninterrupted one) and the history that ``summary.json`` and the learning
curve are made of. Model selection follows the usual protocol: the checkpoint with the best
validation success is chosen on validation tasks only and tested once on the held-out split
(ties go to the later iteration).
"""

from __future__ import annotations

import contextlib

from typing import Any, Callable, Sequence

from jaxagent.agents import hosts
from jaxagent.generate.sampler import release_decode_kernels
from jaxagent.train.config import Config
from jaxagent.train.run import eval_key, val_key


def history_entry(eval_m: dict) -> dict:
    """One evaluation's entry of the run's history: ``eval/`` metrics without their prefix,
    the failure modes as one dict."""
    ours = {k: v for k, v in eval_m.items() if k.startswith("eval/")}
    groups = {"failure_modes": "/failure/", "failure_details": "/failure_detail/"}
    keep = {
        k.split("/", 1)[1]: v for k, v in ours.items() if not any(g in k for g in groups.values())
    }
    for name, marker in groups.items():
        keep[name] = {k.split(marker, 1)[1]: v for k, v in ours.items() if marker in k}
    return keep


def best_val_record(history: Sequence[dict], val: Sequence[dict], test_at) -> dict:
    """Test-split figures of the checkpoint with the best validation success (ties: the later
    one). Reuses a test evaluation of that iteration in ``history`` when there is one (the
    start, or the end); otherwise ``test_at(iteration)`` evaluates it (flat eval metrics)."""
    best = max(val, key=lambda v: (v["success"], v["iteration"]))
    it = best["iteration"]
    done = [h for h in history if h["iteration"] == it]
    test = done[0] if done else {"iteration": it, **history_entry(test_at(it))}
    return {
        "iteration": it,
        "val_success": best["success"],
        "test": {k: v for k, v in test.items() if k != "iteration"},
    }


class RunEvaluation:
    """The evaluations of one run.

    Args:
      config: the run config (``eval`` section, seed, iterations).
      run: the built run (``jaxagent.train.run.build_run``): eval sampler, rollout spec, tasks.
      echo: where the one-line reports go.
      release: called after each evaluation (the trainer returns freed buffers to the OS).
      host_shardings: ``params -> shardings`` over one process's devices for its per-host
        sampler (``DeviceLayout.host_shardings``), or None.
      rollout_params: ``params -> sampling weights`` (``DeviceLayout.rollout_params``: the
        layout and dtype the rollout samples with), or None (the params themselves).
    """

    def __init__(
        self,
        config: Config,
        run,
        echo: Callable[[str], None],
        release,
        host_shardings=None,
        rollout_params=None,
    ):
        self.config, self.echo, self._release = config, echo, release
        self._host_shardings = host_shardings or (lambda params: None)
        self._rollout_params = rollout_params or (lambda params: params)
        self.sampler, self.rollout = run.eval_sampler, run.rollout
        self.test_tasks, self.val_tasks = run.tasks.eval, run.tasks.val
        # The environments (and decode kernels) are shared with an overlapped rollout
        # (``overlap.staleness``): the trainer sets its lock here, one user at a time.
        self.env_lock = contextlib.nullcontext()

    def evaluate(self, params, tag: str, key, split: str = "test") -> dict:
        """Held-out ("test": prefix ``eval/``) or validation ("val": prefix ``val/``)
        evaluation; returns flat metrics."""
        tasks, prefix = (self.test_tasks, "eval") if split == "test" else (self.val_tasks, "val")
        params = self._rollout_params(params)  # sampled as the rollout samples
        with self.env_lock:
            result = hosts.evaluate_sharded(
                self.sampler,
                tasks,
                self.rollout,
                key,
                params,
                samples_per_task=self.config.eval.samples_per_task,
                local_shardings=self._host_shardings(params),
            )
            release_decode_kernels()  # the eval sampler's weight copy is not kept between uses
        self._release()
        self.echo(
            f"[{tag}] " + result.report.describe("held-out" if prefix == "eval" else "validation")
        )
        return result.metrics(prefix)

    def validate(self, params, iteration: int, extra: dict) -> dict:
        """Validation evaluation; appends ``(iteration, success)`` to ``extra["val"]``."""
        seed = self.config.train.seed
        val_m = self.evaluate(params, f"iter {iteration}", val_key(seed, iteration), split="val")
        _record_val(extra, iteration, val_m)
        return val_m

    def at_start(self, params, extra: dict, val_m: dict | None = None) -> tuple[dict, float, list]:
        """Before RL (after SFT): the test (and validation) figures, the score a checkpoint is
        ranked by, and the history's first entry. ``val_m``: these params' validation
        metrics when measured already (an SFT restart's judgement: the same tasks and key)."""
        m0 = self.evaluate(params, "before RL", eval_key(self.config.train.seed, 0))
        best = m0["eval/success"]
        if self.val_tasks:
            if val_m:
                _record_val(extra, 0, val_m)
            else:
                val_m = self.validate(params, 0, extra)
            m0.update(val_m)
            best = val_m["val/success"]
        return m0, best, [{"iteration": 0, **history_entry(m0)}]

    def after_iteration(
        self, state, done: int, on_model, history: list, extra: dict
    ) -> tuple[Any, dict, dict]:
        """The evaluations due after iteration ``done`` (``eval.every``, and the last one):
        validation when the run has a validation split (the test split then only at the end),
        else the test split. ``on_model(state, fn)`` runs ``fn`` on the state's model.
        Returns ``(state, validation metrics or {}, test metrics or {})``."""
        cfg = self.config
        every = cfg.eval.every
        last, periodic = done == cfg.train.iterations, every and done % every == 0
        val_m = eval_m = {}
        if self.val_tasks and (last or periodic):
            state, val_m = on_model(state, lambda p: self.validate(p, done, extra))
        if last or (periodic and not self.val_tasks):
            key = eval_key(cfg.train.seed, done)
            state, eval_m = on_model(state, lambda p: self.evaluate(p, f"iter {done}", key))
            history.append({"iteration": done, **history_entry(eval_m)})
        return state, val_m, eval_m

    def record_best_val(self, history: list, extra: dict, restore, on_model) -> None:
        """``extra["best_val"]``: the best-validation checkpoint's test figures
        (``restore(iteration) -> state`` loads a checkpoint when it was not tested already)."""
        if not self.val_tasks:
            return

        def test_at(it: int) -> dict:
            key = eval_key(self.config.train.seed, it)
            return on_model(restore(it), lambda p: self.evaluate(p, f"best val iter {it}", key))[1]

        extra["best_val"] = best_val_record(history, extra["val"], test_at)


def _record_val(extra: dict, iteration: int, val_m: dict) -> None:
    """Append ``(iteration, success)`` of a validation to ``extra["val"]``."""
    extra.setdefault("val", []).append({"iteration": iteration, "success": val_m["val/success"]})
