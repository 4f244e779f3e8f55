"""Off-screen MuJoCo frames without a display: EGL (Mesa's or a GPU's), else OSMesa.

``mujoco.Renderer`` picks its OpenGL platform from ``MUJOCO_GL`` once, when ``mujoco`` is
first imported, which in jaxagent happens long before a render is asked for (the robot
package imports it) and defaults to GLFW, which needs an X display. So the context is made
here directly: ``MUJOCO_GL`` if the user set it to ``egl`` or ``osmesa``, else EGL, then
OSMesa (``libosmesa6``; ``scripts/test.sh`` installs it in CI). The platform of PyOpenGL is
fixed on its first import too, so ``PYOPENGL_PLATFORM`` is set to match before it.
"""

from __future__ import annotations

import ctypes.util
import importlib
import os

import mujoco
import numpy as np


def _contexts() -> list[str]:
    """The platforms to try, in order. PyOpenGL binds one platform on first import, so a
    platform whose library is missing is not tried at all (CI installs only libosmesa6)."""
    user = os.environ.get("MUJOCO_GL", "").lower()
    if user in ("egl", "osmesa"):
        return [user]
    found = [
        n for n, lib in (("egl", "EGL"), ("osmesa", "OSMesa")) if ctypes.util.find_library(lib)
    ]
    return found or ["egl", "osmesa"]


def make_gl_context(width: int, height: int):
    """A current off-screen GL context; raises RuntimeError naming what was tried."""
    errors = []
    for name in _contexts():
        os.environ.setdefault("PYOPENGL_PLATFORM", name)
        try:
            ctx = importlib.import_module(f"mujoco.{name}").GLContext(width, height)
            ctx.make_current()
            return ctx
        except Exception as exc:  # a missing library or driver: try the next platform
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
    raise RuntimeError(
        "no off-screen OpenGL for MuJoCo frames (" + "; ".join(errors) + "); install Mesa "
        "EGL (libegl1 libgl1-mesa-dri) or libosmesa6, or set MUJOCO_GL=egl|osmesa"
    )


class OffscreenRenderer:
    """``render(data, camera) -> [H, W, 3] uint8`` for one model."""

    def __init__(self, model: mujoco.MjModel, width: int, height: int):
        self.model, self.width, self.height = model, width, height
        self.ctx = make_gl_context(width, height)
        self.scene = mujoco.MjvScene(model, maxgeom=1000)
        self.option = mujoco.MjvOption()
        self.camera = mujoco.MjvCamera()
        self.mjr = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self.mjr)
        self.rect = mujoco.MjrRect(0, 0, width, height)
        self.pixels = np.zeros((height, width, 3), np.uint8)

    def render(self, data: mujoco.MjData, camera: str | None = None, track=None) -> np.ndarray:
        """From the model's camera ``camera``, or a free camera 3 m from ``track`` (xyz)."""
        self.ctx.make_current()
        if camera is not None:
            self.camera.type = mujoco.mjtCamera.mjCAMERA_FIXED
            self.camera.fixedcamid = self.model.camera(camera).id
        else:
            self.camera.type = mujoco.mjtCamera.mjCAMERA_FREE
            self.camera.lookat[:] = track
            self.camera.distance, self.camera.elevation, self.camera.azimuth = 3.0, -15.0, 90.0
        mujoco.mjv_updateScene(
            self.model, data, self.option, None, self.camera, mujoco.mjtCatBit.mjCAT_ALL, self.scene
        )
        mujoco.mjr_render(self.rect, self.scene, self.mjr)
        mujoco.mjr_readPixels(self.pixels, None, self.rect, self.mjr)
        return np.flipud(self.pixels).copy()  # OpenGL's rows run bottom-up

    def close(self) -> None:
        if self.ctx is not None:
            self.mjr.free()
            self.ctx.free()
            self.ctx = None
