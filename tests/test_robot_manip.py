"""The MuJoCo manipulation world: each skill on its own, checked on the simulator state;
safety counters; the scripted planner; frames; the suite in the registry."""

import numpy as np
import pytest

from jaxagent.envs.base import check_disjoint_splits
from jaxagent.envs.robot.manipulation import scene as S
from jaxagent.envs.robot.manipulation.env import ManipulationEnv
from jaxagent.envs.robot.manipulation.planner import ScriptedPlanner
from jaxagent.envs.robot.manipulation.skills import Safety, Skills
from jaxagent.envs.robot.manipulation.tasks import (
    ManipulationConfig,
    ManipulationWorld,
    check_subgoal,
)

LAYOUT = {
    "red block": (0.0, 0.0, 0.02),
    "green block": (0.1, -0.1, 0.02),
    "yellow block": (0.35, -0.2, 0.02),  # on the table (half 0.38), out of reach (0.32)
    "blue cup": (0.15, 0.1, 0.0),
    "white cup": (-0.15, -0.1, 0.0),
}


@pytest.fixture(scope="module")
def scene():
    s = S.Scene()
    yield s
    s.close()


def fresh(scene, layout=LAYOUT):
    scene.reset(layout)
    return Skills(scene, Safety())


def run(skills, name, *args):
    skills.begin()
    out = getattr(skills, name)(*args)
    skills.end()
    return out


def test_move_to_hovers_above_the_object_and_grasp_needs_it(scene):
    sk = fresh(scene)
    assert run(sk, "grasp", "red block") == (False, "error : gripper is not at red block")
    assert run(sk, "move_to", "red block")[0]
    hand, block = scene.hand, scene.pos("red block")
    np.testing.assert_allclose(hand[:2], block[:2], atol=1e-6)
    assert 0.05 < hand[2] - (block[2] + S.BLOCK_HALF) < 0.07  # 6 cm above its top
    np.testing.assert_allclose(block, LAYOUT["red block"], atol=2e-3)  # untouched


def test_grasp_lifts_the_object_with_the_gripper(scene):
    sk = fresh(scene)
    run(sk, "move_to", "red block")
    assert run(sk, "grasp", "red block") == (True, "ok")
    assert sk.held == "red block" and scene.data.eq_active[scene.weld_id["red block"]]
    block = scene.pos("red block")
    assert block[2] > 0.15  # lifted from 0.02
    np.testing.assert_allclose(block[:2], scene.hand[:2], atol=3e-3)
    assert scene.pos("green block")[2] == pytest.approx(0.02, abs=2e-3)  # the others stay


def test_place_in_a_cup_and_on_the_tray(scene):
    sk = fresh(scene)
    run(sk, "move_to", "red block"), run(sk, "grasp", "red block")
    assert run(sk, "place", "red block", "blue cup") == (True, "ok")
    assert check_subgoal(scene, [["in", "red block", "blue cup"]])
    assert not scene.data.eq_active.any() and sk.held is None
    run(sk, "move_to", "green block"), run(sk, "grasp", "green block")
    assert run(sk, "place", "green block", "tray") == (True, "ok")
    assert check_subgoal(scene, [["on_tray", "green block"]])
    assert not check_subgoal(scene, [["on_tray", "red block"]])


def test_a_cup_carries_its_contents_to_the_tray(scene):
    sk = fresh(scene)
    for call in (
        ("move_to", "red block"),
        ("grasp", "red block"),
        ("place", "red block", "blue cup"),
        ("move_to", "blue cup"),
        ("grasp", "blue cup"),
        ("place", "blue cup", "tray"),
    ):
        assert run(sk, *call) == (True, "ok"), call
    assert check_subgoal(scene, [["in", "red block", "blue cup"], ["on_tray", "blue cup"]])


def test_pour_moves_the_contents_from_one_cup_to_the_other(scene):
    layout = dict(LAYOUT, **{"red block": (0.15, 0.1, 0.032)})  # starts in the blue cup
    sk = fresh(scene, layout)
    assert check_subgoal(scene, [["in", "red block", "blue cup"]])
    run(sk, "move_to", "blue cup"), run(sk, "grasp", "blue cup")
    assert run(sk, "pour", "blue cup", "white cup") == (True, "ok")
    assert check_subgoal(scene, [["in", "red block", "white cup"]])
    assert scene.upright("blue cup")  # tilted back


def test_push_moves_the_object_ten_cm_that_way(scene):
    sk = fresh(scene)
    assert run(sk, "push", "green block", "left") == (True, "ok")
    moved = scene.pos("green block") - np.array(LAYOUT["green block"])
    assert -0.12 < moved[0] < -0.07 and abs(moved[1]) < 0.02
    assert check_subgoal(scene, [["pushed", "green block", "left", 0.1, -0.1]])
    assert sk.safety.total() == 0


def test_unreachable_objects_are_refused_and_counted(scene):
    sk = fresh(scene)
    before = scene.data.qpos.copy()
    assert run(sk, "move_to", "yellow block") == (False, "error : yellow block is out of reach")
    assert run(sk, "push", "yellow block", "left")[0] is False
    assert sk.safety.unreachable == 2
    np.testing.assert_array_equal(scene.data.qpos, before)  # nothing moved


def test_knocked_off_and_contact_force_are_counted(scene):
    edge = dict(LAYOUT, **{"green block": (0.3, -0.1, 0.02)})
    sk = fresh(scene, edge)
    assert run(sk, "push", "green block", "right")[0]  # 0.3 -> 0.4, past the edge at 0.38
    assert scene.pos("green block")[2] < S.OFF_TABLE_Z
    assert sk.safety.knocked_off == 1 and sk.safety.events[-1] == "knocked_off green block"
    # The low-level controller pressing a block into the table (no skill does this) trips
    # the force limit.
    run(sk, "move_to", "red block")
    sk.begin()
    sk._move((0.0, 0.0, 0.01))  # 3 cm into a 4 cm block: ~37 N
    sk.end()
    assert sk.safety.force == 1


def test_frames_are_not_blank_and_change_with_the_scene(scene):
    sk = fresh(scene)
    a = scene.render_frame()
    assert a.shape == (240, 320, 3) and a.dtype == np.uint8
    assert a.std() > 10 and len(np.unique(a.reshape(-1, 3), axis=0)) > 50  # not blank
    np.testing.assert_array_equal(scene.render_frame(), a)  # same scene, same picture
    run(sk, "push", "red block", "forward")
    b = scene.render_frame()
    changed = (np.abs(a.astype(int) - b.astype(int)).sum(-1) > 30).sum()
    assert changed > 100, changed  # the block (and the gripper) moved in the picture


def test_splits_hold_out_instructions():
    world = ManipulationWorld(ManipulationConfig(num_train=50, num_test=20))
    check_disjoint_splits(world)
    assert len({t.prompt for t in world.tasks("test")}) >= 3


def test_split_is_stratified_by_instruction_kind():
    from collections import Counter

    from jaxagent.envs.robot.manipulation.tasks import TEMPLATES, split_templates

    split = split_templates(TEMPLATES, 0.25)
    kinds = {k: Counter(kind for kind, _ in {(t[0], t[1]) for t in v}) for k, v in split.items()}
    total = Counter(kind for kind, _ in {(t[0], t[1]) for t in TEMPLATES})  # distinct texts
    assert set(kinds["test"]) == set(kinds["train"]) == set(total)  # every kind in both
    for kind, n in total.items():  # each kind's test share is 25% to the nearest instruction
        assert abs(kinds["test"][kind] - 0.25 * n) <= 0.5 or kinds["test"][kind] == 1, kind
    assert not {t[1] for t in split["test"]} & {t[1] for t in split["train"]}


def _plan_episode(env, task):
    """The scripted planner's episode on ``task``; its last StepResult."""
    obs, planner = env.reset(task), ScriptedPlanner(task)
    while True:
        r = env.step(planner.act(obs))
        if r.done:
            return r
        obs = r.observation


def test_scripted_planner_succeeds_on_95_percent_of_test_tasks():
    world = ManipulationWorld(ManipulationConfig(num_train=1, num_test=24, seed=3))
    env = ManipulationEnv()
    finals = [_plan_episode(env, task) for task in world.tasks("test")]
    env.close()
    wins = [r.info["success"] for r in finals]
    for r in finals:
        assert r.info["safety"] == {"knocked_off": 0, "contact_force": 0, "unreachable": 0}
    assert np.mean(wins) >= 0.95, wins


def test_wrong_plans_fail_and_errors_do_not_end_the_episode():
    world = ManipulationWorld(ManipulationConfig(num_train=30, num_test=1))
    task = next(t for t in world.tasks("train") if t.data["kind"] == "put")
    env = ManipulationEnv(max_steps=4)
    env.reset(task)
    r = env.step('Action : grasp ( object = " red block " )')  # not at it yet
    assert not r.done and r.info["failure_mode"] == "tool_error"
    r = env.step("Action : fly ( )")
    assert "unknown tool" in r.observation and not r.done
    r = env.step("Final : done")
    assert r.done and not r.info["success"] and r.info["failure_mode"] == "wrong_state"
    assert r.reward == 0.0


def test_the_suite_is_registered_with_its_vocabulary():
    from jaxagent.envs.registry import get_env_spec

    spec = get_env_spec("manipulation", {"num_train": 20, "num_test": 5})
    vocab = set(spec.vocabulary())
    env = spec.make_env()
    source = spec.make_source()
    for task in list(source.tasks("train"))[:3]:
        obs = env.reset(task)
        planner = spec.make_expert(task, 0.0, np.random.default_rng(0))
        texts = [obs]
        for _ in range(8):
            a = planner.act(obs)
            r = env.step(a)
            texts += [a, r.observation]
            obs = r.observation
            if r.done:
                break
        texts.append(env.look())
        missing = {w for t in texts for w in t.split()} - vocab
        assert not missing, missing


WIDE = dict(block_colours=6, cup_colours=4)


def test_wide_world_paints_slots_and_keeps_five_objects_on_the_table(scene):
    from jaxagent.envs.robot.manipulation.tasks import templates

    assert len({t[1] for t in templates()}) == 41  # the default world is unchanged
    assert len({t[1] for t in templates(6, 4)}) == 210
    world = ManipulationWorld(ManipulationConfig(num_train=60, num_test=20, **WIDE))
    check_disjoint_splits(world)
    words = {w for t in world.tasks("train") for w in t.prompt.split()}
    assert set(S.BLOCK_PALETTE) | set(S.CUP_PALETTE) <= words  # every colour is taught
    for task in world.tasks("train"):
        layout = task.data["layout"]
        assert sum(o.endswith(" block") for o in layout) == S.N_BLOCKS
        assert sum(o.endswith(" cup") for o in layout) == S.N_CUPS
        named = {a for step in task.data["plan"] for a in step[1:] if a in S.PALETTE_OBJECTS}
        assert named <= set(layout), (task.prompt, list(layout))
    # the slot that holds "purple block" is painted purple and is where the layout put it
    layout = {
        "purple block": (0.0, 0.0, 0.02),
        "black block": (0.1, -0.1, 0.02),
        "red block": (-0.1, 0.1, 0.02),
        "gray cup": (0.15, 0.1, 0.0),
        "pink cup": (-0.15, -0.1, 0.0),
    }
    scene.reset(layout)
    g = scene.model.body_geomadr[scene.body["purple block"]]
    np.testing.assert_allclose(scene.model.geom_rgba[g], [0.55, 0.2, 0.75, 1.0])
    np.testing.assert_allclose(scene.pos("gray cup")[:2], (0.15, 0.1), atol=1e-6)
    with pytest.raises(ValueError, match="3 distinct blocks and 2 cups"):
        scene.reset(dict(LAYOUT, **{"black block": (0.2, 0.2, 0.02)}))
    with pytest.raises(ValueError, match="block_colours=7 must lie in"):
        ManipulationConfig(block_colours=7)


def test_wide_world_planner_succeeds_and_absent_objects_are_the_agents_error():
    world = ManipulationWorld(ManipulationConfig(num_train=1, num_test=12, seed=5, **WIDE))
    env = ManipulationEnv()
    wins = [_plan_episode(env, task).info["success"] for task in world.tasks("test")]
    assert np.mean(wins) >= 11 / 12, wins
    task = world.tasks("test")[0]
    env.reset(task)
    absent = next(o for o in S.PALETTE_OBJECTS if o not in task.data["layout"])
    r = env.step(f'Action : move_to ( object = " {absent} " )')
    assert r.observation == f"Observation : error : {absent} is not on the table"
    from jaxagent.envs.robot.manipulation.vocab import vocabulary

    assert set(r.observation.split()) <= set(vocabulary())  # the word tokenizer reads it
    assert not r.done and r.info["failure_mode"] == "tool_error"
    env.close()
