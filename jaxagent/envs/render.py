"""Pictures of episodes: a wrapper that saves one PNG per step and a GIF per episode.

An environment that can draw itself implements ``render_frame() -> np.ndarray`` (``[H, W, 3]``
uint8 RGB, the current state: a browser screenshot, a MuJoCo camera). ``jaxagent rollout
--render DIR`` wraps the config's environment in ``RenderingEnv``, which calls it after
``reset`` and after every ``step`` and writes ``DIR/episode_<i>/step_<t>.png`` and
``DIR/episode_<i>.gif``. Environments without ``render_frame`` are refused with a message
naming the suite, rather than producing empty folders.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

from jaxagent.envs.base import StepResult, Task, TextEnv


@runtime_checkable
class DrawnEnv(Protocol):
    """An optional capability: the environment draws its current state as an RGB(A) uint8
    frame [H, W, 3|4] (the robot scenes, MiniWoB++'s browser)."""

    def render_frame(self) -> np.ndarray: ...


def can_render(env: Any) -> bool:
    """Whether ``env`` declares ``DrawnEnv``."""
    return isinstance(env, DrawnEnv)


def _check_frame(frame: Any) -> np.ndarray:
    frame = np.asarray(frame)
    if frame.ndim != 3 or frame.shape[-1] not in (3, 4) or frame.dtype != np.uint8:
        raise ValueError(
            f"render_frame() returned an array of shape {frame.shape} and dtype {frame.dtype}; "
            "it must be [H, W, 3] (or 4) uint8 RGB"
        )
    return frame[..., :3]


class RenderingEnv:
    """Wraps a ``TextEnv`` with ``render_frame`` and saves its frames (see module doc)."""

    def __init__(self, env: TextEnv, out_dir: str | Path, *, gif_ms_per_frame: int = 500):
        if not can_render(env):
            raise ValueError(
                f"{type(env).__name__} cannot render (it has no render_frame()); --render "
                "works for environments that draw themselves (MiniWoB++, MuJoCo suites)"
            )
        self.env = env
        self.out_dir = Path(out_dir)
        self.gif_ms_per_frame = gif_ms_per_frame
        self._episode = -1
        self._frames: list[np.ndarray] = []

    def _save(self) -> None:
        from PIL import Image

        frame = _check_frame(self.env.render_frame())
        self._frames.append(frame)
        d = self.out_dir / f"episode_{self._episode:03d}"
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(frame).save(d / f"step_{len(self._frames) - 1:03d}.png")

    def _write_gif(self) -> None:
        if not self._frames:
            return
        from PIL import Image

        images = [Image.fromarray(f) for f in self._frames]
        images[0].save(
            self.out_dir / f"episode_{self._episode:03d}.gif",
            save_all=True,
            append_images=images[1:],
            duration=self.gif_ms_per_frame,
            loop=0,
        )

    def reset(self, task: Task) -> str:
        self._write_gif()
        self._episode += 1
        self._frames = []
        obs = self.env.reset(task)
        self._save()
        return obs

    def step(self, action: str) -> StepResult:
        result = self.env.step(action)
        self._save()
        return result

    def close(self) -> None:
        self._write_gif()
        self._frames = []
        self.env.close()

    def __getattr__(self, name: str) -> Any:  # seed(), snapshot() ... pass through
        return getattr(self.env, name)


@dataclasses.dataclass
class RenderingEnvFactory:
    """``env_fn(env_id)`` that wraps each environment in a ``RenderingEnv`` under ``out_dir``."""

    make_env: Callable[..., TextEnv]
    out_dir: str

    def __call__(self, env_id: int = 0) -> RenderingEnv:
        return RenderingEnv(self.make_env(env_id), self.out_dir)
