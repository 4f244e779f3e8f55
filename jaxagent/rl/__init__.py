"""RL core: pure advantage estimators and losses, named recipes, and the jitted update step.

Import the pieces you need::

    from jaxagent.rl import advantages, losses, kl, recipes
    from jaxagent.rl.recipes import get_recipe                    # presets of the sections
    from jaxagent.rl.config import RLConfig                       # typed sections and tables
    cfg = get_recipe("loop", optim={"learning_rate": 1e-5}, lora={"rank": 0})
    from jaxagent.rl.train_state import TrainState, make_optimizer
    from jaxagent.rl.update import make_update_step
    from jaxagent.rl.model_fns import model_logprob_fn, model_apply_fn
    from jaxagent.rl.prepare import compute_advantages

    state = TrainState.create(params, cfg, key)                   # LoRA if cfg.lora.rank > 0
    update = make_update_step(cfg, logprob_fn=model_logprob_fn(graphdef))
    state, metrics = update(state, batch)                         # state is donated
"""

from jaxagent.rl import advantages, config, kl, losses, recipes  # noqa: F401
from jaxagent.rl.config import RLConfig  # noqa: F401
from jaxagent.rl.recipes import get_recipe, recipe_names  # noqa: F401
