"""tests/conftest.py keeps the suite out of the checkout: each test runs in its own temporary
working directory, and a test that writes into the checkout anyway fails at teardown, naming
the path. Checked on a throwaway checkout (a copy of the conftest and a few tests) run by a
child pytest, so the real checkout is never written to."""

import shutil
import subprocess
import sys
from pathlib import Path

CHILD_TESTS = """
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def module_output():
    # module fixtures are set up before the per-test directory: they get the session's
    Path("module-fixture.txt").write_text("m")


def test_relative_default_lands_in_tmp(module_output):
    # what `jaxagent train` does with its default train.out_dir
    Path("runs/quickstart/seed0").mkdir(parents=True)
    Path("runs/quickstart/seed0/config.yaml").write_text("a test's config")
    assert CHECKOUT not in Path.cwd().parents


def test_write_into_checkout():
    (CHECKOUT / "runs/quickstart/seed0/config.yaml").write_text("a test's config")


def test_after_the_offender_is_not_blamed():
    pass


@pytest.fixture(scope="module")
def writes_when_torn_down():
    yield
    (CHECKOUT / "late.txt").write_text("after every test had passed its own check")


def test_last_of_the_module(writes_when_torn_down):
    pass
"""


def _run_child(tmp_path: Path, *args: str) -> tuple[int, str]:
    # its own basetemp: the child must not prune or share this session's temporary dirs
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    cmd += [f"--basetemp={tmp_path / 'child-tmp'}", "tests", *args]
    proc = subprocess.run(
        cmd, cwd=tmp_path / "checkout", capture_output=True, text=True, timeout=300
    )
    return proc.returncode, proc.stdout + proc.stderr


def _child_checkout(tmp_path: Path) -> Path:
    repo = tmp_path / "checkout"
    (repo / "tests").mkdir(parents=True)
    shutil.copy(Path(__file__).with_name("conftest.py"), repo / "tests/conftest.py")
    (repo / "tests/test_child.py").write_text(CHILD_TESTS)
    (repo / "runs/quickstart/seed0").mkdir(parents=True)
    (repo / "runs/quickstart/seed0/sentinel.txt").write_text("a user's trained run")
    return repo


def test_relative_writes_land_in_tmp_and_checkout_writes_fail(tmp_path):
    repo = _child_checkout(tmp_path)
    rc, out = _run_child(tmp_path, "-k", "not last_of_the_module")
    assert rc == 1, out
    # the offender's own call passes; its teardown check is the error
    assert "3 passed, 1 deselected, 1 error" in out, out
    assert "ERROR tests/test_child.py::test_write_into_checkout" in out, out
    assert f"new      {repo}/runs/quickstart/seed0/config.yaml" in out, out
    # the session's own check repeats it at the end, for writes no single test owns
    assert "writes outside the temporary directories" in out, out
    # only the offending test's write reached the checkout; the relative ones went to tmp
    files = sorted(str(p.relative_to(repo)) for p in repo.rglob("*") if p.is_file())
    assert [f for f in files if "__pycache__" not in f] == [
        "runs/quickstart/seed0/config.yaml",
        "runs/quickstart/seed0/sentinel.txt",
        "tests/conftest.py",
        "tests/test_child.py",
    ]
    assert (repo / "runs/quickstart/seed0/sentinel.txt").read_text() == "a user's trained run"
    # each test in a directory of its own, module fixtures in the session's
    cwds = tmp_path / "child-tmp/cwd"
    assert len(list(cwds.glob("test_relative_default*/runs/quickstart/seed0/*"))) == 1
    assert len(list(cwds.glob("session-*/module-fixture.txt"))) == 1


def test_a_clean_child_session_passes(tmp_path):
    _child_checkout(tmp_path)
    rc, out = _run_child(tmp_path, "-k", "not write_into_checkout and not last_of_the_module")
    assert rc == 0, out
    assert "2 passed" in out and "writes outside" not in out, out


def test_a_write_no_single_test_owns_fails_the_session(tmp_path):
    repo = _child_checkout(tmp_path)
    rc, out = _run_child(tmp_path, "-k", "not write_into_checkout")
    assert rc == 1, out
    assert "3 passed, 1 deselected in" in out, out  # every test's own check passed
    assert "writes outside the temporary directories" in out, out
    assert f"new      {repo}/late.txt" in out, out
