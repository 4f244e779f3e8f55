"""The overlapped rollout (``overlap.staleness`` = k): asynchronous and still exact.

- the schedule: batch i is sampled by version max(0, i - k), handed over in index order
  whatever order the producer finishes in, a producer failure reaches the learner;
- two asynchronous runs with the same seed give identical metrics and parameters, every
  trained token carries the version that sampled it (staleness exactly min(i, k)), and the
  first iteration equals the synchronous run's (both sample it with the initial weights);
- a run SIGKILLed mid-rollout, mid-update or mid-save and resumed gives the uninterrupted
  run's metrics exactly (the batches sampled with weights older than a checkpoint are saved
  with it: ``tests/test_resume_matrix.py`` runs those cases).
"""

import shutil
import threading
import time

import jax
import numpy as np
import pytest

from jaxagent.errors import ConfigError
from jaxagent.train.checkpoint import restore_params_only
from jaxagent.train.config import load_config
from jaxagent.train.metrics_log import read_jsonl
from jaxagent.train.overlap import Pipeline, staleness_metrics

from test_train import ROOT, TINY, _by_step

QS = ROOT / "configs/quickstart.yaml"


def _learn(pipe, stop):
    """The learner's side: publish each version a batch needs, take the batches in order;
    returns (index, version, payload) of each."""
    out = []
    for it in range(stop):
        if pipe.needs(it):
            pipe.publish(it, f"w{it}")
        item, _, _ = pipe.take(it)
        out.append((item.index, item.version, item.payload))
    pipe.close()
    return out


def test_pipeline_schedule_versions_and_order():
    """Batch i samples with version max(0, i - k); batches come out in index order even
    when later ones finish first; weights no batch needs any more are dropped."""
    k, stop = 2, 7
    seen = []

    def produce(i, v, params, refresh, lane):
        time.sleep(0.02 * ((7 - i) % 3))  # uneven durations
        seen.append((i, v, params))
        return f"batch{i}"

    pipe = Pipeline(produce, 0, stop, k)
    out = _learn(pipe, stop)
    assert out == [(i, max(0, i - k), f"batch{i}") for i in range(stop)]
    assert [p for _, _, p in seen] == [f"w{max(0, i - k)}" for i in range(stop)]
    assert not pipe.needs(0) and not pipe.needs(stop - 1)
    assert pipe._weights == {}  # every version released once its last batch was made


def test_two_lanes_collect_the_next_batch_while_one_is_out():
    """With two lanes at k = 1 batch i + 1 is collected while batch i is still out (batch 0
    here waits until batch 1 has started: one lane would time out), batch i is always lane
    i % 2's, and the batches keep the one-lane schedule and order."""
    k, stop = 1, 6
    started = {i: threading.Event() for i in range(stop + 1)}
    seen = []

    def produce(i, v, params, refresh, lane):
        started[i].set()
        if i % 2 == 0 and i + 1 < stop:
            assert started[i + 1].wait(5), f"batch {i + 1} did not start while {i} was out"
        seen.append((i, v, params, lane))
        return f"batch{i}"

    pipe = Pipeline(produce, 0, stop, k, lanes=2)
    out = _learn(pipe, stop)
    assert out == [(i, max(0, i - k), f"batch{i}") for i in range(stop)]
    assert sorted(seen) == [(i, max(0, i - k), f"w{max(0, i - k)}", i % 2) for i in range(stop)]
    assert pipe._weights == {}
    with pytest.raises(ValueError, match="lanes"):
        Pipeline(produce, 0, stop, 1, lanes=3)


def test_partial_rollouts_switch_to_newer_weights_mid_batch():
    """With partial rollouts the producer is handed each new version while a batch is being
    collected (never one newer than the batch's own iteration), and weights no batch can
    still start or switch to are dropped."""
    stop, switched = 4, {}
    published = {0: threading.Event()}

    def produce(i, v, params, refresh, lane):
        assert refresh is not None and refresh(i) is None  # nothing newer than the batch
        if i >= 1:
            published.setdefault(i, threading.Event()).wait(5)
            switched[i] = refresh(v)
        return i

    pipe = Pipeline(produce, 0, stop, 1, partial=True)
    for it in range(stop):
        assert pipe.needs(it)  # every version may be switched to
        pipe.publish(it, f"w{it}")
        published.setdefault(it, threading.Event()).set()
        assert pipe.take(it)[0].payload == it
    pipe.close()
    # batch i starts on version i - 1 and switches to version i once it is published
    assert switched == {i: (f"w{i}", i) for i in range(1, stop)}


def test_pipeline_resumes_from_buffer_and_reports_failure():
    made = []

    def produce(i, v, params, refresh, lane):
        made.append(i)
        if i == 5:
            raise RuntimeError("env exploded")
        return i

    pipe = Pipeline(produce, 3, 6, 1, buffered=_buffer(3, 1))
    # batch 3 comes from the checkpoint (version 2); batch 4 needs version 3
    assert not pipe.needs(2) and pipe.needs(3)
    item, _, _ = pipe.take(3)
    assert (item.index, item.version, item.payload) == (3, 2, "saved3")
    pipe.publish(3, "w3")
    assert pipe.take(4)[0].payload == 4
    pipe.publish(4, "w4")
    with pytest.raises(RuntimeError, match="env exploded"):
        pipe.take(5)
    assert made == [4, 5]  # the buffered batch was not produced again


def _buffer(first, k):
    from jaxagent.train.overlap import Produced

    return {j: Produced(j, j - k, f"saved{j}") for j in range(first, first + k)}


def test_pending_waits_for_the_batches_a_checkpoint_must_hold():
    gate = threading.Event()

    def produce(i, v, params, refresh, lane):
        if i == 2:
            gate.wait(5)
        return i

    pipe = Pipeline(produce, 0, 5, 2)
    pipe.publish(0, "w0")
    for it in (0, 1):
        pipe.take(it)
        if pipe.needs(it + 1):
            pipe.publish(it + 1, f"w{it + 1}")
    threading.Timer(0.2, gate.set).start()
    t0 = time.perf_counter()
    held = pipe.pending(2)  # batches 2 and 3: versions 0 and 1, older than checkpoint 2
    assert sorted(held) == [2, 3] and time.perf_counter() - t0 >= 0.15
    assert [held[j].version for j in (2, 3)] == [0, 1]
    pipe.close()


class _Ep:
    def __init__(self, versions):
        self.versions = versions


def test_staleness_metrics_read_the_recorded_versions():
    eps = [_Ep([-1, 3, 3, -1, 4]), _Ep([-1, 4, 4])]
    m = staleness_metrics(eps, iteration=5, staleness=2)
    assert m["async/staleness_frac/1"] == pytest.approx(3 / 5)
    assert m["async/staleness_frac/2"] == pytest.approx(2 / 5)
    assert m["async/staleness_mean"] == pytest.approx(7 / 5)
    assert m["async/staleness_max"] == 2 and m["async/stale_dropped"] == 0
    assert staleness_metrics([_Ep([-1, 1])], 5, 2)["async/stale_dropped"] == 1


def test_overlap_refuses_release_compiled():
    with pytest.raises(ConfigError, match="overlap.staleness=1 with train.release_compiled"):
        load_config(QS, TINY + ["overlap.staleness=1", "train.release_compiled=true"])
    with pytest.raises(ConfigError, match="overlap.staleness"):
        load_config(QS, TINY + ["overlap.staleness=-1"])
    with pytest.raises(ConfigError, match=r"overlap.lanes=3 .* set overlap.lanes <= 2"):
        load_config(QS, TINY + ["overlap.staleness=1", "overlap.lanes=3"])
    with pytest.raises(ConfigError, match="overlap.lanes=2 with overlap.partial_rollouts"):
        load_config(
            QS,
            TINY
            + ["overlap.staleness=1", "overlap.lanes=2", "overlap.partial_rollouts=true"]
            + ["rollout.engine=lockstep"],
        )


def _run(tmp_path, name, staleness, iterations=3, extra=()):
    from jaxagent.train.trainer import Trainer

    d = tmp_path / name
    cfg = load_config(
        QS,
        TINY
        + [
            f"train.out_dir={d}",
            f"overlap.staleness={staleness}",
            f"train.iterations={iterations}",
            "eval.every=0",
            "eval.val_tasks=0",
            "sft.steps=1",
            *extra,
        ],
    )
    summary = Trainer(cfg, echo=lambda s: None).run()
    params, _, step = restore_params_only(d / "checkpoints")
    return _by_step(d / "metrics.jsonl"), params, summary, step


def _pending_is_data(ckpt_dir, step: int, made: dict) -> None:
    """Checkpoint ``step``'s pending batches are arrays in an orbax item, numbers in the JSON
    meta (no pickle, no base64 text), and read back equal to the batches that were made."""
    import json

    from jaxagent.train.checkpoint import Checkpointer
    from jaxagent.train.collect import restored_items

    text = (ckpt_dir / str(step) / "meta" / "metadata").read_text()
    meta = json.loads(text)
    assert "overlap_buffer" not in meta and len(text) < 20_000, len(text)

    def strings(x):
        if isinstance(x, dict):
            return [s for v in x.values() for s in strings(v)]
        if isinstance(x, list):
            return [s for v in x for s in strings(v)]
        return [x] if isinstance(x, str) else []

    assert all(len(s) < 200 for s in strings(meta["pending"]))
    ck = Checkpointer(ckpt_dir, read_only=True)
    try:
        items = restored_items(ck.restore_pending(step), meta["pending"])
    finally:
        ck.close()
    assert sorted(items) == [step] and items[step].version == step - 1
    got, want = items[step].payload, made[step]
    assert got.arrays().keys() == want.arrays().keys()
    for k, v in want.arrays().items():
        assert got.arrays()[k].dtype == v.dtype and np.array_equal(got.arrays()[k], v), k
    assert got.metrics == want.metrics and got.stats == want.stats


def _recording(made: dict):
    """``Collector.collect`` that also keeps each iteration's batch in ``made``."""
    from jaxagent.train.collect import Collector

    collect = Collector.collect

    def recording(self, it, *a, **k):
        made[it] = collect(self, it, *a, **k)
        return made[it]

    return recording


@pytest.fixture(scope="module")
def async_run(tmp_path_factory):
    """One asynchronous run (staleness 1, 3 iterations) and the batches its collector made:
    (run dir, (metrics, params, summary, last step), {iteration: Collected}). Both tests
    below compare against it (another run of the same seed; the same run with two lanes)."""
    from jaxagent.train.collect import Collector

    made = {}
    tmp = tmp_path_factory.mktemp("overlap")
    mp = pytest.MonkeyPatch()
    mp.setattr(Collector, "collect", _recording(made))
    try:
        out = _run(tmp, "a", 1)
    finally:
        mp.undo()
    return tmp / "a", out, made


def test_two_asynchronous_runs_are_identical_and_record_versions(async_run, tmp_path, monkeypatch):
    from jaxagent.train.collect import Collector

    run_a, (m1, p1, s1, step), made_a = async_run
    for ckpt in (1, 2):  # each holds the next batch, sampled one version behind
        _pending_is_data(run_a / "checkpoints", ckpt, made_a)
    made = {}
    monkeypatch.setattr(Collector, "collect", _recording(made))
    # Resumed from checkpoint 2, the run trains on batch 2 read back from its arrays (no
    # batch is collected again) and ends exactly as the uninterrupted run.
    shutil.copytree(run_a, tmp_path / "r")
    shutil.rmtree(tmp_path / "r" / "checkpoints" / "3")
    m3, p3, _, _ = _run(tmp_path, "r", 1)
    assert made == {} and m3 == m1
    same = jax.tree.map(lambda a, b: bool(np.array_equal(np.asarray(a), np.asarray(b))), p1, p3)
    assert all(jax.tree.leaves(same))
    m2, p2, s2, _ = _run(tmp_path, "b", 1)
    assert step == 3
    assert m1 == m2 and s1["success_after_rl"] == s2["success_after_rl"]
    same = jax.tree.map(lambda a, b: bool(np.array_equal(np.asarray(a), np.asarray(b))), p1, p2)
    assert all(jax.tree.leaves(same))
    # every trained token of iteration i was sampled by version max(0, i - 1)
    for it in range(3):
        rec = m1[it + 1]
        assert rec["async/version"] == max(0, it - 1)
        assert rec["async/staleness_max"] == min(it, 1)
        assert rec["async/staleness_frac/" + str(min(it, 1))] == 1.0
        assert rec["async/stale_dropped"] == 0


def test_two_lanes_train_exactly_as_one(async_run, tmp_path):
    """Two collection lanes (a second sampler and environment runner) change when batches
    are collected, not what they hold: the same metrics and parameters bit for bit as the
    one-lane run (batches 0 and 2 on lane 0, batch 1 on lane 1)."""
    _, (m1, p1, _, _), _ = async_run
    m2, p2, _, _ = _run(tmp_path, "two", 1, extra=["overlap.lanes=2"])
    assert m1 == m2
    raw = [r for r in read_jsonl(tmp_path / "two/metrics.jsonl") if "train/success" in r]
    assert raw[-1]["env_health/lane1/calls"] > 0  # the second lane's own environments
    same = jax.tree.map(lambda a, b: bool(np.array_equal(np.asarray(a), np.asarray(b))), p1, p2)
    assert all(jax.tree.leaves(same))


@pytest.mark.slow
def test_first_asynchronous_iteration_is_the_synchronous_one(tmp_path):
    """Iteration 0 samples with the initial weights in both schedules: the same batch and
    update; from iteration 1 on the asynchronous run samples one version behind."""
    sync, *_ = _run(tmp_path, "sync", 0, iterations=2)
    asy, *_ = _run(tmp_path, "async", 1, iterations=2)
    shared = [k for k in sync[1] if k in asy[1] and not k.startswith("mem/")]
    assert {k: sync[1][k] for k in shared} == {k: asy[1][k] for k in shared}
    assert sync[2]["loss/policy"] != asy[2]["loss/policy"]


@pytest.mark.slow  # two runs on an 8-device mesh; the schedule itself is checked in CI
def test_disaggregated_samples_on_its_own_devices_like_colocated(tmp_path, monkeypatch):
    """4 + 4 of the 8 simulated devices: the update on the first four, the rollout on the
    last four (weights copied device to device after each update). The same rows go to the
    same number of devices either way, so the run equals the colocated one."""
    from jaxagent.parallel.layout import DeviceLayout

    placed = []
    to_sampler = DeviceLayout.to_sampler

    def spy(self, params):
        out = to_sampler(self, params)
        placed.append({d.id for x in jax.tree.leaves(out) for d in x.sharding.device_set})
        return out

    monkeypatch.setattr(DeviceLayout, "to_sampler", spy)
    both = ["mesh.data=4", "rollout.tasks_per_iteration=4"]
    colo, *_ = _run(tmp_path, "colocated", 1, iterations=2, extra=both)
    dis, *_ = _run(
        tmp_path, "disaggregated", 1, iterations=2, extra=[*both, "overlap.sampler_devices=4"]
    )
    assert placed and all(p == {4, 5, 6, 7} for p in placed)
    assert dis[1]["sampler/devices"] == 4
    skip = ("mem/", "sampler/")
    for step in (1, 2):
        a = {k: v for k, v in colo[step].items() if not k.startswith(skip)}
        b = {k: v for k, v in dis[step].items() if not k.startswith(skip)}
        assert a == b


def test_disaggregated_needs_a_device_for_the_update():
    with pytest.raises(ConfigError, match="overlap.sampler_devices=2 with overlap.staleness=0"):
        load_config(QS, TINY + ["overlap.sampler_devices=2"])


@pytest.mark.slow  # one short run (the switch itself: tests/test_partial_rollout.py)
@pytest.mark.parametrize("engine", ["lockstep", "slots"])
def test_partial_rollouts_train_with_versions_no_older_than_the_bound(tmp_path, engine):
    extra = ["overlap.partial_rollouts=true", f"rollout.engine={engine}"]
    m, _, summary, step = _run(tmp_path, "partial", 1, extra=extra)
    assert step == 3 and "success_after_rl" in summary
    for it in range(3):
        rec = m[it + 1]
        assert rec["async/version"] == max(0, it - 1)  # where each batch started
        assert rec["async/staleness_max"] <= min(it, 1) and rec["async/stale_dropped"] == 0


def test_partial_rollouts_need_overlap_and_no_harness(tmp_path):
    with pytest.raises(ConfigError, match="overlap.partial_rollouts=true with overlap.staleness"):
        load_config(QS, TINY + ["overlap.partial_rollouts=true"])
    with pytest.raises(ConfigError, match="overlap.partial_rollouts=true with harness.entry"):
        load_config(
            QS,
            TINY
            + [f"train.out_dir={tmp_path}/h", "overlap.staleness=1"]
            + ["overlap.partial_rollouts=true"]
            + ["harness.entry=jaxagent.serve.examples:quickstart_harness"],
        )


def test_lanes_refuse_a_harness(tmp_path):
    with pytest.raises(ConfigError, match="overlap.lanes=2 with harness.entry"):
        load_config(
            QS,
            TINY
            + [f"train.out_dir={tmp_path}/h", "overlap.staleness=1", "overlap.lanes=2"]
            + ["harness.entry=jaxagent.serve.examples:quickstart_harness"],
        )
