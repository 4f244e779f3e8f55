"""DESIGN.md describes the code as it is: its folder map names every package and only
packages that exist, and every module or script it points to is there."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "DESIGN.md").read_text()


def _packages_in_tree() -> set[str]:
    return {
        str(p.parent.relative_to(ROOT))
        for p in (ROOT / "jaxagent").rglob("__init__.py")
        if "__pycache__" not in p.parts
    }


def _packages_in_map() -> set[str]:
    section = DOC.split("## Packages", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(jaxagent[\w/]*)` \|", section, flags=re.M))


def test_folder_map_matches_the_packages():
    in_tree, in_map = _packages_in_tree(), _packages_in_map()
    assert in_map - in_tree == set(), "DESIGN.md names packages that do not exist"
    assert in_tree - in_map == set(), "packages missing from DESIGN.md's folder map"


def test_every_module_and_script_named_exists():
    files = [
        str(p.relative_to(ROOT))
        for p in ROOT.rglob("*")
        if p.is_file() and ".git" not in p.parts and "__pycache__" not in p.parts
    ]
    named = set(re.findall(r"`([\w/.]+\.(?:py|sh))`", DOC))
    assert named, "the document names no module"
    missing = sorted(n for n in named if not any(f == n or f.endswith("/" + n) for f in files))
    assert missing == []
