"""Run-config sections derived from the packages' dataclasses (``jaxagent.sections``): the
rule, the composed ``env`` section, the one loader, and the RLConfig built once per config."""

import dataclasses

import pytest

from jaxagent.agents.engine import EngineConfig
from jaxagent.agents.rollout import Budget
from jaxagent.envs.faults import FaultConfig
from jaxagent.errors import ConfigError
from jaxagent.generate.sampling import SamplingConfig
from jaxagent.models.config import ModelConfig
from jaxagent.pool.config import PoolConfig
from jaxagent.sections import build, derive, load_typed
from jaxagent.train.config import Config, load_config
from jaxagent.train.model_section import DERIVED_MODEL_FIELDS, ModelSection


def _names(cls) -> set:
    return {f.name for f in dataclasses.fields(cls)}


def test_sections_hold_every_package_field_but_the_derived_ones():
    from jaxagent.train.config import FaultSection, PoolSection, RolloutSection

    assert _names(ModelSection) == _names(ModelConfig) - set(DERIVED_MODEL_FIELDS) | {"init_from"}
    assert _names(PoolSection) == _names(PoolConfig) - {"seed"}
    assert _names(FaultSection) == _names(FaultConfig) - {"hang_s"}
    kept = (_names(Budget) | _names(SamplingConfig) | _names(EngineConfig)) - {
        "stop_token_ids",
        "greedy",
    }
    assert _names(RolloutSection) - kept == {"tasks_per_iteration", "samples_per_task"}


def test_a_new_package_field_reaches_yaml_and_back_without_a_copy():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Pkg:
        size: int
        ids: tuple[int, ...] = (1, 2)
        pairs: tuple[tuple[str, float], ...] = ()
        vocab: int = 0

        def __post_init__(self):
            if self.size < 1:
                raise ValueError(f"Pkg.size={self.size} must be >= 1")

    Section = derive(
        Pkg,
        key="pkg",
        name="Section",
        module=__name__,
        drop=("vocab",),
        defaults=dict(size=3),
        probe=lambda s: {"Pkg": {"vocab": 1}},
    )
    section = load_typed(Section, overrides=["ids=[4,5]", "pairs={a: 0.5}"])
    built = build(section, Pkg, vocab=9)
    assert built == Pkg(size=3, ids=(4, 5), pairs=(("a", 0.5),), vocab=9)
    with pytest.raises(ConfigError, match=r"^pkg\.size=0 must be >= 1$"):
        load_typed(Section, overrides=["size=0"])  # validated by Pkg itself, named by YAML key
    with pytest.raises(ConfigError, match="did you mean 'size'"):
        load_typed(Section, overrides=["sise=2"])


def test_model_config_is_the_section_plus_the_tokenizer():
    from jaxagent.train.policy import model_config

    class Tok:
        bos_token_id, eos_token_id, pad_token_id = 1, 2, 0

        def __len__(self):
            return 77

    section = load_config(None, ["model.qkv_bias=true", "model.rms_norm_eps=1e-5"]).model
    config = model_config(section, Tok())
    assert (config.vocab_size, config.head_dim, config.eos_token_id) == (77, 16, 2)
    assert config.qkv_bias and config.rms_norm_eps == 1e-5 and config.tie_embeddings


@pytest.mark.parametrize(
    "old, new",
    [
        ("env.backend=thread", "env.pool.backend"),
        ("env.num_workers=4", "env.pool.num_envs"),
        ("env.step_timeout_s=1", "env.pool.step_timeout_s"),
        ("env.fault_hang_prob=0.1", "env.faults.hang"),
        ("env.fault_crash_prob=0.1", "env.faults.crash"),
        ("env.fault_seed=3", "env.faults.seed"),
    ],
)
def test_old_env_keys_are_refused_naming_the_new_key(old, new):
    with pytest.raises(ConfigError) as err:
        load_config(None, [old])
    text = str(err.value)
    assert "\n" not in text and f"did you mean {new}?" in text, text


def test_a_backend_registered_with_the_pool_is_selectable_from_yaml():
    from jaxagent.pool.backends import BACKENDS, ThreadBackend, register_backend
    from jaxagent.train.run import make_runner

    spawned = []

    class Counting(ThreadBackend):
        def spawn(self, env_id, generation, results):
            spawned.append(env_id)
            return super().spawn(env_id, generation, results)

    with pytest.raises(ConfigError, match="choose one of"):
        load_config(None, ["env.pool.backend=counting_test"])
    register_backend("counting_test", lambda env_fn, config: Counting(env_fn, config))
    try:
        config = load_config(None, ["env.pool.backend=counting_test", "env.pool.num_envs=2"])
        assert config.env.pool_config(seed=0).backend == "counting_test"
        from jaxagent.envs.registry import get_env_spec

        tasks = list(get_env_spec("quickstart", {}).make_source().tasks("train"))[:2]
        runner = make_runner(config)
        try:
            replies = runner.reset([0, 1], tasks)
        finally:
            runner.close()
        assert len(replies) == 2 and all(r.error is None for r in replies)
        assert sorted(spawned) == [0, 1]
    finally:
        BACKENDS.pop("counting_test")


def test_faults_compose_the_fault_config_and_need_a_pool():
    config = load_config(
        None,
        [
            "env.pool.backend=thread",
            "env.pool.step_timeout_s=2",
            "env.faults.hang=0.1",
            "env.faults.corrupt=0.2",
        ],
    )
    faults = config.env.fault_config()
    assert (faults.hang, faults.corrupt, faults.hang_s) == (0.1, 0.2, 8.0)
    with pytest.raises(ConfigError, match="env.faults.hang=0.1 need a pool backend"):
        load_config(None, ["env.pool.backend=inline", "env.faults.hang=0.1"])


def test_rl_config_is_built_once_per_config(monkeypatch):
    from jaxagent.train.rl_section import RLSection

    calls = []
    build_rl = RLSection.build
    monkeypatch.setattr(RLSection, "build", lambda self: calls.append(1) or build_rl(self))
    config = load_config(None, ["rl.recipe=grpo"])
    assert len(calls) == 1
    assert config.rl_config is config.rl_config and config.rl_config.name == "grpo"
    assert isinstance(config, Config) and len(calls) == 1


def test_a_saved_config_with_the_old_env_keys_is_refused_in_one_line(tmp_path):
    saved = tmp_path / "config.yaml"
    saved.write_text("env:\n  name: quickstart\n  backend: thread\n  num_workers: 4\n")
    with pytest.raises(ConfigError) as err:
        load_config(saved)
    text = str(err.value)
    assert "\n" not in text and "'env.backend'" in text and "env.pool.backend" in text, text
