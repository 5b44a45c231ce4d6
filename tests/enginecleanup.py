"""Owns what the test engines leave on the host: run folders and locks, and removing a run's every trace.

A run is a folder ROOT/<run> holding an flock for the life of the test process. Everything of the run is
named after it: namespaces and cgroup parents PREFIX<run>-<i>, host veth ends VETH<run><i>h, and every
process of the run (dockerd, its containerd and shims, sshd) has the folder in its command line, except
the containers' own processes, which live in the run's cgroups. A run whose folder is not locked is dead.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import netns

ROOT = Path("/run/saigeedged-enginehosts")
PREFIX = "saigeedged-eh-"
VETH = "seh"  # interface names are 15 characters at most
CGROUP = Path("/sys/fs/cgroup")
KILL_ROUNDS = 100


@contextlib.contextmanager
def allocation() -> Iterator[None]:
    """Serialises run creation, address picking and stale removal between concurrent test processes."""
    ROOT.mkdir(parents=True, exist_ok=True)
    ROOT.chmod(0o755)  # the ssh engine's user walks down to its socket
    with (ROOT / "allocation.lock").open("wb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _try_lock(path: Path) -> IO[bytes] | None:
    """The run's lock file opened and locked, or None when a live process holds it."""
    handle = path.open("ab")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def begin_run(new_id: Callable[[], str]) -> tuple[str, IO[bytes]]:
    """A fresh run id and its folder, locked until the returned handle is closed (or the process dies)."""
    with allocation():
        while (ROOT / (run := new_id())).exists() or netns.names(f"{PREFIX}{run}-"):
            continue
        (ROOT / run).mkdir()
        (ROOT / run).chmod(0o755)
        lock = _try_lock(ROOT / run / "lock")
        assert lock is not None
        return run, lock


def remove_stale() -> None:
    """Remove every run whose folder nobody holds, and anything named like a run that has no folder."""
    with allocation():
        runs = {p.name for p in ROOT.iterdir() if p.is_dir()}
        dead = set()
        for run in runs:
            lock = _try_lock(ROOT / run / "lock")
            if lock is not None:
                dead.add(run)
                lock.close()
        named = {n[len(PREFIX):].split("-")[0] for n in netns.names(PREFIX)}
        named |= {p.name[len(PREFIX):].split("-")[0] for p in _cgroup_parents(PREFIX)}
        for run in sorted(dead | (named - runs)):
            remove_run(run)


def remove_run(run: str) -> None:
    """Kill, unmount and delete everything of `run`; safe to call on a half-built or already removed run."""
    folder = ROOT / run
    prefix = f"{PREFIX}{run}-"
    _kill_all(folder, prefix)
    _unmount_under(folder)
    for parent in _cgroup_parents(prefix):
        _remove_cgroup(parent)
    for name in netns.names(prefix):
        netns.delete(name, f"{VETH}{run}{name.rsplit('-', 1)[1]}h")
    for link in netns.links(f"{VETH}{run}"):
        netns.ip("link", "delete", link, check=False)
    shutil.rmtree(folder, ignore_errors=True)


def _kill_all(folder: Path, prefix: str) -> None:
    """SIGKILL (SIGCONT first: a stopped dockerd is a fault we inject) until none of the run's processes is left."""
    for _ in range(KILL_ROUNDS):
        pids = _run_pids(folder, prefix)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                os.kill(pid, signal.SIGCONT)
        time.sleep(0.05)  # a killed process leaves /proc and its cgroup asynchronously
    raise RuntimeError(f"processes of {folder} survive SIGKILL: {sorted(_run_pids(folder, prefix))}")


def _run_pids(folder: Path, prefix: str) -> set[int]:
    pids = {p for name in netns.names(prefix) for p in netns.pids(name)}
    for parent in _cgroup_parents(prefix):
        for procs in parent.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids |= {int(p) for p in procs.read_text().split()}
    # Shims of a system containerd (dockerd uses /run/containerd when it runs) name only the namespace.
    markers = (str(folder).encode() + b"/", b"-namespace\0" + prefix.encode())
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                cmdline = (entry / "cmdline").read_bytes()
                if any(marker in cmdline for marker in markers):
                    pids.add(int(entry.name))
    return {p for p in pids if p != os.getpid() and not gone(p)}


def gone(pid: int) -> bool:
    """True when `pid` is dead or a zombie (this machine's PID 1 does not reap orphans)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # gone
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _unmount_under(folder: Path) -> None:
    points = {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}
    mine = [p for p in points if p == str(folder) or p.startswith(f"{folder}/")]
    for point in sorted(mine, key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], check=False, capture_output=True)


def _cgroup_parents(prefix: str) -> list[Path]:
    """The run's cgroup parents in every hierarchy (cgroup v1 controllers and the unified one)."""
    if not CGROUP.is_dir():
        return []
    hierarchies = [CGROUP] + [p for p in CGROUP.iterdir() if p.is_dir() and not p.is_symlink()]
    return [d for h in hierarchies for d in h.glob(f"{prefix}*") if d.is_dir()]


def _remove_cgroup(parent: Path) -> None:
    """rmdir a cgroup tree bottom-up (its processes are gone; cgroupfs refuses anything but rmdir)."""
    tree = [d for d in parent.rglob("*") if d.is_dir()] + [parent]
    for cgroup in sorted(tree, key=lambda d: len(d.parts), reverse=True):
        with contextlib.suppress(OSError):
            cgroup.rmdir()
