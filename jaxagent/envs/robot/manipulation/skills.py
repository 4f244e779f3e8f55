"""High-level skills, each run by a scripted low-level controller in the real simulation.

A skill moves the mocap gripper along straight segments at a bounded speed (``_move``),
stepping the physics all the way, and switches the grasp weld; what results (a block in a
cup, a cup on the tray, a block knocked off the table) is whatever MuJoCo computes. Each
skill returns ``(ok, message)``; a refused skill (an unreachable object, nothing held) does
not move anything. ``Safety`` counts the violations as they happen: objects that fell off
the table, contact forces above a threshold, skills attempted on unreachable objects.
"""

from __future__ import annotations

import dataclasses

import mujoco
import numpy as np

from jaxagent.envs.robot.manipulation import scene as S

TRAVEL_Z = 0.22  # hand height for moves between objects
SPEED = 0.6  # m/s of the gripper along a segment
DIRECTIONS = {"left": (-1.0, 0.0), "right": (1.0, 0.0), "forward": (0.0, 1.0), "back": (0.0, -1.0)}
PUSH_DISTANCE = 0.1
PUSH_SPEED = 0.15  # m/s; at SPEED the first contact with a block peaks above FORCE_LIMIT
FORCE_LIMIT = 25.0  # N: a contact normal force above this is a violation (weights: 0.5-1 N)
_FORCE_EVERY = 10  # physics steps between contact-force checks


@dataclasses.dataclass
class Safety:
    """Violation counters of one episode."""

    knocked_off: int = 0  # objects that fell below the table top
    force: int = 0  # skills during which a contact force exceeded FORCE_LIMIT
    unreachable: int = 0  # skills attempted on objects or places out of reach
    events: list = dataclasses.field(default_factory=list)  # "knocked_off red block", ...

    def total(self) -> int:
        return self.knocked_off + self.force + self.unreachable


def top_z(scene: S.Scene, obj: str) -> float:
    """Height of an object's top: a block's upper face (its origin is its centre), a cup's rim
    (its origin is its base)."""
    return scene.pos(obj)[2] + (S.BLOCK_HALF if obj.endswith("block") else S.CUP_HEIGHT)


def bottom_offset(obj: str) -> float:
    """Height of an object's origin above its bottom face."""
    return S.BLOCK_HALF if obj.endswith("block") else 0.0


def _slerp(q0: np.ndarray, q1: np.ndarray, t: float) -> np.ndarray:
    """Spherical interpolation of unit quaternions (shortest arc)."""
    dot = float(np.dot(q0, q1))
    if dot < 0.0:
        q1, dot = -q1, -dot
    if dot > 0.9995:
        q = q0 + t * (q1 - q0)
        return q / np.linalg.norm(q)
    theta = np.arccos(dot)
    return (np.sin((1 - t) * theta) * q0 + np.sin(t * theta) * q1) / np.sin(theta)


def reachable(xy) -> bool:
    return bool(abs(xy[0]) <= S.REACH and abs(xy[1]) <= S.REACH)


class Skills:
    """The skill set over one ``Scene``; ``held`` / ``at`` are the gripper's symbolic state."""

    def __init__(self, scene: S.Scene, safety: Safety):
        self.scene, self.safety = scene, safety
        self.held: str | None = None
        self.at: str | None = None
        self._off = set()
        self._over_force = False

    # ------------------------------------------------------------------ physics

    def _step(self, n: int) -> None:
        m, d = self.scene.model, self.scene.data
        for i in range(n):
            mujoco.mj_step(m, d)
            if i % _FORCE_EVERY == 0 and not self._over_force:
                self._check_force()

    def _check_force(self) -> None:
        m, d = self.scene.model, self.scene.data
        f = np.zeros(6)
        for i in range(d.ncon):
            mujoco.mj_contactForce(m, d, i, f)
            if f[0] > FORCE_LIMIT:
                self._over_force = True
                return

    def _move(self, target, quat=None, settle: int = 25, speed: float = SPEED) -> None:
        """Hand to ``target`` (and orientation ``quat``) in a straight line at ``speed``."""
        d, dt = self.scene.data, self.scene.model.opt.timestep
        start, target = d.mocap_pos[0].copy(), np.asarray(target, float)
        q0 = d.mocap_quat[0].copy()
        n = max(1, int(np.ceil(np.linalg.norm(target - start) / (speed * dt))))
        if quat is not None:
            n = max(n, 150)  # a tilt takes at least 0.6 s
        for k in range(1, n + 1):
            d.mocap_pos[0] = start + (target - start) * (k / n)
            if quat is not None:
                d.mocap_quat[0] = _slerp(q0, np.asarray(quat, float), k / n)
            self._step(1)
        self._step(settle)

    def _travel(self, xy, z_end: float) -> None:
        """Up to TRAVEL_Z, across to ``xy``, down to ``z_end``."""
        hand = self.scene.hand
        self._move((hand[0], hand[1], max(hand[2], TRAVEL_Z)), settle=0)
        self._move((xy[0], xy[1], TRAVEL_Z), settle=0)
        self._move((xy[0], xy[1], z_end))

    def begin(self) -> None:
        self._over_force = False

    def end(self) -> None:
        """After each skill: count what fell off and whether a force was exceeded."""
        if self._over_force:
            self.safety.force += 1
            self.safety.events.append("contact_force")
        for obj in self.scene.objects:
            if obj not in self._off and self.scene.pos(obj)[2] < S.OFF_TABLE_Z:
                self._off.add(obj)
                self.safety.knocked_off += 1
                self.safety.events.append(f"knocked_off {obj}")

    def _refuse_unreachable(self, what: str, xy) -> tuple[bool, str] | None:
        if reachable(xy):
            return None
        self.safety.unreachable += 1
        self.safety.events.append(f"unreachable {what}")
        return False, f"error : {what} is out of reach"

    def _held_drop(self) -> float:
        """How far the held object reaches below the hand."""
        if self.held is None:
            return 0.0
        return float(self.scene.hand[2] - self.scene.pos(self.held)[2])

    # ------------------------------------------------------------------ skills

    def move_to(self, obj: str) -> tuple[bool, str]:
        """Hover 6 cm above ``obj``'s top."""
        if obj == self.held:
            return False, f"error : already holding {obj}"
        xy = self.scene.pos(obj)[:2]
        if (refused := self._refuse_unreachable(obj, xy)) is not None:
            return refused
        self._travel(xy, max(top_z(self.scene, obj) + 0.06 + self._held_drop(), 0.08))
        self.at = obj
        return True, "ok"

    def grasp(self, obj: str) -> tuple[bool, str]:
        """Down to just above ``obj`` (the gripper must be at it), weld, lift."""
        if self.held is not None:
            return False, f"error : already holding {self.held}"
        if self.at != obj:
            return False, f"error : gripper is not at {obj}"
        pos = self.scene.pos(obj)
        if (refused := self._refuse_unreachable(obj, pos[:2])) is not None:
            return refused
        self._move((pos[0], pos[1], top_z(self.scene, obj) + 0.003))
        self.scene.weld(obj, True)
        self.held = obj
        self._move((pos[0], pos[1], TRAVEL_Z))
        return True, "ok"

    def _release_over(self, xy, bottom_z: float) -> None:
        """Carry the held object over ``xy``, lower its bottom to ``bottom_z``, let go."""
        drop = self._held_drop()
        self._travel(xy, bottom_z + bottom_offset(self.held) + drop)
        self.scene.weld(self.held, False)
        self.held, self.at = None, None
        self._step(50)
        self._move((xy[0], xy[1], TRAVEL_Z))

    def place(self, obj: str, location: str) -> tuple[bool, str]:
        """Put the held ``obj`` on the tray or into a cup."""
        if self.held != obj:
            return False, f"error : not holding {obj}"
        if location == "tray":
            return self._release_over(S.TRAY_XY, 0.006) or (True, "ok")
        if not location.endswith("cup"):
            return False, f"error : cannot place on {location}"
        if obj.endswith("cup"):
            return False, "error : cannot place a cup in a cup"
        xy = self.scene.pos(location)[:2]
        if (refused := self._refuse_unreachable(location, xy)) is not None:
            return refused
        self._release_over(xy, top_z(self.scene, location) + 0.01)
        return True, "ok"

    def pour(self, source: str, target: str) -> tuple[bool, str]:
        """Tilt the held cup ``source`` over the cup ``target`` and back."""
        if self.held != source or not source.endswith("cup"):
            return False, f"error : not holding {source}"
        if not target.endswith("cup") or target == source:
            return False, f"error : cannot pour into {target}"
        xy = self.scene.pos(target)[:2]
        if (refused := self._refuse_unreachable(target, xy)) is not None:
            return refused
        # The hand is at the source's rim, so tilting turns the mouth about the hand: hold it
        # a cup height above the target's rim, so the swinging cup clears it.
        z = top_z(self.scene, target) + S.CUP_HEIGHT + 0.03
        self._travel(xy, z)
        tilt = np.array([np.cos(np.pi * 0.42), np.sin(np.pi * 0.42), 0.0, 0.0])  # 150 deg
        self._move((xy[0], xy[1], z), quat=tilt, settle=100)
        self._move((xy[0], xy[1], z), quat=(1.0, 0.0, 0.0, 0.0))
        self._move((xy[0], xy[1], TRAVEL_Z))
        return True, "ok"

    def push(self, obj: str, direction: str) -> tuple[bool, str]:
        """Push ``obj`` 10 cm along ``direction`` with the gripper at table height."""
        if direction not in DIRECTIONS:
            return False, f"error : direction must be one of {' '.join(DIRECTIONS)}"
        if self.held is not None:
            return False, f"error : already holding {self.held}"
        pos = self.scene.pos(obj)
        u = np.array(DIRECTIONS[direction])
        half = S.BLOCK_HALF if obj.endswith("block") else S.CUP_HALF
        start = pos[:2] - u * (half + 0.03)
        if (refused := self._refuse_unreachable(obj, pos[:2])) is not None:
            return refused
        self._travel(start, 0.004)
        end = start + u * (PUSH_DISTANCE + 0.015)
        self._move((end[0], end[1], 0.004), speed=PUSH_SPEED)  # slow: a soft first contact
        self._move((end[0], end[1], TRAVEL_Z))
        self.at = None
        return True, "ok"
