"""The helper processes of in-process compiles under `systemctl kill -s HUP` and at a stop (SPEC §9)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from harness import drop, wait_for

from saigeedged.compile import child


def descendants(pid: int) -> set[int]:
    """Every live (not zombie) process below `pid`, from /proc."""
    parents: dict[int, int] = {}
    for name in (n for n in os.listdir("/proc") if n.isdigit()):  # (a glob stats each entry: one that ends meanwhile
        try:  # raised ProcessLookupError from inside the glob, past this try)
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if fields[0] != "Z":
            parents[int(name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


def pid_then_wait(pidfile: str, gate: str) -> str:
    Path(pidfile).write_text(str(os.getpid()))
    while not Path(gate).exists():
        time.sleep(0.02)
    return "done"


def hang_up_all(pids: set[int]) -> None:
    """What `systemctl kill -s HUP` does to the unit's processes other than the daemon."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGHUP)
        except ProcessLookupError:
            pass


def test_sighup_to_every_helper_keeps_the_job_and_the_helpers(tmp_path: Path) -> None:
    """SIGHUP sent to the fork server, the resource tracker and the running child neither fails the job nor the next."""
    child.shutdown()  # helpers started by earlier tests in this process would not have been started by this code
    others = descendants(os.getpid())
    pidfile, gate = tmp_path / "pid", tmp_path / "gate"
    result: list[object] = []
    runner = threading.Thread(target=lambda: result.append(
        child.run(pid_then_wait, (str(pidfile), str(gate)), "quantize", 60, lambda: None)))
    runner.start()
    wait_for(lambda: pidfile.exists() and pidfile.read_text(), 30, "the child running")
    helpers = descendants(os.getpid()) - others
    assert int(pidfile.read_text()) in helpers and len(helpers) >= 3  # fork server, resource tracker, the child
    hang_up_all(helpers)
    time.sleep(0.2)  # a signal has no completion event: give a dying process the time to die
    gate.write_text("")
    runner.join(30)
    assert result == ["done"]
    idle = descendants(os.getpid()) - others
    hang_up_all(idle)  # at idle: the helpers must survive for the next job
    time.sleep(0.2)
    assert descendants(os.getpid()) - others == idle
    assert child.run(sum, ([1, 2],), "sum", 30, lambda: None) == 3


def test_shutdown_reaps_every_helper() -> None:
    """After shutdown() no helper process is left for systemd to SIGKILL, and a later run starts them again."""
    child.shutdown()
    others = descendants(os.getpid())
    assert child.run(sum, ([1, 2],), "sum", 30, lambda: None) == 3
    helpers = descendants(os.getpid()) - others
    assert helpers
    child.shutdown()
    assert helpers & descendants(os.getpid()) == set()
    assert child.run(sum, ([2, 2],), "sum", 30, lambda: None) == 4
    child.shutdown()


def test_daemon_stop_leaves_no_helper(daemon: Any, det_inputs: dict[str, Any]) -> None:
    """After a host job, SIGTERM ends the daemon and every process it started before it exits."""
    d = daemon()
    drop(d.inbox, "det", det_inputs["onnx"], det_inputs["manifest"])
    assert d.wait_job("det")["state"] == "succeeded"
    helpers = descendants(d.proc.pid)
    assert helpers  # the fork server and the resource tracker stay for the next host job
    assert d.stop() == 0
    assert {pid for pid in helpers if Path(f"/proc/{pid}").exists()} == set()
