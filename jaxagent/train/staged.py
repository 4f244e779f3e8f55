"""SFT to a Hugging Face directory, then RL from it through ``model.init_from``.

With ``sft.to_hf: true`` ``jaxagent train`` runs the path a user with a downloaded
checkpoint takes, in two stages of one command:

1. SFT (the config's ``sft`` section) on a from-scratch model, whose weights and tokenizer
   (chat template included) are written to ``<run_dir>/sft_hf`` with ``save_hf`` and
   ``save_pretrained`` (``<run_dir>/sft_stage`` keeps that stage's config and metrics);
2. RL with ``model.init_from=<run_dir>/sft_hf`` and SFT off: tokenizer, template and weights
   all come from the directory, exactly as from a third-party checkpoint.

The last line is the trainer's JSON line (``success_before_rl`` is the loaded SFT model's
held-out success) with ``wall_s`` covering both stages (``sft_wall_s`` / ``rl_wall_s`` apart).
A finished first stage (``sft_hf/config.json`` present) is reused when the run resumes.
"""

from __future__ import annotations

import json
import time
from typing import Callable

from jaxagent.train.config import Config, replace
from jaxagent.errors import ConfigError


def run_sft_then_rl(config: Config, echo: Callable[[str], None] = print) -> dict:
    """Run both stages; returns the RL stage's summary (``wall_s``: both stages)."""
    from jaxagent.models import save_hf
    from jaxagent.train.trainer import Trainer

    if not config.sft.enabled or config.model.init_from:
        raise ConfigError(
            f"sft.to_hf=true needs sft.enabled=true and no model.init_from (got "
            f"sft.enabled={config.sft.enabled}, model.init_from={config.model.init_from!r}): "
            "the first stage trains the model that the second loads"
        )
    t0 = time.perf_counter()
    run_dir = config.run_dir
    hf_dir = run_dir / "sft_hf"
    if not (hf_dir / "config.json").exists() or not config.train.resume:
        stage = Trainer(replace(config, [f"train.out_dir={run_dir / 'sft_stage'}"]), echo=echo)
        try:
            params, _, _ = stage.sft_until_learned(stage.take_initial_params())
            save_hf(str(hf_dir), stage.model_config, stage.graphdef, params)
            stage.tokenizer.save_pretrained(str(hf_dir))
        finally:
            stage.close()
        echo(f"[sft -> hf] wrote {hf_dir} (weights, tokenizer, chat template)")
    sft_s = time.perf_counter() - t0
    rl_config = replace(
        config, [f"model.init_from={hf_dir}", "sft.enabled=false", "sft.to_hf=false"]
    )
    lines: list[str] = []

    def keep_json(line: str) -> None:  # the RL stage's own JSON line is replaced below
        (lines.append if line.startswith("{") else echo)(line)

    summary = Trainer(rl_config, echo=keep_json).run()
    rl_s = float(summary["wall_s"])
    last = json.loads(lines[-1]) if lines else {}
    last.update(wall_s=round(sft_s + rl_s, 1), sft_wall_s=round(sft_s, 1), rl_wall_s=rl_s)
    summary.update(wall_s=last["wall_s"], sft_wall_s=last["sft_wall_s"], rl_wall_s=rl_s)
    (rl_config.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    echo(json.dumps(last))
    return summary
