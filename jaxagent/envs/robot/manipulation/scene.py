"""The tabletop scene in MJCF: a table, a floating gripper, blocks and cups, a tray.

The gripper is a mocap body (moved kinematically by the scripted controllers in
``skills.py``) with one collision geom for pushing; it grasps through one weld equality per
graspable object, off in the model and switched on at grasp time with the relative pose of
that moment (``Scene.weld``). Blocks (4 cm cubes) and cups (open boxes, 9 cm wide, 7 cm high)
have free joints; the tray is a static pad. The table top is z = 0; anything below
``OFF_TABLE_Z`` has fallen off.

The model holds ``N_BLOCKS`` block and ``N_CUPS`` cup bodies (slots ``block0`` ...); a
layout names the objects of one task ("red block", "pink cup") from the palettes, and
``Scene.reset`` gives each a slot and paints the slot its colour. One compiled model then
serves any choice of colours, and a task world can use more colours than a scene holds (more
instructions to learn from) at the physics cost of five objects.

Off-screen rendering: ``frames.py`` (EGL, else OSMesa).
"""

from __future__ import annotations

import mujoco
import numpy as np

BLOCK_PALETTE = ("red", "green", "yellow", "orange", "purple", "black")  # "red block"
CUP_PALETTE = ("blue", "white", "pink", "gray")  # "blue cup"
N_BLOCKS, N_CUPS = 3, 2  # objects on the table at a time
BLOCKS = BLOCK_PALETTE[:N_BLOCKS]  # the default scene's colours
CUPS = CUP_PALETTE[:N_CUPS]
OBJECTS = tuple(f"{c} block" for c in BLOCKS) + tuple(f"{c} cup" for c in CUPS)
PALETTE_OBJECTS = tuple(f"{c} block" for c in BLOCK_PALETTE) + tuple(
    f"{c} cup" for c in CUP_PALETTE
)
TABLE_HALF = 0.38  # table top is [-0.38, 0.38]^2 at z = 0
REACH = 0.32  # the gripper reaches |x|, |y| <= REACH (a 10 cm push from there falls off)
TRAY_XY = (0.0, 0.25)  # the tray's centre; a 0.16 x 0.12 pad
TRAY_HALF = (0.08, 0.06)
BLOCK_HALF = 0.02
CUP_HALF, CUP_HEIGHT, CUP_WALL = 0.045, 0.07, 0.005
OFF_TABLE_Z = -0.05

_RGBA = {
    "red": "0.85 0.15 0.15 1",
    "green": "0.2 0.7 0.25 1",
    "yellow": "0.95 0.8 0.1 1",
    "orange": "0.95 0.5 0.1 1",
    "purple": "0.55 0.2 0.75 1",
    "black": "0.08 0.08 0.08 1",
    "blue": "0.2 0.35 0.9 1",
    "white": "0.92 0.92 0.92 1",
    "pink": "0.95 0.55 0.7 1",
    "gray": "0.5 0.5 0.5 1",
}
_RGBA_FLOAT = {k: [float(x) for x in v.split()] for k, v in _RGBA.items()}
SLOTS = tuple(f"block{i}" for i in range(N_BLOCKS)) + tuple(f"cup{i}" for i in range(N_CUPS))


def _block(slot: str) -> str:
    h = BLOCK_HALF
    return (
        f'<body name="{slot}" pos="0 0 {h}"><freejoint/>'
        f'<geom type="box" size="{h} {h} {h}" rgba="{_RGBA["red"]}" mass="0.05" '
        'friction="1 0.01 0.001"/></body>'
    )


def _cup(slot: str) -> str:
    a, hz, w = CUP_HALF, CUP_HEIGHT / 2, CUP_WALL
    rgba = _RGBA["blue"]
    walls = [
        f'<geom type="box" size="{a} {a} {w}" pos="0 0 {w}" rgba="{rgba}" mass="0.04"/>',
        f'<geom type="box" size="{w} {a} {hz}" pos="{a - w} 0 {hz}" rgba="{rgba}" mass="0.02"/>',
        f'<geom type="box" size="{w} {a} {hz}" pos="{w - a} 0 {hz}" rgba="{rgba}" mass="0.02"/>',
        f'<geom type="box" size="{a} {w} {hz}" pos="0 {a - w} {hz}" rgba="{rgba}" mass="0.02"/>',
        f'<geom type="box" size="{a} {w} {hz}" pos="0 {w - a} {hz}" rgba="{rgba}" mass="0.02"/>',
    ]
    return f'<body name="{slot}" pos="0 0 0"><freejoint/>{"".join(walls)}</body>'


def scene_xml() -> str:
    """The MJCF of the whole scene (every slot present; tasks move and paint them)."""
    welds = "".join(
        f'<weld name="grip_{o}" body1="hand" body2="{o}" active="false" solref="0.01 1"/>'
        for o in SLOTS
    )
    tx, ty = TRAY_XY
    return f"""
<mujoco model="tabletop">
  <option timestep="0.004" integrator="implicitfast" cone="elliptic" impratio="5"/>
  <visual><global offwidth="320" offheight="240"/><quality shadowsize="1024"/></visual>
  <asset>
    <texture name="grid" type="2d" builtin="checker" rgb1=".25 .27 .3" rgb2=".3 .32 .35"
      width="64" height="64"/>
    <material name="grid" texture="grid" texrepeat="8 8"/>
  </asset>
  <worldbody>
    <light pos="0 -0.6 1.5" dir="0 0.4 -1" diffuse="0.8 0.8 0.8"/>
    <geom name="floor" type="plane" size="2 2 0.1" pos="0 0 -0.75" material="grid"/>
    <geom name="table" type="box" size="{TABLE_HALF} {TABLE_HALF} 0.025" pos="0 0 -0.025"
      rgba="0.55 0.4 0.28 1" friction="1 0.01 0.001"/>
    <geom name="tray" type="box" size="{TRAY_HALF[0]} {TRAY_HALF[1]} 0.002"
      pos="{tx} {ty} 0.002" rgba="0.3 0.3 0.3 1" contype="0" conaffinity="0"/>
    <camera name="front" pos="0 -1.05 0.85" xyaxes="1 0 0 0 0.63 0.78" fovy="45"/>
    <body name="hand" mocap="true" pos="0 0 0.3">
      <geom name="hand" type="box" size="0.015 0.015 0.02" pos="0 0 0.02"
        rgba="0.15 0.15 0.15 1"/>
    </body>
    {"".join(_block(o) for o in SLOTS if o.startswith("block"))}
    {"".join(_cup(o) for o in SLOTS if o.startswith("cup"))}
  </worldbody>
  <equality>{welds}</equality>
</mujoco>
"""


class Scene:
    """One MuJoCo model + data of the tabletop, and the readings the skills and rewards use."""

    def __init__(self):
        self.model = mujoco.MjModel.from_xml_string(scene_xml())
        self.data = mujoco.MjData(self.model)
        m = self.model
        self.hand_body = m.body("hand").id
        self.hand_geom = m.geom("hand").id
        self._renderer = None
        # per slot, once: (body id, qpos address, dof address, weld id, geom range)
        self._slots = {}
        for s in SLOTS:
            b = m.body(s).id
            j = m.body_jntadr[b]
            geoms = slice(m.body_geomadr[b], m.body_geomadr[b] + m.body_geomnum[b])
            self._slots[s] = (
                b,
                m.jnt_qposadr[j],
                m.jnt_dofadr[j],
                m.equality(f"grip_{s}").id,
                geoms,
            )
        self.objects: tuple[str, ...] = ()
        self._assign(OBJECTS)

    def _assign(self, objects) -> None:
        """Slot per object (blocks and cups in the order given), each slot painted."""
        blocks = [o for o in objects if o.endswith(" block")]
        cups = [o for o in objects if o.endswith(" cup")]
        if len(blocks) != N_BLOCKS or len(cups) != N_CUPS or len(set(objects)) != len(objects):
            raise ValueError(
                f"a layout names {N_BLOCKS} distinct blocks and {N_CUPS} cups from the "
                f"palettes; got {list(objects)}"
            )
        unknown = [o for o in objects if o not in PALETTE_OBJECTS]
        if unknown:
            raise ValueError(f"unknown objects {unknown}; the palette: {list(PALETTE_OBJECTS)}")
        objects = tuple(blocks + cups)
        if objects == self.objects:  # the same objects in the same slots: nothing to repaint
            return
        self.objects = objects
        slot = {o: self._slots[s] for o, s in zip(objects, SLOTS)}
        self.body = {o: v[0] for o, v in slot.items()}
        self.qadr = {o: v[1] for o, v in slot.items()}
        self.dadr = {o: v[2] for o, v in slot.items()}
        self.weld_id = {o: v[3] for o, v in slot.items()}
        for o, v in slot.items():
            self.model.geom_rgba[v[4]] = _RGBA_FLOAT[o.split()[0]]

    def reset(self, layout: dict[str, tuple[float, float, float]], hand=(0.0, -0.15, 0.25)):
        """Every object at ``layout[obj] = (x, y, z)`` upright and at rest; welds off. The
        layout names the scene's objects (``N_BLOCKS`` blocks, ``N_CUPS`` cups)."""
        self._assign(tuple(layout))
        m, d = self.model, self.data
        mujoco.mj_resetData(m, d)
        for obj, pos in layout.items():
            a = self.qadr[obj]
            d.qpos[a : a + 3] = pos
            d.qpos[a + 3 : a + 7] = (1.0, 0.0, 0.0, 0.0)
        d.mocap_pos[0] = hand
        d.mocap_quat[0] = (1.0, 0.0, 0.0, 0.0)
        d.eq_active[:] = 0
        m.geom_contype[self.hand_geom] = m.geom_conaffinity[self.hand_geom] = 1
        mujoco.mj_forward(m, d)

    def pos(self, obj: str) -> np.ndarray:
        return self.data.xpos[self.body[obj]].copy()

    def upright(self, obj: str) -> bool:
        """The object's z axis within ~25 degrees of vertical."""
        return bool(self.data.xmat[self.body[obj]][8] > 0.9)

    @property
    def hand(self) -> np.ndarray:
        return self.data.mocap_pos[0].copy()

    def weld(self, obj: str, on: bool) -> None:
        """Switch the gripper's weld to ``obj``; on = hold it at its current relative pose."""
        m, d = self.model, self.data
        i = self.weld_id[obj]
        if on:
            # eq_data of a weld: anchor [0:3], relpose pos [3:6] and quat [6:10] (body2 in
            # body1's frame), torquescale [10]. MuJoCo reads it every step, so setting it to
            # the relative pose right now holds the object where it is.
            hp, hq = d.xpos[self.hand_body], d.xquat[self.hand_body]
            op, oq = d.xpos[self.body[obj]], d.xquat[self.body[obj]]
            inv = np.zeros(4)
            mujoco.mju_negQuat(inv, hq)
            rel_p, rel_q = np.zeros(3), np.zeros(4)
            mujoco.mju_rotVecQuat(rel_p, op - hp, inv)
            mujoco.mju_mulQuat(rel_q, inv, oq)
            m.eq_data[i, 0:3] = 0.0
            m.eq_data[i, 3:6] = rel_p
            m.eq_data[i, 6:10] = rel_q
            m.eq_data[i, 10] = 1.0
        d.eq_active[i] = 1 if on else 0
        # The hand's collision geom is for pushing; while it holds something it sits at a
        # cup's mouth and would trap what is poured, so it stops colliding until release.
        m.geom_contype[self.hand_geom] = m.geom_conaffinity[self.hand_geom] = 0 if on else 1

    def render_frame(self, width: int = 320, height: int = 240) -> np.ndarray:
        """``[H, W, 3]`` uint8 RGB from the front camera (off-screen: EGL or OSMesa)."""
        if self._renderer is None:
            from jaxagent.envs.robot.manipulation.frames import OffscreenRenderer

            self._renderer = OffscreenRenderer(self.model, width, height)
        return self._renderer.render(self.data, "front")

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
