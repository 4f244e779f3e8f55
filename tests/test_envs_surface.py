"""``jaxagent.envs`` is the public surface for a world of one's own: the protocol types and
the registry's ``register_env`` / ``EnvSpec`` / ``get_env_spec`` import from the package
itself, and importing it stays host-side (no JAX)."""

import subprocess
import sys


def test_register_env_and_envspec_import_from_the_package_without_jax():
    code = (
        "import sys\n"
        "from jaxagent.envs import EnvSpec, StepResult, Task, TextEnv, register_env, get_env_spec\n"
        "from jaxagent.envs import registry\n"
        "assert register_env is registry.register_env and EnvSpec is registry.EnvSpec\n"
        "assert get_env_spec('quickstart').name == 'quickstart'\n"
        "assert 'jax' not in sys.modules, 'jaxagent.envs imported JAX'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
