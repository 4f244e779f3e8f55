"""Provenance of an evaluation record: what a table needs to be traced to the run that made
it (config hash, model, checkpoint, seeds, package versions, the tree's git commit)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import platform
import subprocess
from pathlib import Path
from typing import Any, Optional, Sequence

PACKAGES = (
    "jaxagent",
    "jax",
    "jaxlib",
    "flax",
    "optax",
    "orbax-checkpoint",
    "transformers",
    "numpy",
)


def _git_state() -> dict[str, Any]:
    """The jaxagent tree's commit and whether tracked files differ from it (None outside git)."""
    root = str(Path(__file__).resolve().parents[2])

    def git(*args):
        try:
            out = subprocess.run(
                ["git", "-C", root, *args], capture_output=True, text=True, timeout=5
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"git_commit": commit or None, "git_dirty": None if dirty is None else bool(dirty)}


def package_versions(names: Sequence[str] = PACKAGES) -> dict[str, Optional[str]]:
    """Installed versions (None when a package is absent), read without importing them."""
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def config_hash(config_yaml: str) -> str:
    """sha256 of the resolved config's YAML (``train.config.config_to_yaml``), 16 hex digits."""
    return hashlib.sha256(config_yaml.encode()).hexdigest()[:16]


def provenance(
    *,
    config_yaml: str = "",
    model: Optional[dict] = None,
    checkpoint: Optional[str] = None,
    step: Optional[int] = None,
    train_seeds: Sequence[int] = (),
    eval_seeds: Sequence[int] = (),
    env: Optional[str] = None,
    policy: Optional[str] = None,
    extra: Optional[dict] = None,
) -> dict[str, Any]:
    """What a table needs to be traced to the run that made it."""
    return {
        "config_hash": config_hash(config_yaml) if config_yaml else None,
        "model": model or {},
        "policy": policy,
        "checkpoint": checkpoint,
        "step": step,
        "env": env,
        "train_seeds": list(train_seeds),
        "eval_seeds": list(eval_seeds),
        "packages": package_versions(),
        "python": platform.python_version(),
        **_git_state(),
        **(extra or {}),
    }
