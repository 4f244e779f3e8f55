"""Bad input, everywhere a user gives it: one parametrised sweep.

Configs (unknown key, wrong type, out of range, impossible combinations), environment names
and options (the code sandbox's too), checkpoints (missing, partial, from another model
shape), Hugging Face directories (missing files, unsupported ``model_type``), CLI arguments:
each runs ``jaxagent.cli.main`` in-process and must exit 2 with exactly one stderr line, no
traceback, naming the input and its value, and saying what would be right. Tool calls are
the policy's input rather than the user's: their errors are the observation the agent gets,
and must name the tool, the argument, the value and what is expected.
"""

import json
from pathlib import Path

import pytest

import jaxagent
from jaxagent.cli.main import main

ROOT = Path(jaxagent.__file__).parent.parent
QS = str(ROOT / "configs/quickstart.yaml")


def _train(*overrides):
    return lambda tmp: ["train", QS, *overrides]


def _run_dir(tmp: Path, checkpoint: str | None = None) -> Path:
    """A quickstart run directory (config, tokenizer) with an optional bad checkpoint."""
    from jaxagent.envs.tools.quickstart import vocabulary
    from jaxagent.train.config import config_to_yaml, load_config
    from jaxagent.train.tokenizer import build_word_tokenizer

    run = tmp / "run"
    run.mkdir()
    (run / "config.yaml").write_text(config_to_yaml(load_config(QS)))
    build_word_tokenizer(vocabulary()).save_pretrained(str(run / "tokenizer"))
    if checkpoint is not None:
        import numpy as np

        from jaxagent.train.checkpoint import Checkpointer

        ck = Checkpointer(run / "checkpoints", keep=2)
        tree = {"params": {"embed": np.zeros((3, 4), np.float32)}, "step": np.int32(1)}
        ck.save(1, tree, {"iteration": 1})
        ck.wait()
        ck.close()
        if checkpoint == "partial":  # killed mid-write: the state's metadata never landed
            (run / "checkpoints" / "1" / "state" / "_METADATA").unlink()
    return run


def _hf_dir(tmp: Path, kind: str) -> Path:
    d = tmp / "hf"
    d.mkdir()
    if kind == "model_type":  # a tokenizer, so that loading gets as far as config.json
        from jaxagent.envs.tools.quickstart import vocabulary
        from jaxagent.train.tokenizer import build_word_tokenizer

        build_word_tokenizer(vocabulary()).save_pretrained(str(d))
        (d / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 8}))
    return d


def _file(tmp: Path, name: str, text: str) -> str:
    path = tmp / name
    path.write_text(text)
    return str(path)


def _gappy() -> str:
    """A quickstart suite whose word list misses the word every expert action starts with."""
    import dataclasses

    from jaxagent.envs.registry import register_env
    from jaxagent.envs.tools.quickstart.suite import QuickstartOptions, build

    def gappy(options):
        spec = build(options)
        words = [w for w in spec.vocabulary() if w != "Action"]
        return dataclasses.replace(spec, name="gappy", vocabulary=lambda: words)

    register_env("gappy", gappy, options=QuickstartOptions, replace=True)
    return "env.name=gappy"


def _foreign_hf(tmp: Path) -> str:
    """A model directory whose word tokenizer is another world's (dialogue)."""
    import jax

    from jaxagent.envs.dialogue.vocab import vocabulary
    from jaxagent.models import save_hf
    from jaxagent.train.config import load_config
    from jaxagent.train.policy import build_model
    from jaxagent.train.tokenizer import build_word_tokenizer

    d = tmp / "foreign"
    tok = build_word_tokenizer(vocabulary())
    model = load_config(QS, ["model.hidden_size=32", "model.num_layers=1"]).model
    graphdef, params, model_config = build_model(model, tok, jax.random.key(0))
    save_hf(str(d), model_config, graphdef, params)
    tok.save_pretrained(str(d))
    return str(d)


def _held(tmp: Path) -> str:
    """A run directory another training holds (the lock stays held for the test's life)."""
    from jaxagent.train.run_dir import RunLock

    run = tmp / "held"
    _HELD.append(RunLock.acquire(run))
    return str(run)


_HELD: list = []


# name: (argv builder, substrings the one line must contain)
CASES = {
    # configs: unknown keys, types, ranges
    "unknown key": (_train("model.hiden_size=3"), ["model.hiden_size", "did you mean"]),
    "unknown section": (_train("trian.seed=1"), ["trian", "allowed keys"]),
    "wrong type int": (_train("train.seed=1.5"), ["train.seed", "1.5", "Integer"]),
    "wrong type str": (_train("model.hidden_size=big"), ["model.hidden_size", "big"]),
    "override without =": (_train("train.seed"), ["train.seed", "key=value"]),
    "negative iterations": (_train("train.iterations=-1"), ["train.iterations=-1", ">= 0"]),
    "samples per task": (_train("rollout.samples_per_task=-1"), ["rollout.samples_per_task=-1"]),
    "temperature": (_train("rollout.temperature=-0.5"), ["rollout.temperature=-0.5", ">= 0"]),
    "top_p zero": (_train("rollout.top_p=0"), ["rollout.top_p=0", "(0, 1]"]),
    "top_k": (_train("rollout.top_k=-1"), ["rollout.top_k=-1", ">= 0"]),
    "max turns": (_train("rollout.max_turns=0"), ["rollout.max_turns=0", "> 0"]),
    "heads not dividing": (_train("model.num_heads=3"), ["num_heads", "divisible"]),
    "progress choice": (_train("train.progress=fancy"), ["fancy", "choose one of"]),
    "keep checkpoints": (_train("train.keep_checkpoints=0"), ["train.keep_checkpoints=0", "> 0"]),
    "eval samples": (_train("eval.samples_per_task=0"), ["eval.samples_per_task=0", "> 0"]),
    "sft steps": (_train("sft.steps=-1"), ["sft.steps=-1", ">= 0"]),
    "sft error rate": (_train("sft.expert_error_rate=2"), ["sft.expert_error_rate=2", "[0, 1]"]),
    "tokenizer kind": (_train("tokenizer.kind=sentencepiece"), ["sentencepiece", "choose one"]),
    "recipe name": (_train("rl.recipe=ppo2"), ["ppo2", "choose one of"]),
    "learning rate": (_train("rl.optim.learning_rate=-1"), ["rl.optim.learning_rate=-1", "> 0"]),
    "optim key": (_train("rl.optim.lr=1"), ["rl.optim.lr", "learning_rate"]),
    "clip eps": (_train("rl.loss.clip_eps_low=1.5"), ["rl.loss.clip_eps_low=1.5"]),
    "minibatch": (_train("rl.update.minibatch_size=0"), ["rl.update.minibatch_size=0", ">= 1"]),
    "microbatch": (_train("rl.update.microbatch_size=5"), ["microbatch_size=5", "divide"]),
    "kl stop": (_train("rl.update.kl_stop=-1"), ["rl.update.kl_stop=-1", ">= 0"]),
    "estimator": (_train("rl.advantage.estimator=magic"), ["magic", "choose one of"]),
    "lora rank": (_train("rl.lora.rank=-2"), ["rl.lora.rank=-2", ">= 0"]),
    "lr schedule": (_train("rl.lr_schedule=step"), ["rl.lr_schedule='step'", "choose one"]),
    "guards limit": (_train("guards.max_skipped_updates=-1"), ["guards.max_skipped_updates=-1"]),
    "guards key": (_train("guards.grad_norm_spikes=3"), ["grad_norm_spikes", "grad_norm_spike"]),
    # impossible combinations
    "LOOP with a reference model": (
        _train("rl.recipe=loop", "rl.kl.mode=loss"),
        ["kl.mode='loss'", "kl.beta", "kl.mode='none'"],
    ),
    "PPO without a value head": (
        _train("rl.recipe=ppo", "rl.critic.enabled=false"),
        ["gae", "critic.enabled=true", "critic-free estimator"],
    ),
    "filtered sampling, on-policy loss": (
        _train("rollout.temperature=0.7"),
        ["rollout.temperature=0.7", "rollout.temperature=1.0"],
    ),
    "faults on the inline backend": (
        _train("env.faults.hang=0.1", "env.pool.backend=inline"),
        ["env.faults.hang", "env.pool.backend='thread'"],
    ),
    # environment names and options
    "env name": (_train("env.name=atari"), ["atari", "choose one of"]),
    "env backend": (_train("env.pool.backend=docker"), ["docker", "choose one of"]),
    "env workers": (_train("env.pool.num_envs=0"), ["env.pool.num_envs=0", ">= 1"]),
    "env key renamed": (_train("env.num_workers=4"), ["env.num_workers", "env.pool.num_envs"]),
    "env fault prob": (_train("env.faults.hang=1.5"), ["env.faults.hang=1.5", "[0, 1]"]),
    "env option unknown": (_train("env.options.num_trian=5"), ["num_trian", "num_train"]),
    "env option range": (_train("env.options.num_train=-3"), ["num_train", "-3", ">= 0"]),
    "code isolation": (
        _train("env.name=code", "env.options.isolation=docker"),
        ["isolation", "docker", "unsafe"],
    ),
    "code timeout": (
        _train("env.name=code", "env.options.timeout_s=0"),
        ["timeout_s", "0", "positive"],
    ),
    "code memory": (_train("env.name=code", "env.options.memory_mb=10"), ["memory_mb=10", ">= 64"]),
    "code reward": (
        _train("env.name=code", "env.options.reward=partial"),
        ["reward", "partial", "binary"],
    ),
    "code job memory": (
        _train("env.name=code", "env.options.job_memory_mb=1"),
        ["job_memory_mb=1", ">= 64"],
    ),
    # Hugging Face directories
    "HF dir missing": (
        lambda tmp: ["train", QS, f"model.init_from={tmp / 'nohf'}"],
        ["model.init_from", "nohf", "Hugging Face"],
    ),
    "HF dir without files": (
        lambda tmp: ["train", QS, f"model.init_from={_hf_dir(tmp, 'empty')}"],
        ["model.init_from=", "hf", "pass a local Hugging Face directory"],
    ),
    "HF unsupported model_type": (
        lambda tmp: ["train", QS, f"model.init_from={_hf_dir(tmp, 'model_type')}"],
        ["model.init_from=", "model_type='gpt2'", "llama"],
    ),
    # checkpoints
    "checkpoint missing": (
        lambda tmp: ["eval", QS, "--checkpoint", str(tmp / "gone")],
        ["gone", "run directory"],
    ),
    "checkpoint not a run": (lambda tmp: ["eval", QS, "--checkpoint", str(tmp)], ["config.yaml"]),
    "checkpoint partial": (
        lambda tmp: ["eval", QS, "--checkpoint", str(_run_dir(tmp, "partial"))],
        ["checkpoint", "run"],
    ),
    "checkpoint of another shape": (
        lambda tmp: ["eval", QS, "--checkpoint", str(_run_dir(tmp, "other"))],
        ["checkpoint 1", "cannot be read into the model", "do not match", "--step"],
    ),
    "resume=false over a run with checkpoints": (
        lambda tmp: [
            "train",
            QS,
            "train.resume=false",
            f"train.out_dir={_run_dir(tmp, 'other')}",
        ],
        ["train.resume=false", "steps [1]", "train.resume=true", "another train.out_dir"],
    ),
    # config files and environment modules
    "config not YAML": (
        lambda tmp: ["train", _file(tmp, "c.yaml", "model: [1, 2\n")],
        ["c.yaml", "not valid YAML", "line 2"],
    ),
    "config not a mapping": (
        lambda tmp: ["train", _file(tmp, "c.yaml", "- model\n- env\n")],
        ["c.yaml", "YAML list", "mapping"],
    ),
    "env module missing": (
        _train("env.name=nopkg.suite:echo"),
        ["nopkg.suite", "cannot be imported", "PYTHONPATH"],
    ),
    "env module registers another name": (
        _train("env.name=json:no_such_suite"),
        ["'json'", "registered no env 'no_such_suite'", "register_env('no_such_suite'"],
    ),
    "override value not YAML": (_train("model.hidden_size=[1,"), ["[1,", "not valid YAML"]),
    # the run directory: one writer; a resume keeps what its checkpoints were trained with
    "run held by another training": (
        lambda tmp: ["train", QS, f"train.out_dir={_held(tmp)}"],
        ["held", "being trained by another process", "pid", "another train.out_dir"],
    ),
    "resume with another model shape": (
        lambda tmp: ["train", QS, "model.hidden_size=64", f"train.out_dir={_run_dir(tmp, 'x')}"],
        ["model.hidden_size: 128 -> 64", "cannot honour", "another train.out_dir"],
    ),
    "resume with another recipe": (
        lambda tmp: ["train", QS, "rl.recipe=grpo", f"train.out_dir={_run_dir(tmp, 'x')}"],
        ["rl.recipe: 'loop' -> 'grpo'", "cannot honour"],
    ),
    # the tokenizer must cover the environment
    "vocabulary misses an expert word": (
        lambda tmp: ["train", QS, _gappy(), f"train.out_dir={tmp / 'run'}"],
        ["'Action'", "expert writes", "vocabulary()"],
    ),
    "init_from with another world's tokenizer": (
        lambda tmp: [
            "train",
            QS,
            f"model.init_from={_foreign_hf(tmp)}",
            f"train.out_dir={tmp / 'run'}",
        ],
        ["model.init_from=", "foreign", "lacks words", "quickstart"],
    ),
    # the first prompt must leave room for a turn within the episode's token budget
    "prompt over rollout.max_total_tokens": (
        lambda tmp: ["train", QS, "rollout.max_total_tokens=40", f"train.out_dir={tmp / 'run'}"],
        ["first prompt", "rollout.max_total_tokens (now 40)", "is 24 tokens", "at least 48"],
    ),
    "prompt over model.max_seq_len": (
        lambda tmp: ["train", QS, "model.max_seq_len=60", f"train.out_dir={tmp / 'run'}"],
        ["first prompt", "model.max_seq_len (now 60)", "is 24 tokens", "at least 72"],
    ),
    # CLI arguments
    "unknown flag after the overrides": (
        lambda tmp: ["eval", QS, "--checkpoint", str(tmp), "train.seed=1", "--bogus"],
        ["unrecognized arguments: --bogus"],
    ),
    "export with overrides": (
        lambda tmp: ["export", "--checkpoint", str(tmp), "--out", str(tmp / "o"), "a=1"],
        ["takes no key=value overrides", "a=1"],
    ),
    "export --out is a file": (
        lambda tmp: ["export", "--checkpoint", str(tmp), "--out", _file(tmp, "f", "x")],
        ["--out", "existing file", "directory"],
    ),
    "--step word": (
        lambda tmp: ["eval", QS, "--checkpoint", str(_run_dir(tmp, "x")), "--step", "soon"],
        ["--step 'soon'", "best", "latest"],
    ),
    "--step missing": (
        lambda tmp: ["eval", QS, "--checkpoint", str(_run_dir(tmp, "x")), "--step", "9"],
        ["checkpoint 9 not found", "steps [1]", "--step"],
    ),
    "unknown command": (lambda tmp: ["deploy", QS], ["deploy"]),
    "missing required flag": (lambda tmp: ["eval", QS], ["--checkpoint"]),
    "missing config file": (lambda tmp: ["train", str(tmp / "nope.yaml")], ["nope.yaml"]),
    "--n type": (lambda tmp: ["rollout", QS, "--n", "many"], ["many"]),
    "--n value": (lambda tmp: ["rollout", QS, "--n", "0"], ["--n 0", ">= 1"]),
    "--seeds value": (
        lambda tmp: ["eval", QS, "--policy", "expert", "--seeds", "0"],
        ["--seeds 0", ">= 1"],
    ),
    "--expert-error-rate": (
        lambda tmp: ["eval", QS, "--policy", "expert", "--expert-error-rate", "2"],
        ["--expert-error-rate 2", "[0, 1]"],
    ),
    "--policy with --checkpoint": (
        lambda tmp: ["eval", QS, "--policy", "expert", "--checkpoint", str(tmp)],
        ["--policy", "--checkpoint", "one"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_exits_2_with_one_line_naming_it(case, tmp_path, capsys):
    argv, needles = CASES[case]
    try:
        rc = main(argv(tmp_path))
    finally:
        while _HELD:
            _HELD.pop().release()
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert rc == 2, captured.err[-2000:]
    assert len(lines) == 1, captured.err[-2000:]
    assert "Traceback" not in captured.err + captured.out
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def _tools():
    from jaxagent.envs.tool_spec import ToolSpec

    return [
        ToolSpec(
            "price",
            parameters={
                "type": "object",
                "properties": {"item": {"type": "string"}, "qty": {"type": "integer"}},
                "required": ["item"],
            },
        ),
        ToolSpec(
            "agenda",
            parameters={
                "type": "object",
                "properties": {"day": {"type": "string", "enum": ["mon", "tue"]}},
                "required": ["day"],
            },
        ),
    ]


TOOL_CASES = {
    "unknown tool": ('Action: prise(item="x")', ["prise", "Did you mean price", "agenda"]),
    "wrong type": ("Action: price(item=5)", ["'item'", "string", "5"]),
    "missing argument": ("Action: price()", ["missing required argument 'item'"]),
    "unexpected argument": (
        'Action: price(item="a", colour="red")',
        ["'colour'", "known arguments: item, qty"],
    ),
    "not in enum": ('Action: agenda(day="sun")', ["'day'", '"mon", "tue"', '"sun"']),
    "bad syntax": ('Action: price(item="a"', ["Action: tool_name("]),
}


@pytest.mark.parametrize("case", list(TOOL_CASES))
def test_bad_tool_call_names_the_argument_value_and_fix(case):
    from jaxagent.envs.actions import resolve_action
    from jaxagent.envs.tool_spec import ActionError

    text, needles = TOOL_CASES[case]
    result = resolve_action(text, _tools())
    assert isinstance(result, ActionError), result
    for needle in needles:
        assert needle in result.message, (needle, result.message)


def test_the_sweep_covers_at_least_40_cases():
    assert len(CASES) + len(TOOL_CASES) >= 40
