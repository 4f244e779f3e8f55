"""The figure tables of docs/results/*.md equal what scripts/results_tables.py renders from
the committed raw records, and every record says how to reproduce it."""

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load():
    spec = importlib.util.spec_from_file_location(
        "results_tables", ROOT / "scripts" / "results_tables.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


T = _load()


def test_committed_tables_equal_their_records():
    assert T.check() == []


def test_a_figure_edited_without_its_record_fails(tmp_path, monkeypatch):
    results = tmp_path / "results"
    shutil.copytree(ROOT / "docs" / "results", results)
    monkeypatch.setattr(T, "RESULTS", results)
    monkeypatch.setattr(T, "PAGES", {})  # the whole-page reports: their own test below
    assert T.check() == []
    page = results / "dqn_dialogue.md"
    text = page.read_text()
    assert "0.589 [0.548, 0.630]" in text  # the claim, rendered from the per-seed record
    page.write_text(text.replace("0.589 [0.548, 0.630]", "0.599 [0.548, 0.630]", 1))
    assert T.check() == ["dqn_dialogue.md: table dqn_recipes differs from its records"]
    # the record changes, the page does not: fails too; regenerating repairs it
    page.write_text(text)
    rec = results / "quickstart.jsonl"
    lines = rec.read_text().replace('"after": 0.78,', '"after": 0.79,', 1)
    rec.write_text(lines)
    assert sorted(T.check()) == [  # async_training's synchronous row reads the same records
        "async_training.md: table async_learning differs from its records",
        "quickstart.md: table quickstart_seeds differs from its records",
    ]
    assert T.main([]) == 0
    assert T.check() == []
    assert "| 0 | 0.375 | 0.790 | +41.5 |" in (results / "quickstart.md").read_text()


def test_a_missing_or_unknown_block_is_reported(tmp_path, monkeypatch):
    results = tmp_path / "results"
    shutil.copytree(ROOT / "docs" / "results", results)
    monkeypatch.setattr(T, "RESULTS", results)
    page = results / "serve.md"
    text = page.read_text()
    page.write_text(text.replace("table:harness_quickstart_seeds", "table:harness_seeds"))
    assert sorted(T.check()) == [
        "serve.md: no <!-- table:harness_quickstart_seeds --> block",
        "serve.md: unknown table harness_seeds",
    ]


@pytest.mark.parametrize(
    "name", sorted({p.name for p in (ROOT / "docs" / "results").glob("*.jsonl")})
)
def test_tabled_records_carry_command_commit_machine_and_seed(name):
    for line in (ROOT / "docs" / "results" / name).read_text().splitlines():
        r = json.loads(line)
        if "table" not in r:
            continue
        for key in ("command", "commit", "machine", "seed", "figures"):
            assert key in r, f"{name}: a {r['table']} record has no {key!r}"
        assert r["command"] and r["machine"]
        if "recovered_from" in r:  # reconstructed from a published page, not re-run
            assert re.fullmatch(r"[\w./-]+\.(md|jsonl)@[0-9a-f]{7,40}", r["recovered_from"])


def test_a_page_written_whole_by_its_runner_is_checked_too(tmp_path, monkeypatch):
    results = tmp_path / "results"
    shutil.copytree(ROOT / "docs" / "results", results)
    monkeypatch.setattr(T, "RESULTS", results)
    page = results / "configs.md"
    text = page.read_text()
    assert "+26.0 ± 16.5" in text
    page.write_text(text.replace("+26.0 ± 16.5", "+27.0 ± 16.5"))
    assert T.check() == ["configs.md differs from its records (its runner's --report)"]
