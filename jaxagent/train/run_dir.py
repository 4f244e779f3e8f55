"""A run directory's integrity: one writer at a time, a resume only where the checkpoints can
honour the command's settings, and files replaced whole.

A run directory (``train.out_dir``) holds ``config.yaml``, ``tokenizer/``, ``checkpoints/``,
``metrics.jsonl``, ``tb/`` and ``summary.json``. Three rules keep a finished run usable:

- **One writer.** ``RunLock`` holds an advisory ``flock`` on ``<run_dir>/train.lock`` for the
  life of a training; the file names the holder's pid and host. A second training into the
  same directory is refused in one line; a lock whose holder died (its ``flock`` went with it)
  is taken over, so a killed run never has to be unlocked by hand.
- **A resume keeps its settings.** ``check_resume`` compares the command's config with the one
  the checkpoints were trained with and refuses, naming the setting, a change they cannot
  honour (shapes, data, the recipe); settings of the loop itself (``train.iterations`` to
  extend a run, checkpoint cadence, logging, the pool's size and backend, guards, the mesh)
  may change.
- **Nothing is written before every input is checked**, and what is rewritten is written to
  a temporary file and renamed over the old one (``write_atomic``), so a failed or killed
  command leaves the old file whole.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from pathlib import Path
from typing import Any, Iterator, Optional

from jaxagent.errors import ConfigError

LOCK_NAME = "train.lock"

# Settings a resume may change (dotted prefixes): they steer the loop, logging, the pool or
# the device layout, never what the checkpoints hold or the data they were trained on.
RESUMABLE = (
    "name",
    "paper",
    "train.iterations",
    "train.out_dir",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "train.checkpoint_dir",
    "train.resume",
    "train.progress",
    "train.tensorboard",
    "train.wandb",
    "train.plot",
    "train.release_compiled",
    "eval.every",
    "env.pool.",
    "env.faults.",
    "guards.",
    "mesh.",
    "distributed.",
)


class RunLocked(ConfigError):
    """Another live process is training into this run directory."""


def _alive_here(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


class RunLock:
    """An exclusive, advisory lock on a run directory (``acquire`` / ``release``).

    ``flock`` goes away with its process however it dies, so a lock file left by a killed run
    is stale by construction and is taken over; the pid and host written into the file are
    for the message a refused second writer prints.
    """

    def __init__(self, run_dir: Path, fd: int, created_dir: bool):
        self.run_dir, self._fd, self.created_dir = run_dir, fd, created_dir

    @classmethod
    def acquire(cls, run_dir: str | Path) -> "RunLock":
        run_dir = Path(run_dir)
        created = not run_dir.exists()
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / LOCK_NAME
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise RunLocked(
                    f"train.out_dir={str(run_dir)!r} is being trained by another process "
                    f"({holder}); wait for it to finish or stop it, or choose another "
                    "train.out_dir"
                ) from None
            # The holder may have released (unlinked) the file between our open and flock:
            # then we locked an orphan inode and must start over on the path's new file.
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        record = {"pid": os.getpid(), "host": socket.gethostname()}
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps(record) + "\n").encode())
        return cls(run_dir, fd, created)

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.unlink(self.run_dir / LOCK_NAME)
        except FileNotFoundError:
            pass
        os.close(self._fd)
        self._fd = None

    def abandon(self) -> None:
        """Release after a command failed before writing anything: a directory this command
        created (holding nothing but the lock) is removed again."""
        self.release()
        if self.created_dir:
            try:
                self.run_dir.rmdir()
            except OSError:
                pass


def _read_holder(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        record = json.loads(os.read(fd, 4096).decode() or "{}")
    except (OSError, ValueError):
        record = {}
    pid, host = record.get("pid"), record.get("host")
    if pid is None:
        return "pid unknown"
    here = host == socket.gethostname()
    state = "" if not here or _alive_here(int(pid)) else ", not running"
    return f"pid {pid} on {host}{state}"


def flat(tree: Any, prefix: str = "") -> dict:
    """A nested dict as ``{dotted.key: leaf}`` (an empty mapping is a leaf)."""
    if isinstance(tree, dict):
        out = {}
        for k, v in tree.items():
            out.update(flat(v, f"{prefix}{k}."))
        return out if tree or not prefix else {prefix[:-1]: {}}
    return {prefix[:-1]: tree}


def changed_settings(saved: dict, new: dict) -> list[tuple[str, Any, Any]]:
    """(key, saved value, new value) for every setting that differs and a resume cannot
    change (``RESUMABLE``), in key order."""
    a, b = flat(saved), flat(new)
    keys = sorted(set(a) | set(b))
    return [
        (k, a.get(k), b.get(k))
        for k in keys
        if a.get(k) != b.get(k) and not k.startswith(RESUMABLE)
    ]


def check_resume(config_dict: dict, saved_dict: dict, run_dir: Path) -> None:
    """Refuse, in one line naming the settings, a resume whose config differs from the one
    the run's checkpoints were trained with (``<run_dir>/config.yaml``) where they cannot
    honour it."""
    changed = changed_settings(saved_dict, config_dict)
    if not changed:
        return
    shown = "; ".join(f"{k}: {old!r} -> {new!r}" for k, old, new in changed[:4])
    more = f" (and {len(changed) - 4} more)" if len(changed) > 4 else ""
    raise ConfigError(
        f"train.out_dir={str(run_dir)!r} holds a run whose checkpoints were trained with other "
        f"settings ({shown}{more}; saved in {str(run_dir / 'config.yaml')!r}), which a resume "
        "cannot honour: drop those overrides to continue that run, or choose another "
        "train.out_dir"
    )


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` whole: a temporary file renamed over it, so a crash
    leaves either the old or the new content, never a mix."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def saved_config(run_dir: Path) -> Optional[dict]:
    """The run's own config as a dict (None when the directory has none yet)."""
    from jaxagent.train.config import config_to_dict, load_config

    path = run_dir / "config.yaml"
    if not path.is_file():
        return None
    return config_to_dict(load_config(path))


@contextlib.contextmanager
def learner_run(run_dir: Path, config_yaml: str) -> Iterator[Path]:
    """The run directory of a learner that trains from scratch each time (the classic
    learners: no checkpoints to resume from): held under ``RunLock`` for the training's
    life, and a finished run (``summary.json``) trained with other settings is refused, not
    overwritten. The same settings again repeat the run in place. ``config.yaml`` is written
    (atomically) once the lock is held and the directory checked."""
    run_dir = Path(run_dir)
    lock = RunLock.acquire(run_dir)
    try:
        saved = run_dir / "config.yaml"
        if (run_dir / "summary.json").is_file() and saved.is_file():
            import yaml

            old = yaml.safe_load(saved.read_text()) or {}
            a, b = flat(old), flat(yaml.safe_load(config_yaml) or {})  # same types
            changed = [
                (k, a.get(k), b.get(k))
                for k in sorted(set(a) | set(b))
                if a.get(k) != b.get(k) and k not in ("train.out_dir", "train.plot")
            ]
            if changed:
                shown = "; ".join(f"{k}: {x!r} -> {y!r}" for k, x, y in changed[:4])
                more = f" (and {len(changed) - 4} more)" if len(changed) > 4 else ""
                raise ConfigError(
                    f"train.out_dir={str(run_dir)!r} holds a finished run trained with other "
                    f"settings ({shown}{more}); this learner trains from scratch, so it would "
                    "be overwritten: choose another train.out_dir"
                )
        write_atomic(saved, config_yaml)
    except BaseException:
        lock.abandon()
        raise
    try:
        yield run_dir
    finally:
        lock.release()
