"""``host_memory.limit_arenas``, which the trainer calls when it starts: the threads started
after it share two glibc malloc arenas instead of getting one each (up to 8 per core).

Each case runs in a fresh interpreter: glibc fixes its arena limit once per process, and the
count comes from ``malloc_info``, which lists every arena as one ``<heap nr=...>``.
"""

import ctypes.util
import platform
import subprocess
import sys

import pytest

COUNT_ARENAS = """
import ctypes, os, re, sys, tempfile, threading

if sys.argv[1] == "limit":
    from jaxagent.perf import host_memory

    assert host_memory.limit_arenas()

ready, go = threading.Barrier(9), threading.Event()


def worker():
    keep = [bytes(4096) for _ in range(64)]  # past pymalloc's 512 bytes: glibc malloc
    ready.wait()  # every worker holds its arena at once
    go.wait()


threads = [threading.Thread(target=worker) for _ in range(8)]
for t in threads:
    t.start()
ready.wait()
libc = ctypes.CDLL("libc.so.6")
libc.fopen.restype = ctypes.c_void_p
path = os.path.join(tempfile.mkdtemp(), "malloc_info.xml")
stream = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, ctypes.c_void_p(stream))
libc.fclose(ctypes.c_void_p(stream))
go.set()
print(len(re.findall("<heap nr=", open(path).read())))
"""


def _arenas(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", COUNT_ARENAS, mode], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(
    platform.system() != "Linux" or "libc.so" not in (ctypes.util.find_library("c") or ""),
    reason="glibc's mallopt and malloc_info",
)
def test_limit_arenas_makes_eight_threads_share_two_arenas():
    assert _arenas("limit") == 2
    # the same threads without the cap: one arena each, up to glibc's 8 per core
    assert _arenas("default") > 2
