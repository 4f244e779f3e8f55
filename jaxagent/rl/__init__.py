"""RL core: pure advantage estimators and losses, named recipes, and the jitted update step.

Import the pieces you need::

    from jaxagent.rl import advantages, losses, kl, recipes
    from jaxagent.rl.recipes import get_recipe, RLConfig
    from jaxagent.rl.train_state import TrainState, make_optimizer
    from jaxagent.rl.update import make_update_step, model_apply_fn
    from jaxagent.rl.prepare import compute_advantages
"""

from jaxagent.rl import advantages, kl, losses, recipes  # noqa: F401
from jaxagent.rl.recipes import RLConfig, get_recipe, recipe_names  # noqa: F401
