"""Language-driven tabletop manipulation: an LM calls skills (look, move_to, grasp, place,
pour, push) that scripted controllers execute in MuJoCo; rewards and safety violations are
read from the simulated state. ``scene.py`` (MJCF), ``skills.py`` (controllers, safety),
``tasks.py`` (instructions, plans, sub-goals, splits), ``env.py`` (the text env and
``render_frame``), ``planner.py`` (scripted planner), ``suite.py`` (registry: manipulation).
"""
