"""Test-session set-up.

Eight simulated CPU devices for the sharding tests (must be set before JAX is imported),
float32 matmuls at full precision so parity tests compare like with like, and one persistent
compilation cache for the session.

Every test runs with its own empty temporary directory as the working directory, so the
relative defaults of the code under test (``train.out_dir: runs/{name}/seed{seed}``, logs
dropped in the cwd) land there and never in a user's real run directory. Tests that need the
repository's files name them from ``Path(__file__)``. After each test the checkout (and the
directory pytest was started from) is compared with its state at start-up: a test that wrote
into it fails at teardown, naming the paths.
"""

import atexit
import os
import re
import shutil
import stat
import sys
import tempfile
from pathlib import Path


def _selects_gpu(argv: list[str]) -> bool:
    """Whether the marker expression in effect (the last ``-m``, after the ini's
    ``-m 'not slow'``) selects the ``gpu`` tests: ``-m gpu``, ``-m "gpu and not slow"``."""
    expr = ""
    for i, arg in enumerate(argv):
        if arg == "-m" and i + 1 < len(argv):
            expr = argv[i + 1]
        elif arg.startswith("-m") and not arg.startswith("--"):
            expr = arg[2:].lstrip("=")
    return re.search(r"(?<!not )\bgpu\b", expr) is not None


# pytest-xdist's workers (scripts/test.sh runs one per core) inherit the environment the
# controller set here, so the choices below are made once, from the command line the user
# typed (a worker's own argv is not it).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
# Every test runs on 8 simulated CPU devices, whatever accelerator the machine has, except
# in a run that selects the gpu-marked tests: those need the real backend (a JAX_PLATFORMS
# the caller set is kept either way).
if _WORKER is None and not _selects_gpu(sys.argv):
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent XLA compilation cache for the test session and the CLI subprocesses its tests
# start (they inherit the environment): dozens of tests train the same tiny configs, and on a
# 2-core machine compiling the same programs again is most of their time. A directory the
# caller set is kept; the session's own is removed at exit.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _XLA_CACHE = tempfile.mkdtemp(prefix="jaxagent-tests-xla-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _XLA_CACHE
    atexit.register(shutil.rmtree, _XLA_CACHE, ignore_errors=True)
if _WORKER is not None:
    # One cache directory a worker: JAX writes an entry in place (no lock unless the cache
    # has a size limit), so a second process could read it half-written.
    _own = os.path.join(os.environ["JAX_COMPILATION_CACHE_DIR"], _WORKER)
    os.makedirs(_own, exist_ok=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _own
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

ROOT = Path(__file__).resolve().parent.parent
START_DIR = Path.cwd().resolve()
# Not watched: git's store, and the caches Python, pytest and ruff write as they run.
_CACHES = {".git", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache"}


def _walk(top: Path, recursive: bool) -> dict[str, tuple]:
    """{path: (kind, size, mtime)} under ``top``, caches and virtualenvs left out.

    Directories count by existence only: Python creating a ``__pycache__`` inside one
    changes its mtime without anything of interest having been written."""
    out = {}
    for dirpath, dirs, files in os.walk(top):
        dirs[:] = sorted(
            d
            for d in dirs
            if d not in _CACHES
            and not d.endswith(".egg-info")
            and not os.path.exists(os.path.join(dirpath, d, "pyvenv.cfg"))
        )
        for name in dirs:
            out[os.path.join(dirpath, name)] = ("dir",)
        for name in files:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:  # removed while we walked
                continue
            out[path] = (stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns)
        if not recursive:
            break
    return out


def _snapshot() -> dict[str, tuple]:
    """The checkout in full; a start directory outside it only at its top level and under
    ``runs/`` (walking, say, a home directory after every test would cost minutes)."""
    snap = _walk(ROOT, recursive=True)
    if START_DIR != ROOT and ROOT not in START_DIR.parents:
        snap.update(_walk(START_DIR, recursive=False))
        if (START_DIR / "runs").is_dir():
            snap.update(_walk(START_DIR / "runs", recursive=True))
    return snap


def _changes(before: dict, after: dict) -> list[str]:
    rows = [f"  new      {p}" for p in sorted(after.keys() - before.keys())]
    rows += [f"  removed  {p}" for p in sorted(before.keys() - after.keys())]
    rows += [
        f"  changed  {p}" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]
    ]
    return rows


_BASELINE = {}


def pytest_sessionstart(session):
    # after the plugins' own set-up (pytest-benchmark makes .benchmarks/ in the cwd then)
    _BASELINE["start"] = _BASELINE["last"] = _snapshot()


def _fresh_dir(tmp_path_factory, name: str) -> Path:
    """A new empty directory under ``<basetemp>/cwd/``."""
    parent = tmp_path_factory.getbasetemp() / "cwd"
    parent.mkdir(exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=parent))


@pytest.fixture(scope="session", autouse=True)
def _session_cwd(tmp_path_factory):
    """Module- and session-scoped fixtures are set up before the per-test directory exists:
    they run in a temporary directory of the session's."""
    old = os.getcwd()
    os.chdir(_fresh_dir(tmp_path_factory, "session"))
    yield
    os.chdir(old)


@pytest.fixture(autouse=True)
def _isolated_cwd(request, tmp_path_factory):
    """Runs the test inside a fresh temporary directory and fails it if it wrote into the
    checkout or the start directory."""
    cwd = _fresh_dir(tmp_path_factory, re.sub(r"\W", "_", request.node.name)[:40])
    old = os.getcwd()
    os.chdir(cwd)
    try:
        yield cwd
    finally:
        os.chdir(old)
    after = _snapshot()
    rows = _changes(_BASELINE.setdefault("last", after), after)
    _BASELINE["last"] = after  # blame each write once, on the test that made it
    if rows:
        pytest.fail(
            "this test wrote outside its temporary directories (tests must write only under "
            "tmp_path; files edited by hand while the tests ran show up here too):\n"
            + "\n".join(rows[:40]),
            pytrace=False,
        )


@pytest.fixture(scope="session")
def tiny_quickstart_run(tmp_path_factory):
    """One finished tiny quickstart run (``test_train.TINY``), trained as ``jaxagent train``
    trains it (the trainer closed at the end): (run dir, summary). Shared by the modules that
    only read or evaluate such a run (``tests/test_train.py``, ``tests/test_run_integrity.py``)
    so the same 4 iterations are not trained twice per session."""
    from test_train import TINY

    from jaxagent.train.config import load_config
    from jaxagent.train.trainer import Trainer

    run = tmp_path_factory.mktemp("tiny_quickstart") / "run"
    cfg = load_config(ROOT / "configs/quickstart.yaml", [*TINY, f"train.out_dir={run}"])
    trainer = Trainer(cfg, echo=lambda s: None)
    try:
        summary = trainer.run()
    finally:
        trainer.close()
    return run, summary


def pytest_sessionfinish(session, exitstatus):
    """The session as a whole (collection and module fixtures included) left the checkout and
    the start directory as it found them, or it fails."""
    if "start" not in _BASELINE:
        return
    rows = _changes(_BASELINE["start"], _snapshot())
    if rows:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        text = "the test session wrote outside its temporary directories:\n" + "\n".join(rows)
        if reporter is not None:
            reporter.write_sep("=", "writes outside the temporary directories", red=True)
            reporter.write_line(text)
        else:
            print(text)
        if session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
