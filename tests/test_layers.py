"""The import structure, read from the source: packages import downward only, no two modules
import each other (directly or round a loop), and the host-side packages never import JAX.

A violation is named with its file, line and the rule it breaks, so a new module that reaches
upward fails here rather than surfacing later as an import cycle or a JAX import in a pool
worker process.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1] / "jaxagent"

# What each package may import (besides itself). The floors, bottom up: shared records and
# errors; models, reporting and measurement; environments and the device layout; the pool,
# the RL maths and the sampler; the agent driver; the policy server; the trainers; the
# command line.
_BASE = {"errors", "types", "buckets", "sections"}
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "types": set(),
    "buckets": set(),
    "sections": {"errors"},
    "eval": {"errors"},
    "perf": {"errors"},
    "models": _BASE | {"perf"},
    "envs": _BASE | {"eval"},
    "parallel": _BASE | {"models", "perf"},
    "pool": _BASE | {"envs"},
    "rl": _BASE | {"models", "parallel", "perf"},
    "generate": _BASE | {"models", "parallel", "perf"},
    "agents": _BASE | {"envs", "eval", "generate", "models", "parallel", "perf", "pool"},
    "train": _BASE
    | {"agents", "envs", "eval", "generate", "models", "parallel", "perf", "pool", "rl", "serve"},
    "learners": _BASE | {"envs", "eval", "models", "parallel", "perf", "pool", "rl", "train"},
    "serve": _BASE | {"agents", "envs", "eval", "generate", "models", "parallel", "perf", "pool"},
    "cli": _BASE
    | {"agents", "envs", "eval", "generate", "learners", "models", "parallel", "perf"}
    | {"pool", "rl", "serve", "train"},
}
# Environments run in pool worker processes and the pool's host loop never touches a device:
# neither imports JAX.
NO_JAX = ("envs", "pool")


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _package(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def _targets(node: ast.AST, module: str, path: pathlib.Path) -> list[str]:
    """The jaxagent modules one import statement names (``from pkg import sub`` -> pkg.sub)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "jaxagent"]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative import
        anchor = module.split(".")
        if path.name != "__init__.py":
            anchor = anchor[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
    if base.split(".")[0] != "jaxagent":
        return []
    subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
    return subs or [base]


def _imports(top_level_only: bool):
    """(module, line, imported module) for every jaxagent import; with ``top_level_only`` only
    the statements that run when the module is imported (no function bodies, no
    ``if TYPE_CHECKING`` blocks)."""
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        if top_level_only:
            nodes = []
            for stmt in tree.body:
                if isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.unparse(stmt.test):
                    continue
                nodes.extend(ast.walk(stmt) if isinstance(stmt, (ast.If, ast.Try)) else [stmt])
        else:
            nodes = ast.walk(tree)
        for node in nodes:
            for target in _targets(node, module, path):
                yield module, node.lineno, target


def _upward() -> list[str]:
    wrong = []
    for module, line, target in _imports(top_level_only=False):
        src, dst = _package(module), _package(target)
        if src == dst or dst == "jaxagent":
            continue
        assert src in ALLOWED, f"{module}: package {src!r} has no floor in ALLOWED; add it"
        if dst not in ALLOWED[src]:
            wrong.append(f"{MODULES[module].name} ({module}):{line}: {src} -> {dst}")
    return sorted(wrong)


def test_packages_import_downward_only():
    wrong = _upward()
    assert not wrong, "imports against the floors:\n" + "\n".join(wrong)


def test_no_import_cycles():
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for module, _, target in _imports(top_level_only=True):
        if target in MODULES and target != module:
            edges[module].add(target)
    # Tarjan's strongly connected components, iteratively (deep package trees).
    index, low, on_stack, stack, cycles, counter = {}, {}, set(), [], [], [0]

    def visit(root):
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))

    for module in sorted(MODULES):
        if module not in index:
            visit(module)
    assert not cycles, f"import cycles: {cycles}"


def test_host_side_packages_never_import_jax():
    wrong = []
    for module, path in MODULES.items():
        if _package(module) not in NO_JAX:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            for name in names:
                if name.split(".")[0] in ("jax", "flax", "optax", "orbax"):
                    wrong.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: {name}")
    assert not wrong, "JAX imported on the host side:\n" + "\n".join(wrong)


def test_the_rules_catch_an_upward_import(tmp_path, monkeypatch):
    """The checker itself: an environment module importing the pool is reported."""
    fake = tmp_path / "upward.py"
    fake.write_text("import os\n\n\ndef f():\n    from jaxagent.pool import EnvPool\n")
    monkeypatch.setitem(MODULES, "jaxagent.envs.upward", fake)
    assert [w for w in _upward() if "jaxagent.envs.upward" in w] == [
        "upward.py (jaxagent.envs.upward):5: envs -> pool"
    ]
