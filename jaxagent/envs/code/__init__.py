"""Code generation: a real sandbox, HumanEval (test) and generated (train) tasks, unit-test rewards.

    from jaxagent.envs.code import Sandbox, SandboxConfig, CodeTaskSource, CodeEnv

``Sandbox`` runs untrusted Python isolated (namespaces, read-only chroot, unprivileged uid,
rlimits, wall clock); ``CodeTaskSource`` gives train / validation (generated) and test
(HumanEval) splits; ``CodeEnv`` is the single- or multi-turn ``TextEnv``;
``evaluate_samples`` scores n samples per task into pass@k / pass^k (``jaxagent.eval.passk``);
``suite.build(options)`` gives the trainer's registry what it needs.
"""

from jaxagent.envs.code.env import CodeEnv, CodeEnvConfig, make_code_env
from jaxagent.envs.code.evaluate import evaluate_samples
from jaxagent.envs.code.sandbox import Sandbox, SandboxConfig, SandboxResult, TestSpec
from jaxagent.envs.code.tasks import (
    CodeTaskSource,
    assemble_program,
    check_no_leakage,
    extract_code,
    hidden_tests,
)

__all__ = [
    "CodeEnv",
    "CodeEnvConfig",
    "CodeTaskSource",
    "Sandbox",
    "SandboxConfig",
    "SandboxResult",
    "TestSpec",
    "assemble_program",
    "check_no_leakage",
    "evaluate_samples",
    "extract_code",
    "make_code_env",
    "hidden_tests",
]
