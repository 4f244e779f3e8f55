"""Test harness that keeps the grading out of the candidate's reach (stdlib only).

A problem's tests (HumanEval's ``check(candidate)`` or a generated suite in the same format)
are split on the host into *units*: top-level statements of ``check`` that contain an
``assert``. Inside the sandbox two processes cooperate:

* the **candidate** process (unprivileged uid ``C``) executes the solution and then serves
  calls: it receives pickled ``(args, kwargs)`` and answers with the pickled return value;
* the **harness** process (a different unprivileged uid ``H``) executes the test code with
  ``candidate`` bound to a stub that forwards each call over the pipes.

The candidate never holds the test source, the expected values or the result channel, so
exiting early with status 0, patching ``check`` / ``assert`` / builtins, printing fake
results, or returning an object whose ``__eq__`` is always true cannot make a unit pass:
return values are decoded by an unpickler that accepts builtin data types only, and the
comparison runs in the harness. A unit passes only when the harness itself records it.
"""

from __future__ import annotations

import ast
import io
import os
import pickle
import select
import struct
import time

MAX_FRAME = 64 << 20  # bytes; a larger reply counts as a failure
_HEADER = struct.Struct("<Q")


# ----------------------------------------------------------------------------- host side


class _Calls(ast.NodeVisitor):
    """Collects ``candidate(...)`` calls in evaluation order; ``ok`` stays True only if every
    call has literal arguments and is evaluated exactly once, in order (no loop, comprehension,
    lambda, nested function or conditional expression around it)."""

    def __init__(self, names):
        self.names, self.calls, self.ok = names, [], True

    def visit_Call(self, node):
        if isinstance(node.func, ast.Name) and node.func.id in self.names:
            try:
                args = tuple(ast.literal_eval(a) for a in node.args)
                kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
                if len(kwargs) != len(node.keywords):
                    raise ValueError("**kwargs")
                self.calls.append((args, kwargs))
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                self.ok = False
            return
        self.generic_visit(node)

    def _dynamic(self, node):
        before = len(self.calls)
        ok = self.ok
        self.generic_visit(node)
        if len(self.calls) != before or self.ok != ok:
            self.ok = False

    visit_For = visit_While = visit_ListComp = visit_SetComp = visit_DictComp = _dynamic
    visit_GeneratorExp = visit_Lambda = visit_FunctionDef = visit_IfExp = visit_If = _dynamic
    visit_Try = visit_With = _dynamic


def split_check(
    test_source: str, check_name: str = "check", entry_point: str | None = None
) -> dict:
    """Splits HumanEval-style test code into setup and independently scored units.

    Args:
      test_source: module source defining ``def check(candidate): ...`` (plus any helpers).
      check_name: name of the checking function.

    Returns:
      dict with ``module`` (the source minus ``check``), ``units``: list of
      ``(is_test, source)`` in order, where ``is_test`` is True for statements containing an
      ``assert`` whose test is not a constant (``assert True`` scores nothing), and ``calls``:
      the ``(args, kwargs)`` of every call to the candidate in evaluation order when all of
      them have literal arguments and run unconditionally (sent to the candidate ahead of
      time, saving a round trip per call), else None.
    """
    tree = ast.parse(test_source)
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == check_name]
    if len(checks) != 1:
        raise ValueError(
            f"test_source must define exactly one `def {check_name}(candidate)`; found "
            f"{len(checks)}: write the tests as asserts inside `def {check_name}(candidate):`"
        )
    check = checks[0]
    if [a.arg for a in check.args.args] != ["candidate"]:
        raise ValueError(
            f"`{check_name}` must take exactly one argument named `candidate`, got "
            f"{[a.arg for a in check.args.args]}"
        )
    module = ast.Module([n for n in tree.body if n is not check], type_ignores=[])
    units = []
    for stmt in check.body:
        asserts = [n for n in ast.walk(stmt) if isinstance(n, ast.Assert)]
        is_test = any(not isinstance(a.test, ast.Constant) for a in asserts)
        units.append((is_test, ast.unparse(stmt)))
    if not any(is_test for is_test, _ in units):
        raise ValueError(f"`{check_name}` contains no assert on the candidate: nothing to score")
    visitor = _Calls({"candidate", entry_point} - {None})
    for stmt in check.body:
        visitor.visit(stmt)
    calls = visitor.calls if visitor.ok and visitor.calls else None
    return {"module": ast.unparse(module), "units": units, "calls": calls}


def compile_spec(spec: dict, prelude: str) -> dict:
    """Adds ``code``: the marshalled code objects of prelude, module and units (compiled on
    the host once per problem, so the harness only executes them)."""
    import marshal

    codes = [
        compile(prelude, "<prompt>", "exec"),
        compile(spec["module"], "<tests>", "exec"),
        [compile(src, "<test>", "exec") for _, src in spec["units"]],
    ]
    return {**spec, "code": marshal.dumps(codes)}


# ----------------------------------------------------------------------------- framing


def send_frame(fd: int, payload: bytes) -> None:
    data = _HEADER.pack(len(payload)) + payload
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError("no reply from the candidate before the deadline")
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv_frame(fd: int, deadline: float | None = None) -> bytes | None:
    """Returns the next frame, None on EOF; raises TimeoutError / ValueError (oversize)."""
    head = _read_exact(fd, _HEADER.size, deadline)
    if head is None:
        return None
    (size,) = _HEADER.unpack(head)
    if size > MAX_FRAME:
        raise ValueError(f"reply of {size} bytes exceeds the {MAX_FRAME}-byte limit")
    return _read_exact(fd, size, deadline)


class _PlainUnpickler(pickle.Unpickler):
    """Decodes builtin data only: no class can be named except a few builtin containers."""

    _ALLOWED = {
        ("builtins", "complex"),
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("builtins", "bytearray"),
        ("builtins", "range"),
        ("builtins", "slice"),
    }

    def find_class(self, module, name):
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"return value of type {module}.{name} is not plain data")


def loads_plain(data: bytes):
    return _PlainUnpickler(io.BytesIO(data)).load()


# ----------------------------------------------------------------------------- candidate


def serve(code: str, path: str, entry_point: str, req_fd: int, rep_fd: int) -> None:
    """Runs in the candidate process: load the solution, then answer calls until EOF."""
    import traceback

    ns = {"__name__": "solution", "__file__": path}
    try:
        exec(compile(code, path, "exec"), ns)
        fn = ns[entry_point]
        if not callable(fn):
            raise TypeError(f"{entry_point} is not callable")
        ready = ("ready",)
    except BaseException as e:  # noqa: BLE001 - anything the solution raises is its failure
        tb = traceback.format_exception(type(e), e, e.__traceback__.tb_next)  # not serve()
        ready = ("load_error", type(e).__name__, "".join(tb[-6:])[-2000:])
        send_frame(rep_fd, pickle.dumps(ready, 5))
        return
    send_frame(rep_fd, pickle.dumps(ready, 5))
    while True:
        msg = recv_frame(req_fd)
        if msg is None:
            return
        calls = pickle.loads(msg)  # a list: several calls sent ahead, answered one by one
        for args, kwargs in calls:
            try:
                out = fn(*args, **kwargs)
                try:
                    payload = pickle.dumps(("ok", out), 5)
                except Exception as e:  # noqa: BLE001
                    payload = pickle.dumps(("raise", "TypeError", f"unserialisable return: {e}"), 5)
            except BaseException as e:  # noqa: BLE001
                payload = pickle.dumps(("raise", type(e).__name__, str(e)[:500]), 5)
            send_frame(rep_fd, payload)


# ----------------------------------------------------------------------------- harness


class CandidateError(Exception):
    """The candidate raised (or returned non-plain data); carries its exception name."""


class CandidateGone(Exception):
    """The candidate process exited or broke the protocol."""


class _Stub:
    def __init__(self, req_fd, rep_fd, deadline, call_timeout=None):
        self.req_fd, self.rep_fd, self.deadline = req_fd, rep_fd, deadline
        self.call_timeout = call_timeout
        self.last = None
        self.memory = False
        self.ahead = []  # pickled (args, kwargs) of calls sent ahead, not yet consumed

    def send_ahead(self, calls):
        if calls:
            self._send(calls)
            self.ahead = [pickle.dumps(c, 5) for c in calls]

    def _send(self, calls):
        try:
            send_frame(self.req_fd, pickle.dumps(calls, 5))
        except BrokenPipeError:
            raise CandidateGone("the candidate process exited") from None

    def _recv(self):
        deadline = self.deadline
        if self.call_timeout is not None:
            deadline = min(deadline, time.monotonic() + self.call_timeout)
        try:
            data = recv_frame(self.rep_fd, deadline)
        except ValueError as e:
            raise CandidateGone(str(e)) from None
        if data is None:
            raise CandidateGone("the candidate process exited during a call")
        return data

    def __call__(self, *args, **kwargs):
        call = ", ".join(
            [repr(a)[:80] for a in args] + [f"{k}={v!r}"[:80] for k, v in kwargs.items()]
        )
        key = pickle.dumps((args, kwargs), 5)
        # A call sent ahead answers in order; calls the test skipped (short-circuit) are
        # read and dropped. Anything else is asked live once the ahead answers are drained.
        hit = self.ahead.index(key) if key in self.ahead else None
        skip = hit if hit is not None else len(self.ahead)
        for _ in range(skip):
            self._recv()
        self.ahead = self.ahead[skip + 1 :] if hit is not None else []
        if hit is None:
            self._send([(args, kwargs)])
        data = self._recv()
        try:
            reply = loads_plain(data)
        except Exception as e:  # noqa: BLE001 - malformed or non-plain reply
            self.last = f"candidate({call}) -> <rejected: {e}>"
            raise CandidateError(f"TypeError: {e}") from None
        if not (
            isinstance(reply, tuple)
            and (
                (len(reply) == 2 and reply[0] == "ok")
                or (
                    len(reply) == 3
                    and reply[0] == "raise"
                    and all(isinstance(x, str) for x in reply[1:])
                )
            )
        ):
            raise CandidateGone("the candidate broke the reply protocol")
        if reply[0] == "raise":  # texts the candidate chose: shortened before any use
            name, text = reply[1][:100], reply[2][:500]
            self.memory |= name == "MemoryError"
            self.last = f"candidate({call}) raised {name}: {text}"
            raise CandidateError(f"{name}: {text}")
        self.last = f"candidate({call}) -> {repr(reply[1])[:200]}"
        return reply[1]


def _await_ready(rep_fd: int, deadline: float):
    """The candidate's first frame: ("ready",), ("load_error", name, text), or None (EOF)."""
    first = recv_frame(rep_fd, deadline)
    return loads_plain(first) if first is not None else None


def run_units(
    spec: dict, req_fd: int, rep_fd: int, deadline: float, call_timeout=None, respawn=None
) -> dict:
    """Runs in the harness process: score every unit against the remote candidate.

    ``call_timeout`` (seconds, optional) bounds each call; when one is exceeded and
    ``respawn`` is given, ``respawn()`` returns the pipes of a fresh candidate (the sandbox
    kills the stuck one) and the remaining units run against it, so one slow test does not
    fail the tests after it.

    Returns a dict: ``units`` (list of {src, ok, error}), ``load_error``, ``timed_out``,
    ``memory``, ``crashed`` (candidate process gone), ``harness_error``.
    """
    report = {
        "units": [],
        "load_error": None,
        "timed_out": False,
        "memory": False,
        "crashed": False,
        "harness_error": None,
    }
    tests = [src for is_test, src in spec["units"] if is_test]
    stop = None
    try:
        ready = _await_ready(rep_fd, deadline)
    except TimeoutError:
        ready, report["timed_out"] = None, True
    except Exception as e:  # noqa: BLE001 - oversize or non-plain: the candidate's doing
        ready = ("load_error", "ProtocolError", str(e))
    if ready is not None and not (
        ready == ("ready",)
        or (
            isinstance(ready, tuple)
            and len(ready) == 3
            and ready[0] == "load_error"
            and all(isinstance(x, str) for x in ready[1:])
        )
    ):
        ready = ("load_error", "ProtocolError", "the candidate broke the harness protocol")
        report["crashed"] = True
    if ready != ("ready",):
        if ready is None and not report["timed_out"]:
            report["crashed"] = True
        reason = (
            "timeout while loading"
            if report["timed_out"]
            # the candidate can send any frame here: its texts are capped, so no load
            # error can overflow the report (which would read as a sandbox error)
            else (
                f"{ready[1][:100]}: {ready[2][:2000]}"
                if ready
                else "the candidate process exited while loading"
            )
        )
        report["load_error"] = reason
        report["memory"] = bool(ready) and ready[1] == "MemoryError"
        report["units"] = [{"src": s, "ok": False, "error": reason} for s in tests]
        return report
    import marshal

    ns = {"__name__": "__harness__"}
    prelude_code, module_code, unit_codes = marshal.loads(spec["code"])
    stub = _Stub(req_fd, rep_fd, deadline, call_timeout)
    try:
        stub.send_ahead(spec.get("calls"))
    except CandidateGone as e:
        report["crashed"] = True
        stop = f"not run: {e}"
    try:
        exec(prelude_code, ns)
        exec(module_code, ns)
    except Exception as e:  # noqa: BLE001 - broken task data, not the candidate's fault
        report["harness_error"] = f"test setup failed: {type(e).__name__}: {e}"
        stop = report["harness_error"]
    # HumanEval tests sometimes call the solution by its own name, not via `candidate`.
    ns["candidate"] = ns[spec["entry_point"]] = stub
    for (is_test, src), code in zip(spec["units"], unit_codes):
        if stop is not None:
            if is_test:
                report["units"].append({"src": src, "ok": False, "error": stop})
            continue
        stub.last = None
        try:
            exec(code, ns)
            error = None
        except TimeoutError:
            report["timed_out"], error = True, "timeout: the candidate did not answer in time"
            stop = "not run: an earlier call timed out"
            if respawn is not None and call_timeout is not None and time.monotonic() < deadline:
                try:  # a fresh candidate for the remaining units
                    stub.req_fd, stub.rep_fd = respawn()
                    stub.ahead = []
                    if _await_ready(stub.rep_fd, deadline) == ("ready",):
                        stop = None
                except Exception:  # noqa: BLE001 - no fresh candidate: the rest stays unrun
                    pass
        except CandidateGone as e:
            report["crashed"], error = True, f"candidate process died: {e}"
            stop = "not run: the candidate process died"
        except AssertionError as e:
            error = "AssertionError" + (f": {e}" if str(e) else "")
        except Exception as e:  # noqa: BLE001 - candidate errors surface as any exception
            error = f"{type(e).__name__}: {e}"
        if error is not None and stub.last:
            error += f" (last call: {stub.last})"
        if is_test:
            report["units"].append({"src": src, "ok": error is None, "error": error})
        elif error is not None and stop is None:
            stop = f"not run: setup statement failed: {error}"
    report["memory"] = stub.memory
    return report
