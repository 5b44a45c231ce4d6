"""The SQLite queue: WAL, priority then FIFO, checked transitions, cancel flags."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from saigeedged.adapters.store import Store
from saigeedged.jobs import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED, CancelWins, Job, TransitionError, status_text


def job(job_id: str, priority: int = 0, target: str = "host", **fields: object) -> Job:
    return Job(job_id=job_id, name=job_id.split("-")[0], target=target, task="mlc", entry={"onnx": "/x.onnx"},
               subdir="", claim_dir=f"/c/{job_id}", manifest="x.yml", priority=priority, created_at="t", **fields)  # type: ignore[arg-type]


def test_wal_and_durability(tmp_path: Path) -> None:
    """The database is in WAL mode and a job survives reopening."""
    store = Store(tmp_path / "q.db")
    store.add(job("a-1"))
    store.close()
    assert sqlite3.connect(tmp_path / "q.db").execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert Store(tmp_path / "q.db").get("a-1") == job("a-1")


def test_priority_then_fifo(tmp_path: Path) -> None:
    """next_queued: highest priority first, then the order of claiming."""
    store = Store(tmp_path / "q.db")
    for job_id, prio in (("a-1", 0), ("b-2", 0), ("c-3", 5), ("d-4", 5)):
        store.add(job(job_id, prio))
    order = []
    while (nxt := store.next_queued()) is not None:
        order.append(nxt.job_id)
        nxt.state = RUNNING
        store.save(nxt)
    assert order == ["c-3", "d-4", "a-1", "b-2"]


def test_skipped_targets_wait_without_blocking_the_rest(tmp_path: Path) -> None:
    """next_queued(skip): a cubie job ahead in the queue waits while a host job behind it goes."""
    store = Store(tmp_path / "q.db")
    store.add(job("a-1", 5, target="cubie"))
    store.add(job("b-2"))
    assert store.next_queued().job_id == "a-1"
    assert store.next_queued(("cubie", "mobilint")).job_id == "b-2"
    assert store.next_queued(("cubie", "host")) is None


def test_transitions_are_checked(tmp_path: Path) -> None:
    """succeeded is final; an expected state that changed meanwhile is refused."""
    store = Store(tmp_path / "q.db")
    a = job("a-1")
    store.add(a)
    a.state = SUCCEEDED
    with pytest.raises(TransitionError):
        store.save(a)  # queued -> succeeded skips running
    a.state = RUNNING
    store.save(a, expect=QUEUED)
    with pytest.raises(TransitionError):
        store.save(a, expect=QUEUED)
    a.state = FAILED
    store.save(a)
    a.state = QUEUED
    store.save(a)  # retry


def test_cancel_flag_survives_doc_writes(tmp_path: Path) -> None:
    """A cancel request stays set while the worker rewrites the row and through a refused requeue, and clears on the
    next state."""
    store = Store(tmp_path / "q.db")
    a = job("a-1", state=RUNNING)
    store.add(a)
    store.request_cancel("a-1")
    a.step = "quantize"
    store.save(a)
    assert store.cancel_requested("a-1")
    a.state = QUEUED
    with pytest.raises(CancelWins):  # a cancel is never lost to a requeue (SPEC §15)
        store.save(a)
    assert store.cancel_requested("a-1")
    a.state = CANCELLED
    store.save(a)
    assert not store.cancel_requested("a-1")


def test_status_text() -> None:
    """The STATUS line names the job, its step and the queue length."""
    running = job("det-1", step="quantize", step_index=8, step_count=11)
    assert status_text(running, 3) == "compiling det (quantize 8/11), 3 queued"
    assert status_text(job("det-1"), 0) == "compiling det (starting), 0 queued"  # taken, no step yet (was "None 0/0")
    assert status_text(None, 0) == "idle, 0 queued"
    assert status_text(None, 2, engine_down=True) == "idle, 2 queued, Docker engine unreachable: container jobs wait"


HOLDER = """import sys
from pathlib import Path
from saigeedged.adapters.store import Store
store = Store(Path(sys.argv[1]))
print(store.cancel_requested(sys.argv[2]), flush=True)
sys.stdin.readline()
store.close()
"""


def _daemon_like(path: Path, job_id: str) -> tuple[subprocess.Popen[str], bool]:
    """A process holding the database open as a daemon does, until told to close it (a line on its stdin); and
    whether it saw a cancel flagged for `job_id` when it opened it."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), job_id], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parent.parent)
    assert holder.stdout is not None
    return holder, holder.stdout.readline().strip() == "True"


def test_a_second_store_in_one_process_keeps_a_restarted_daemon_seeing_its_writes(tmp_path: Path) -> None:
    """Two stores of one process beside a daemon (a script or a test calling saigeedged.cli.client twice: `cancel`
    leaves its store open): opening the second released the first one's lock on the database file (its open and
    close of the file), so the daemon's close at a restart took the process for gone and removed the WAL under it;
    the cancel flagged through it afterwards went to the removed WAL, and the restarted daemon never saw it."""
    path = tmp_path / "saigeedged.db"
    first = Store(path)
    first.add(job("a-1", state=RUNNING))
    daemon, _ = _daemon_like(path, "a-1")
    second = Store(path, verify=False)  # beside `first`, still open
    daemon.communicate("\n", timeout=30)  # the daemon stops...
    again, _ = _daemon_like(path, "a-1")  # ...and starts again
    assert second.request_cancel("a-1") and first.cancel_requested("a-1")
    fresh, seen = _daemon_like(path, "a-1")
    for holder in (again, fresh):
        holder.communicate("\n", timeout=30)
    assert seen and Store(path).cancel_requested("a-1")
