"""Code generation: a real sandbox, HumanEval (test) and generated (train) tasks, unit-test rewards.

    from jaxagent.envs.code import Sandbox, SandboxConfig, CodeTaskSource, CodeEnv

``Sandbox`` runs untrusted Python isolated (namespaces, read-only chroot, unprivileged uid,
rlimits, wall clock); ``CodeTaskSource`` gives train / validation (generated) and test
(HumanEval) splits; ``CodeEnv`` is the single- or multi-turn ``TextEnv``;
``evaluate_samples`` scores n samples per task into pass@k / pass^k (``jaxagent.eval.passk``);
``suite`` registers the suite (``env.name: code``) in ``jaxagent.envs.registry``.
"""

import importlib

# Exports resolve lazily (PEP 562) so ``python -m jaxagent.envs.code.sandbox`` does not import
# its own module twice, and importing the package stays cheap.
_EXPORTS = {
    "CodeEnv": "env",
    "CodeEnvConfig": "env",
    "make_code_env": "env",
    "evaluate_samples": "evaluate",
    "Sandbox": "sandbox",
    "SandboxConfig": "sandbox",
    "SandboxResult": "sandbox",
    "TestSpec": "sandbox",
    "CodeTaskSource": "tasks",
    "assemble_program": "tasks",
    "check_no_leakage": "tasks",
    "extract_code": "tasks",
    "hidden_tests": "tasks",
}


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"jaxagent.envs.code.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'jaxagent.envs.code' has no attribute {name!r}")


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
